"""The shared SentencePiece tokenizer: ids, round trips, the workdir file,
the tokenized splits and their cache."""
import os

import pytest

from conftest import synthetic_config
from mha import data
from mha.data import sources as data_sources
from mha.data import tokenized
from mha.data import tokenizer


pytestmark = pytest.mark.usefixtures("tfds_dir_for_the_session")
_synthetic = synthetic_config


def test_special_ids():
  assert (data.PAD_ID, data.EOS_ID) == (0, 1)


def test_trains_saves_and_reuses(tmp_path):
  config = _synthetic()
  tok = data.get_tokenizer(config, str(tmp_path))
  path = tmp_path / "spm.model"
  assert path.exists() and tok.vocab_size == 100
  assert tok.id_to_piece(0) == "<pad>" and tok.id_to_piece(1) == "</s>"
  assert tok.id_to_piece(2) == "<unk>"
  mtime = path.stat().st_mtime_ns
  again = data.get_tokenizer(config, str(tmp_path))
  assert path.stat().st_mtime_ns == mtime  # loaded, not retrained
  assert again.sha256 == tok.sha256


def test_training_is_deterministic(tmp_path):
  config = _synthetic()
  first = data.get_tokenizer(config, str(tmp_path / "a"))
  second = data.get_tokenizer(config, str(tmp_path / "b"))
  assert first.sha256 == second.sha256


def test_vocab_size_mismatch_is_refused(tmp_path):
  data.get_tokenizer(_synthetic(), str(tmp_path))
  with pytest.raises(data.DataError,
                     match=r"spm\.model has a vocabulary of 100 .*"
                     r"config\.vocab_size is 120"):
    data.get_tokenizer(_synthetic(vocab_size=120), str(tmp_path))


def test_vocab_too_small_for_the_characters(tmp_path, multi30k):
  config = _synthetic(dataset_name="parallel_text", data_dir=str(multi30k),
                      source_lang="de", target_lang="en", vocab_size=64,
                      max_corpus_chars=100_000)
  with pytest.raises(data.DataError, match="config.vocab_size=64"):
    data.get_tokenizer(config, str(tmp_path))


def test_a_corpus_budget_below_the_first_sentence_is_named(tmp_path):
  # Not "no text in split 'train'": the split has text, the budget
  # (config.max_corpus_chars) takes none of it.
  with pytest.raises(data.DataError, match=(
      r"config.max_corpus_chars=1 leaves no sentence of split 'train' to "
      r"train SentencePiece on \(its first sentence is longer\)")):
    data.get_tokenizer(_synthetic(max_corpus_chars=1), str(tmp_path))
  assert os.listdir(tmp_path) == []


def test_decode_stops_at_eos_and_drops_pads(tmp_path):
  tok = data.get_tokenizer(_synthetic(), str(tmp_path))
  sources, _ = data.load_text_pairs(_synthetic(), "test")
  ids = tok.encode(sources[0])
  assert data.EOS_ID not in ids and data.PAD_ID not in ids
  assert tok.decode(ids) == sources[0]
  assert tok.decode(ids + [data.EOS_ID] + ids) == sources[0]
  assert tok.decode([0] + ids[:2] + [0] + ids[2:] + [1, 0, 0]) == sources[0]


def test_synthetic_round_trip(tmp_path):
  config = _synthetic()
  tok = data.get_tokenizer(config, str(tmp_path))
  sources, targets = data.load_text_pairs(config, "test")
  for text in sources + targets:
    assert tok.decode(tok.encode(text)) == text
  # Normalization removes extra white space (runs of spaces, at the ends),
  # as the round trip does.
  spaced = "  " + "   ".join(sources[0].split()) + " "
  assert tok.normalize(spaced) == sources[0]
  assert tok.decode(tok.encode(spaced)) == sources[0]


