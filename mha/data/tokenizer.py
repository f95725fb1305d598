"""The vocabulary: one shared SentencePiece model, or (an imported Marian
model's) separate source and target models with one id table.

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

A workdir may hold instead, as an OPUS-MT (Marian) model has them,
`source.spm` and `target.spm` (SentencePiece models of each language) and
`vocab.json` (piece -> id, one table for both sides: Marian's ids are not
SentencePiece's). `SeparateTokenizer` encodes a source with `source.spm`'s
pieces and a target with `target.spm`'s, each piece's id from the table (a
piece the table lacks: the id of `<unk>`, as transformers' MarianTokenizer
does), and decodes ids through the table with `target.spm`. The table's
`<pad>`, `</s>` and `<unk>` must be the project's ids 0, 1 and 2 (an import
permutes Marian's ids to put them there). Such a vocabulary is never
trained: `get_tokenizer` loads it where `vocab.json` is present.
"""
import hashlib
import io
import json
import os
from typing import Iterable, Iterator, Sequence

from absl import logging
import ml_collections
import numpy as np
import sentencepiece as spm

from mha.runtime import files
from mha.data import multihost
from mha.data import progress
from mha.data import sources
from mha.errors import DataError
from mha.data.token_ids import EOS_ID
from mha.data.token_ids import PAD_ID
from mha.data.token_ids import UNK_ID

# In the workdir (mha.store.workdir.Workdir's layout).
MODEL_FILENAME = "spm.model"
# A separate vocabulary (`SeparateTokenizer`), as Marian's.
SOURCE_MODEL_FILENAME = "source.spm"
TARGET_MODEL_FILENAME = "target.spm"
ID_TABLE_FILENAME = "vocab.json"
SEPARATE_FILENAMES = (SOURCE_MODEL_FILENAME, TARGET_MODEL_FILENAME,
                      ID_TABLE_FILENAME)
# The sides of `encode` / `encode_batch`.
SOURCE, TARGET = "source", "target"
# The id table's special pieces (Marian's names) at the project's ids.
SPECIAL_PIECES = {"<pad>": PAD_ID, "</s>": EOS_ID, "<unk>": UNK_ID}
# Fixed so that training gives the same model on every machine; also the
# threads of a batch's encoding (`encode_batch`: the same ids with any
# number), unless a tokenizer's `threads` says otherwise.
_TRAIN_THREADS = 4
_TRAIN_SEED = 0


def _normalizer(model_proto: bytes) -> spm.SentencePieceNormalizer:
  """The model's text normalizer, giving plain text (no ▁)."""
  # Every option given: sentencepiece 0.2.0 defaults the first two to
  # False, later versions to the model's (▁ for spaces, a leading ▁).
  return spm.SentencePieceNormalizer(
      model_proto=model_proto, add_dummy_prefix=False,
      escape_whitespaces=False, remove_extra_whitespaces=True)


