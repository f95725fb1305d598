"""The model as a Hugging Face `transformers` MarianMT model.

Modules: `marian` (mha's parameters ↔ a `MarianMTModel` state dict, pure
numpy, both directions, and the variants Marian cannot represent),
`export` (a trained workdir written as a MarianMT folder: weights,
configs, tokenizer files, model card; `mha-export --format=huggingface`),
`importer` (a MarianMT folder written as an mha workdir; `mha-import`).
It sits above `mha.export`, whose output-folder rules and staging its
export shares.
"""
