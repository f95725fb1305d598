"""The shared SentencePiece vocabulary of source and target.

One BPE model (the paper's "shared source-target vocabulary", §5.1) is
trained on the training split, both sides, at most `config.max_corpus_chars`
characters, and saved as `<workdir>/spm.model`; later runs and evaluation load
it. Fixed ids: pad = 0, eos = 1, unk = 2, no bos. Encoded examples end with
EOS (`encode(text) + [EOS_ID]`); the model never sees a BOS.

Training reads the first `max_corpus_chars` characters of the split in its
order (source and target sentences alternately), with character coverage 1.0
(every character seen gets a piece, so digits and rare letters are not
mapped to unk; a vocabulary smaller than the character set is refused with an
error), a fixed random seed and a fixed thread count: the same config gives
the same model bytes on every run and host (SentencePiece's BPE result
depends on the thread count, hence fixed).
"""
import hashlib
import io
import os
from typing import Iterable, Iterator, Sequence

from absl import logging
import ml_collections
import numpy as np
import sentencepiece as spm

from mha.runtime import files
from mha.data import multihost
from mha.data import sources
from mha.errors import DataError
from mha.data.token_ids import EOS_ID
from mha.data.token_ids import PAD_ID
from mha.data.token_ids import UNK_ID

# In the workdir (mha.store.workdir.Workdir's layout).
MODEL_FILENAME = "spm.model"
# Fixed so that training gives the same model on every machine.
_TRAIN_THREADS = 4
_TRAIN_SEED = 0