class Tokenizer:
  """A SentencePiece model with the project's fixed special ids.

  Attributes:
    path: the file the model was loaded from or saved to, or None.
    sha256: hash of the serialized model (keys caches of tokenized data).
    threads: SentencePiece's threads in `encode_batch` (one in each
      tokenization worker, `mha.data.encoding`, which runs one a core).
  """
  threads = _TRAIN_THREADS

  def __init__(self, model_proto: bytes, path: str | None = None):
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
      self._normalizer = _normalizer(model_proto)
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
  def model_proto(self) -> bytes:
    """The serialized model: `Tokenizer(tok.model_proto)` encodes alike."""
    return self._sp.serialized_model_proto()

  @property
  def files(self) -> dict[str, bytes]:
    """{file name: bytes} that `from_files` makes this vocabulary of."""
    return {MODEL_FILENAME: self.model_proto}

  @property
  def vocab_size(self) -> int:
    """Number of ids, including pad, eos and unk."""
    return self._sp.get_piece_size()

  def encode(self, text: str, side: str = SOURCE) -> list[int]:
    """Ids of `text`, without EOS (one model for either `side`)."""
    del side
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str],
                   side: str = SOURCE) -> list[list[int]]:
    """Ids of each text, without EOS (SentencePiece's batch encoder; one
    model for either `side`)."""
    del side
    return self._sp.encode(list(texts), num_threads=self.threads)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`, up to the first EOS; pads are dropped."""
    return self._sp.decode(_kept_ids(ids))

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def normalize(self, text: str, side: str = SOURCE) -> str:
    """`text` after SentencePiece's normalization (NFKC, extra whitespace
    removed): decode(encode(text)) equals it unless a character is unknown.
    """
    del side
    return self._normalizer.normalize(text)


def _kept_ids(ids: Iterable[int]) -> list[int]:
  """`ids` up to the first EOS, without pads."""
  kept = []
  for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
    if i == EOS_ID:
      break
    if i != PAD_ID:
      kept.append(i)
  return kept


def _processor(proto: bytes, path: str) -> spm.SentencePieceProcessor:
  """The SentencePiece model `proto` read from `path`.

  Raises:
    DataError: it is not a SentencePiece model, naming `path`.
  """
  try:
    return spm.SentencePieceProcessor(model_proto=proto)
  except RuntimeError:  # SentencePiece's parse error names no file
    raise DataError(f"{path} is not a SentencePiece model (damaged or "
                    "another file).") from None


def _id_table(text: bytes, path: str) -> dict[str, int]:
  """The piece -> id table of `vocab.json`: every id 0..n-1 once, the
  special pieces at the project's ids (`SPECIAL_PIECES`).

  Raises:
    DataError: naming `path` and what is wrong.
  """
  try:
    table = json.loads(text)
  except (UnicodeDecodeError, ValueError) as e:
    raise DataError(f"{path} is not valid JSON ({e}).") from None
  if not isinstance(table, dict) or not all(
      isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
      for k, v in table.items()):
    raise DataError(f"{path} is not an id table (a JSON object of "
                    "piece -> integer id).")
  if sorted(table.values()) != list(range(len(table))):
    raise DataError(f"{path} does not give the ids 0..{len(table) - 1} "
                    "each to one piece.")
  wrong = {k: table.get(k) for k, v in SPECIAL_PIECES.items()
           if table.get(k) != v}
  if wrong:
    raise DataError(
        f"{path} gives {wrong}; the project needs {SPECIAL_PIECES} (pad 0, "
        "EOS 1, unknown 2: permute the ids on import).")
  return table


class SeparateTokenizer:
  """Source and target SentencePiece models with one id table (Marian's
  `source.spm`, `target.spm`, `vocab.json`); the interface of `Tokenizer`,
  with `side` choosing the model that encodes.

  Attributes:
    path: the id table's file (`vocab.json`), or None.
    sha256: hash of the three files (keys caches of tokenized data).
    threads: as `Tokenizer`'s.
  """
  threads = _TRAIN_THREADS

  def __init__(self, source_proto: bytes, target_proto: bytes,
               table: bytes, folder: str | None = None):
    where = lambda name: os.path.join(folder, name) if folder else name
    self._sp = {SOURCE: _processor(source_proto,
                                   where(SOURCE_MODEL_FILENAME)),
                TARGET: _processor(target_proto,
                                   where(TARGET_MODEL_FILENAME))}
    self.path = where(ID_TABLE_FILENAME) if folder else None
    self._ids = _id_table(table, where(ID_TABLE_FILENAME))
    self._pieces = sorted(self._ids, key=self._ids.get)
    for side, name in ((SOURCE, SOURCE_MODEL_FILENAME),
                       (TARGET, TARGET_MODEL_FILENAME)):
      model = self._sp[side]
      if not any(model.id_to_piece(i) in self._ids
                 for i in range(model.get_piece_size())
                 if not (model.is_unknown(i) or model.is_control(i))):
        raise DataError(f"{where(ID_TABLE_FILENAME)} holds none of the "
                        f"pieces of {where(name)}: they do not belong "
                        "together.")
    self._normalizer = {
        side: _normalizer(proto)
        for side, proto in ((SOURCE, source_proto), (TARGET, target_proto))}
    self.files = dict(zip(SEPARATE_FILENAMES,
                          (source_proto, target_proto, table)))
    digest = hashlib.sha256()
    for part in (source_proto, target_proto, table):
      digest.update(len(part).to_bytes(8, "little") + part)
    self.sha256 = digest.hexdigest()

  @property
  def vocab_size(self) -> int:
    """Number of ids in the table, including pad, eos and unk."""
    return len(self._pieces)

  def _to_ids(self, pieces: list[str]) -> list[int]:
    return [self._ids.get(p, UNK_ID) for p in pieces]

  def encode(self, text: str, side: str = SOURCE) -> list[int]:
    """Ids of `text` by the table, without EOS: the pieces of `side`'s
    model."""
    return self._to_ids(self._sp[side].encode(text, out_type=str))

  def encode_batch(self, texts: Sequence[str],
                   side: str = SOURCE) -> list[list[int]]:
    """`encode` of each text (SentencePiece's batch encoder)."""
    pieces = self._sp[side].encode(list(texts), out_type=str,
                                   num_threads=self.threads)
    return [self._to_ids(p) for p in pieces]

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` (a target), up to the first EOS; pads are dropped:
    their pieces joined by the target model."""
    return self._sp[TARGET].decode_pieces(
        [self._pieces[i] for i in _kept_ids(ids)])

  def id_to_piece(self, i: int) -> str:
    return self._pieces[int(i)]

  def normalize(self, text: str, side: str = SOURCE) -> str:
    """`text` after `side`'s SentencePiece normalization (`Tokenizer`'s)."""
    return self._normalizer[side].normalize(text)


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
  counter = progress.Progress(
      f"Training the vocabulary on {text_split.description}", None,
      "sentences")

  def counted():
    nonlocal count, error
    try:
      for sentence in _corpus(text_split, config.max_corpus_chars):
        count += 1
        counter.add(1)
        yield sentence
    except Exception as e:  # SentencePiece would hide it: raised below.
      error = e
      raise

  writer = io.BytesIO()
  spm.set_random_generator_seed(_TRAIN_SEED)
  try:
    with counter:  # a line while SentencePiece trains, too
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


def _read(path: str) -> bytes:
  """The bytes of a vocabulary file (DataError naming it)."""
  try:
    return files.read_bytes(path)
  except OSError as e:
    raise DataError(f"{path} cannot be read ({e.strerror or e}): check "
                    "that --workdir is the right folder.") from None


def _check_size(tok: Tokenizer | SeparateTokenizer,
                config: ml_collections.ConfigDict, path: str) -> None:
  if tok.vocab_size != config.vocab_size:
    raise DataError(
        f"{path} has a vocabulary of {tok.vocab_size} pieces but "
        f"config.vocab_size is {config.vocab_size}. Use a new workdir, "
        f"set config.vocab_size={tok.vocab_size}, or delete {path} to "
        "retrain.")


def load_tokenizer(config: ml_collections.ConfigDict, path: str) -> Tokenizer:
  """Reads the SentencePiece model at `path`; never trains or writes.

  Raises:
    DataError: the model cannot be read or is not a SentencePiece model,
      its vocabulary size differs from `config.vocab_size`, or its special
      ids differ from the project's; each names the file.
  """
  tok = Tokenizer(_read(path), path=path)
  _check_size(tok, config, path)
  return tok


def has_separate(folder: str) -> bool:
  """`folder` holds a separate vocabulary (its `vocab.json`)."""
  return files.exists(os.path.join(folder, ID_TABLE_FILENAME))


def load_separate_tokenizer(config: ml_collections.ConfigDict,
                            folder: str) -> SeparateTokenizer:
  """Reads `source.spm`, `target.spm` and `vocab.json` in `folder`; never
  trains or writes.

  Raises:
    DataError: a file missing or unreadable, not of its kind, an id table
      of other special ids or of none of a model's pieces, or of another
      size than `config.vocab_size`; each names the file.
  """
  tok = SeparateTokenizer(
      *(_read(os.path.join(folder, name)) for name in SEPARATE_FILENAMES),
      folder=folder)
  _check_size(tok, config, tok.path)
  return tok


def from_files(contents: dict[str, bytes], folder: str
               ) -> Tokenizer | SeparateTokenizer:
  """The vocabulary of the files `contents` ({file name: bytes}: spm.model,
  or source.spm, target.spm and vocab.json) as stored in `folder`.

  Raises:
    DataError: as `Tokenizer` and `SeparateTokenizer`, naming the file.
  """
  if ID_TABLE_FILENAME in contents:
    return SeparateTokenizer(*(contents[n] for n in SEPARATE_FILENAMES),
                             folder=folder)
  return Tokenizer(contents[MODEL_FILENAME],
                   path=os.path.join(folder, MODEL_FILENAME))


def workdir_tokenizer(config: ml_collections.ConfigDict, folder: str
                      ) -> Tokenizer | SeparateTokenizer:
  """The vocabulary stored in `folder`: the separate one where it has a
  `vocab.json`, else its shared `spm.model` (`load_tokenizer`)."""
  if has_separate(folder):
    return load_separate_tokenizer(config, folder)
  return load_tokenizer(config, os.path.join(folder, MODEL_FILENAME))


def get_tokenizer(config: ml_collections.ConfigDict,
                  workdir: str) -> Tokenizer | SeparateTokenizer:
  """Loads the workdir's vocabulary (`workdir_tokenizer`: a separate one
  where it has `vocab.json`), or trains and saves `spm.model` if it has
  none.

  With several processes, process 0 trains and saves it while the others
  wait, then they load it (`multihost.process_zero_first`).

  Raises:
    DataError: as `load_tokenizer` (the saved model is never retrained
      silently).
  """
  path = os.path.join(workdir, MODEL_FILENAME)

  def load_or_train():
    if files.exists(path) or has_separate(workdir):
      return workdir_tokenizer(config, workdir)
    proto = train_model(config)
    tok = Tokenizer(proto, path=path)
    files.write_bytes_atomic(path, proto)
    logging.info("Saved the SentencePiece model to %s.", path)
    return tok

  return multihost.process_zero_first(f"train the vocabulary {path}",
                                      load_or_train)