def test_multi30k_round_trip(tmp_path, multi30k):
  config = _synthetic(dataset_name="parallel_text", data_dir=str(multi30k),
                      source_lang="de", target_lang="en", vocab_size=500,
                      max_corpus_chars=5_000_000)
  tok = data.get_tokenizer(config, str(tmp_path))
  sources, targets = data.load_text_pairs(config, "test_2016_flickr")
  assert len(sources) == 1000
  for text in sources + targets:
    ids = tok.encode(text)
    assert tokenizer.UNK_ID not in ids, text
    assert tok.decode(ids) == tok.normalize(text)
  # Normalization is mostly the identity on this clean text.
  assert sum(tok.normalize(t) == t for t in sources + targets) > 1900


def test_corpus_respects_max_corpus_chars():
  config = _synthetic(max_corpus_chars=1000)
  text_split = data_sources.open_split(config, "train")
  corpus = tokenizer._corpus  # pylint: disable=protected-access
  sentences = list(corpus(text_split, 1000))
  assert 900 < sum(map(len, sentences)) <= 1000
  src, tgt = data.load_text_pairs(config, "train")
  assert sentences[:4] == [src[0], tgt[0], src[1], tgt[1]]
  # A budget that a sentence reaches exactly ends the corpus after it.
  exact = len(src[0]) + len(tgt[0]) + len(src[1])
  assert list(corpus(text_split, exact)) == [src[0], tgt[0], src[1]]


class _OneLineSplit:
  """A text split of one pair."""
  key, description, size = "one", "a split of one pair", 1

  def read(self, chunk_size):
    del chunk_size
    yield ["a"], ["b"]


class _LargeIds:
  """A vocabulary of 40,000 pieces that encodes every text to two ids
  beyond the int16 range."""
  vocab_size, path = 40_000, None

  def encode_batch(self, texts, side="source"):
    del side
    return [[39_999, 32_768] for _ in texts]


def test_ids_above_32767_are_stored_unchanged():
  # A vocabulary of up to 65,536 pieces is stored as uint16: ids up to
  # 65,535 survive, with the EOS appended.
  split = tokenized._encode_split(  # pylint: disable=protected-access
      _OneLineSplit(), _LargeIds(), processes=1)
  assert split.inputs_of(0).tolist() == [39_999, 32_768, data.EOS_ID]
  assert split.targets_of(0).tolist() == [39_999, 32_768, data.EOS_ID]


def test_a_new_vocabulary_never_reads_the_cache_of_the_old_one(tmp_path):
  # The cache key covers the SentencePiece model: another spm.model at the
  # same path tokenizes the split again.
  old = data.get_tokenizer(_synthetic(), str(tmp_path))
  new = tokenizer.Tokenizer(tokenizer.train_model(_synthetic(vocab_size=120)),
                            path=old.path)
  split = "validation[:5]"
  sources, _ = data.load_text_pairs(_synthetic(), split)
  assert new.encode(sources[0]) != old.encode(sources[0])
  tokenized.tokenize_split(_synthetic(), old, split)  # writes the cache
  again = tokenized.tokenize_split(_synthetic(vocab_size=120), new, split)
  assert again.inputs_of(0).tolist() == new.encode(sources[0]) + [
      data.EOS_ID]


def test_bad_dataset_raises_its_own_error(tmp_path):
  config = _synthetic(dataset_name="parallel_text",
                      data_dir=str(tmp_path / "missing"), source_lang="de",
                      target_lang="en")
  with pytest.raises(data.DataError, match="missing' .*does not exist"):
    data.get_tokenizer(config, str(tmp_path / "work"))
  folder = tmp_path / "corpus"
  folder.mkdir()
  (folder / "train.de").write_bytes(b"gut\n\xff\n")
  (folder / "train.en").write_bytes(b"good\nbad\n")
  config.data_dir = str(folder)
  with pytest.raises(data.DataError, match=r"train\.de, line 2"):
    data.get_tokenizer(config, str(tmp_path / "work"))


def test_workdir_created(tmp_path):
  workdir = tmp_path / "new" / "run"
  data.get_tokenizer(_synthetic(), str(workdir))
  assert os.path.exists(workdir / "spm.model")