class Tokenizer:
  """A SentencePiece model with the project's fixed special ids.

  Attributes:
    path: the file the model was loaded from or saved to, or None.
    sha256: hash of the serialized model (keys caches of tokenized data).
  """

  def __init__(self, model_proto: bytes, path: str | None = None):
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
      # Every option given: sentencepiece 0.2.0 defaults the first two to
      # False, later versions to the model's (▁ for spaces, a leading ▁).
      self._normalizer = spm.SentencePieceNormalizer(
          model_proto=model_proto, add_dummy_prefix=False,
          escape_whitespaces=False, remove_extra_whitespaces=True)
    except RuntimeError:  # SentencePiece's parse error names no file
      what = path or "The SentencePiece model"
      raise DataError(
          f"{what} is not a SentencePiece model (damaged or another file). "
          "Check that --workdir is the right folder; or delete it and run "
          "train.py with this workdir's config to train it again (the same "
          "config gives the same vocabulary).") from None
    self.path = path
    self.sha256 = hashlib.sha256(model_proto).hexdigest()
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id(),
           self._sp.bos_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID, -1):
      raise DataError(
          f"SentencePiece model {path or '(in memory)'} has special ids "
          f"pad/eos/unk/bos = {ids}; the project needs "
          f"({PAD_ID}, {EOS_ID}, {UNK_ID}, -1). Delete it to retrain.")

  @property
  def vocab_size(self) -> int:
    """Number of ids, including pad, eos and unk."""
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without EOS."""
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text, without EOS (SentencePiece's batch encoder)."""
    return self._sp.encode(list(texts), num_threads=_TRAIN_THREADS)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`, up to the first EOS; pads are dropped."""
    kept = []
    for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i != PAD_ID:
        kept.append(i)
    return self._sp.decode(kept)

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def normalize(self, text: str) -> str:
    """`text` after SentencePiece's normalization (NFKC, extra whitespace
    removed): decode(encode(text)) equals it unless a character is unknown.
    """
    return self._normalizer.normalize(text)


def _corpus(text_split: sources.TextSplit, max_chars: int) -> Iterator[str]:
  """Sentences of a split, both sides alternately, until `max_chars`
  characters."""
  used = 0
  for chunk_sources, chunk_targets in text_split.read(4096):
    for pair in zip(chunk_sources, chunk_targets):
      for sentence in pair:
        used += len(sentence)
        if used > max_chars:
          return
        yield sentence


def _has_text(text_split: sources.TextSplit) -> bool:
  """The split holds a sentence (read up to the first one)."""
  for chunk_sources, chunk_targets in text_split.read(1):
    if chunk_sources or chunk_targets:
      return True
  return False


def train_model(config: ml_collections.ConfigDict) -> bytes:
  """Trains the shared BPE model on the training split; returns its bytes.

  Raises:
    DataError: the training split is unusable, or the vocabulary size is
      impossible for the corpus.
  """
  # Opened first, so that a bad dataset raises its own error here.
  text_split = sources.open_split(config, config.train_split)
  count, error = 0, None

  def counted():
    nonlocal count, error
    try:
      for sentence in _corpus(text_split, config.max_corpus_chars):
        count += 1
        yield sentence
    except Exception as e:  # SentencePiece would hide it: raised below.
      error = e
      raise

  writer = io.BytesIO()
  spm.set_random_generator_seed(_TRAIN_SEED)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=counted(), model_writer=writer,
        vocab_size=config.vocab_size, model_type="bpe",
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        character_coverage=1.0, input_sentence_size=0,
        shuffle_input_sentence=False, num_threads=_TRAIN_THREADS,
        minloglevel=2)
  except RuntimeError as e:
    if error is not None:
      raise error from None
    if count == 0 and _has_text(text_split):
      raise DataError(
          f"config.max_corpus_chars={config.max_corpus_chars} leaves no "
          f"sentence of split {config.train_split!r} to train SentencePiece "
          "on (its first sentence is longer).") from e
    if count == 0:
      raise DataError(f"No text to train SentencePiece on in split "
                      f"{config.train_split!r} (config.train_split).") from e
    raise DataError(
        f"SentencePiece training with config.vocab_size={config.vocab_size} "
        f"on {count} sentences of split {config.train_split!r} (the first "
        f"config.max_corpus_chars={config.max_corpus_chars} characters) "
        f"failed: {e}") from e
  logging.info("Trained SentencePiece (BPE, %d pieces) on %d sentences.",
               config.vocab_size, count)
  return writer.getvalue()


def load_tokenizer(config: ml_collections.ConfigDict, path: str) -> Tokenizer:
  """Reads the SentencePiece model at `path`; never trains or writes.

  Raises:
    DataError: the model cannot be read or is not a SentencePiece model,
      its vocabulary size differs from `config.vocab_size`, or its special
      ids differ from the project's; each names the file.
  """
  try:
    proto = files.read_bytes(path)
  except OSError as e:
    raise DataError(f"{path} cannot be read ({e.strerror or e}): check "
                    "that --workdir is the right folder.") from None
  tok = Tokenizer(proto, path=path)
  if tok.vocab_size != config.vocab_size:
    raise DataError(
        f"{path} has a vocabulary of {tok.vocab_size} pieces but "
        f"config.vocab_size is {config.vocab_size}. Use a new workdir, "
        f"set config.vocab_size={tok.vocab_size}, or delete {path} to "
        "retrain.")
  return tok


def get_tokenizer(config: ml_collections.ConfigDict,
                  workdir: str) -> Tokenizer:
  """Loads `<workdir>/spm.model`, or trains and saves it if absent.

  With several processes, process 0 trains and saves it while the others
  wait, then they load it (`multihost.process_zero_first`).

  Raises:
    DataError: as `load_tokenizer` (the saved model is never retrained
      silently).
  """
  path = os.path.join(workdir, MODEL_FILENAME)

  def load_or_train():
    if files.exists(path):
      return load_tokenizer(config, path)
    proto = train_model(config)
    tok = Tokenizer(proto, path=path)
    files.write_bytes_atomic(path, proto)
    logging.info("Saved the SentencePiece model to %s.", path)
    return tok

  return multihost.process_zero_first(f"train the vocabulary {path}",
                                      load_or_train)
