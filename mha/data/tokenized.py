"""A split encoded with the shared vocabulary, as flat numpy arrays.

Each sentence is `encode(text) + [EOS_ID]`; all sentences of a side are
concatenated in one flat array with an offsets array (CSR layout), so that a
WMT-sized split costs a few bytes per token and batches are gathered with
vectorized indexing. The arrays are cached in
`<workdir>/tokenized/<split>-<hash>.npz`, the hash covering the dataset, its
version or file fingerprint, the direction, the split and the SentencePiece
model, so a changed vocabulary or dataset never reads a stale cache. A cache
file that cannot be read (damaged) is made again, with a warning.
"""
import dataclasses
import io
import itertools
import os
import zipfile

from absl import logging
import ml_collections
import numpy as np

from mha.runtime import files
from mha.data import multihost
from mha.data import sources
from mha.data.tokenizer import SOURCE
from mha.data.tokenizer import TARGET
from mha.data.tokenizer import Tokenizer
from mha.errors import DataError
from mha.data.token_ids import EOS_ID

# The cache folder beside the vocabulary (mha.store.workdir.Workdir's layout).
TOKENIZED_DIR = "tokenized"

_CACHE_VERSION = "1"


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """Token ids of a split's N sentence pairs.

  Attributes:
    inputs: flat ids of all source sentences, each ending with EOS.
    inputs_offsets: [N + 1]; sentence i is inputs[off[i]:off[i + 1]].
    targets: flat ids of all target sentences, each ending with EOS.
    targets_offsets: [N + 1], as inputs_offsets.
  """
  inputs: np.ndarray
  inputs_offsets: np.ndarray
  targets: np.ndarray
  targets_offsets: np.ndarray

  def __len__(self) -> int:
    return len(self.inputs_offsets) - 1

  @property
  def inputs_lengths(self) -> np.ndarray:
    """[N] source lengths, EOS included."""
    return np.diff(self.inputs_offsets)

  @property
  def targets_lengths(self) -> np.ndarray:
    """[N] target lengths, EOS included."""
    return np.diff(self.targets_offsets)

  def inputs_of(self, i: int) -> np.ndarray:
    return self.inputs[self.inputs_offsets[i]:self.inputs_offsets[i + 1]]

  def targets_of(self, i: int) -> np.ndarray:
    return self.targets[self.targets_offsets[i]:self.targets_offsets[i + 1]]


def _encode(tok: Tokenizer, texts: list[str], dtype, side: str
            ) -> tuple[np.ndarray, np.ndarray]:
  """Flat ids with an EOS after each text, and the lengths (EOS included);
  `side` 'source' or 'target' (a separate vocabulary's model)."""
  ids = tok.encode_batch(texts, side=side)
  lengths = np.fromiter((len(x) + 1 for x in ids), np.int64, len(ids))
  flat = np.full(int(lengths.sum()), EOS_ID, dtype=dtype)
  not_eos = np.ones(len(flat), dtype=bool)
  not_eos[np.cumsum(lengths) - 1] = False
  flat[not_eos] = np.fromiter(itertools.chain.from_iterable(ids), dtype,
                              int(not_eos.sum()))
  return flat, lengths


def _offsets(lengths: list[np.ndarray]) -> np.ndarray:
  lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
  return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _encode_split(text_split: sources.TextSplit, tok: Tokenizer
                  ) -> TokenizedSplit:
  dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.int32
  parts = {"inputs": ([], []), "targets": ([], [])}
  for chunk in text_split.read(8192):
    for side, texts, which in zip(parts, chunk, (SOURCE, TARGET)):
      flat, lengths = _encode(tok, texts, dtype, which)
      parts[side][0].append(flat)
      parts[side][1].append(lengths)
  arrays = {}
  for side, (flats, lengths) in parts.items():
    arrays[side] = (np.concatenate(flats) if flats
                    else np.zeros(0, dtype))
    arrays[f"{side}_offsets"] = _offsets(lengths)
  return TokenizedSplit(**arrays)


def _read_cache(path: str) -> TokenizedSplit | None:
  """The cached arrays at `path`, or None (with a warning) if the file cannot
  be read: the cache is made again from the data and replaces it."""
  try:
    with np.load(io.BytesIO(files.read_bytes(path))) as f:
      return TokenizedSplit(**{k: f[k] for k in f.files})
  except (OSError, ValueError, EOFError, TypeError, zipfile.BadZipFile) as e:
    logging.warning("Tokenized cache %s cannot be read (%s): tokenizing the "
                    "split again.", path, e)
    return None


def tokenize_split(config: ml_collections.ConfigDict, tok: Tokenizer,
                   split: str) -> TokenizedSplit:
  """The split's token ids, from the workdir cache when present.

  The cache lives beside the tokenizer's model file (`tok.path`); a
  tokenizer without a path is not cached. With several processes, process 0
  writes the cache while the others wait, then they read it
  (`multihost.process_zero_first`).

  Raises:
    DataError: unknown dataset, language or split, bad files, or an empty
      split.
  """
  text_split = sources.open_split(config, split)
  path = None
  if tok.path:
    key = sources.cache_key(text_split, tok.sha256, _CACHE_VERSION)
    path = os.path.join(os.path.dirname(tok.path), TOKENIZED_DIR,
                        f"{files.safe_name(split)}-{key}.npz")

  def read_or_encode():
    if path and files.exists(path):
      result = _read_cache(path)
      if result is not None:
        logging.info("Read %d tokenized pairs of %s from %s.", len(result),
                     text_split.description, path)
        return result
    result = _encode_split(text_split, tok)
    if not len(result):
      raise DataError(f"Split {text_split.description} is empty.")
    if path:
      buffer = io.BytesIO()
      np.savez(buffer, **dataclasses.asdict(result))
      files.write_bytes_atomic(path, buffer.getvalue())
    logging.info("Tokenized %d pairs of %s (%d + %d tokens).", len(result),
                 text_split.description, len(result.inputs),
                 len(result.targets))
    return result

  return multihost.process_zero_first(
      f"tokenize {text_split.description}", read_or_encode)
