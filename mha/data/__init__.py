"""Translation data: sources, the shared vocabulary and batches.

    from mha import data
    tok = data.get_tokenizer(config, workdir)
    sources, targets = data.load_text_pairs(config, config.eval_split)
    for batch in data.train_batches(config, tok, start_step=step): ...
    batches = data.eval_batches(config, tok, config.eval_split)

Modules: `sources` (which dataset a config names), `parallel_text` (the TFDS
builder of local text folders), `synthetic` (the made-up language pair),
`tokenizer` (SentencePiece), `tokenized` (encoded splits and their cache),
`encoding` (sentences to ids on one process or on every core), `progress`
(the progress lines of the long steps),
`batching` (token-budget and packed batch plans), `pipeline` (the batch
iterators), `multihost` (process 0 prepares, the others wait), `token_ids`
(PAD 0, EOS 1, UNK 2).
"""
import importlib

_EXPORTS = {
    "DataError": "mha.errors", "EOS_ID": "mha.data.token_ids",
    "PAD_ID": "mha.data.token_ids", "Tokenizer": "mha.data.tokenizer",
    "eval_batches": "mha.data.pipeline", "get_tokenizer": "mha.data.tokenizer",
    "load_text_pairs": "mha.data.sources",
    "train_batches": "mha.data.pipeline",
}

_MODULES = ("batching", "encoding", "multihost", "parallel_text", "pipeline",
            "progress", "sources", "synthetic", "token_ids", "tokenized",
            "tokenizer")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  """The names above, imported on first use: importing the package (and
  `mha.data.token_ids` with it, as the search does) loads nothing else."""
  if name in _MODULES:  # `data.tokenizer` after `from mha import data`
    return importlib.import_module(f"{__name__}.{name}")
  if name not in _EXPORTS:
    raise AttributeError(f"module 'mha.data' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value
