"""The model as a Hugging Face `transformers` MarianMT model.

Modules: `marian` (mha's parameters ↔ a `MarianMTModel` state dict, pure
numpy, both directions, and the variants Marian cannot represent).
"""
