"""Tokenization on several processes (mha/data/encoding.py,
`config.tokenize_processes`): the same arrays, bit for bit, as on one;
chunks taken back in order with a bounded read-ahead; how many processes
a split gets; the field's rule."""
import dataclasses
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import synthetic_config
from configs import base
from mha import data
from mha.data import encoding
from mha.data import tokenized
from mha.errors import ConfigError
from mha.train import config_check


pytestmark = pytest.mark.usefixtures("tfds_dir_for_the_session")
_synthetic = synthetic_config


def _same_arrays(a: tokenized.TokenizedSplit, b: tokenized.TokenizedSplit):
  for field in dataclasses.fields(tokenized.TokenizedSplit):
    x, y = getattr(a, field.name), getattr(b, field.name)
    assert x.dtype == y.dtype, field.name
    assert x.tobytes() == y.tobytes(), field.name


def _one_and_two_processes(config, tok, split, monkeypatch):
  # Small chunks of different sizes: many in flight, some ending sooner.
  monkeypatch.setattr(tokenized, "CHUNK_PAIRS", 1000)
  text_split = data.sources.open_split(config, split)
  one = tokenized._encode_split(  # pylint: disable=protected-access
      text_split, tok, processes=1)
  two = tokenized._encode_split(  # pylint: disable=protected-access
      text_split, tok, processes=2)
  return text_split, one, two


def test_two_processes_give_the_one_process_arrays_synthetic(
    tmp_path, monkeypatch):
  config = _synthetic()
  tok = data.get_tokenizer(config, str(tmp_path))
  _, one, two = _one_and_two_processes(config, tok, "train[:7500]",
                                       monkeypatch)
  _same_arrays(one, two)
  assert len(one) == 7500


def test_two_processes_give_the_one_process_arrays_multi30k(
    tmp_path, monkeypatch, multi30k):
  config = base.get_config("tiny")
  config.update(dict(dataset_name="parallel_text", data_dir=str(multi30k),
                     source_lang="de", target_lang="en", vocab_size=500))
  tok = data.get_tokenizer(config, str(tmp_path))
  text_split, one, two = _one_and_two_processes(config, tok, "train",
                                                monkeypatch)
  _same_arrays(one, two)
  # And both are SentencePiece's ids of each sentence, EOS after each.
  sources, targets = data.load_text_pairs(config, "train")
  assert len(two) == len(sources) == text_split.size == 29_000
  for i in (0, 999, 1000, 14_321, 28_999):
    assert two.inputs_of(i).tolist() == tok.encode(sources[i]) + [
        data.EOS_ID]
    assert two.targets_of(i).tolist() == tok.encode(targets[i]) + [
        data.EOS_ID]


class _Pool:
  """An executor that runs each task when it is taken, recording the order
  of submissions and takes."""

  def __init__(self):
    self.events = []

  def submit(self, function, chunk):
    self.events.append(("submit", chunk))
    pool = self

    class _Future:
      def result(self):
        pool.events.append(("take", chunk))
        return function(chunk)

    return _Future()


def test_results_in_order_with_a_bounded_read_ahead():
  pool = _Pool()
  results = encoding._in_order(  # pylint: disable=protected-access
      pool.submit, lambda x: 10 * x, iter(range(5)), in_flight=2)
  assert list(results) == [0, 10, 20, 30, 40]
  # At most 2 chunks read and not yet taken: never the whole split.
  assert pool.events == [
      ("submit", 0), ("submit", 1), ("take", 0), ("submit", 2), ("take", 1),
      ("submit", 3), ("take", 2), ("submit", 4), ("take", 3), ("take", 4)]


def test_how_many_processes(monkeypatch):
  monkeypatch.setattr(encoding, "host_cores", lambda: 16)
  processes = lambda size, **c: tokenized.processes_for(  # noqa: E731
      _synthetic(**c), size)
  big = tokenized.POOL_MIN_PAIRS
  assert processes(4_500_000) == 16            # every core at WMT size
  assert processes(None) == 16                 # size unknown: every core
  assert processes(big - 1) == 1               # small: workers cost more
  # No more processes than chunks (8 chunks here).
  assert processes(big) == big // tokenized.CHUNK_PAIRS == 8
  # The field, when set, is taken as it is.
  assert processes(10, tokenize_processes=3) == 3
  assert processes(4_500_000, tokenize_processes=1) == 1


def test_the_field_is_checked():
  config = _synthetic(tokenize_processes=-1)
  with pytest.raises(ConfigError, match=r"config\.tokenize_processes must "
                     r"be >= 0, got -1"):
    config_check.validate(config)


def test_the_worker_builds_the_same_tokenizer(tmp_path):
  # What the workers receive: the model's bytes, which encode alike.
  tok = data.get_tokenizer(_synthetic(), str(tmp_path))
  again = data.Tokenizer(tok.model_proto)
  text = "a b c " * 7
  assert again.encode(text) == tok.encode(text)
  assert again.sha256 == tok.sha256
  assert np.array_equal(
      encoding.encode_texts(again, [text, "x"], np.uint16, "source")[0],
      encoding.encode_texts(tok, [text, "x"], np.uint16, "source")[0])


def test_a_worker_encodes_with_one_sentencepiece_thread(tmp_path,
                                                         monkeypatch):
  # One worker a core: the worker's tokenizer asks SentencePiece for one
  # thread (the parent's, the fixed four), and the ids are the same.
  tok = data.get_tokenizer(_synthetic(), str(tmp_path))
  folder = tmp_path / "files"
  folder.mkdir()
  for name, contents in tok.files.items():
    (folder / name).write_bytes(contents)
  monkeypatch.setattr(encoding, "_worker_tokenizer", None)
  monkeypatch.setattr(encoding.signal, "signal", lambda *args: None)
  encoding._start_worker(str(folder))  # pylint: disable=protected-access
  worker = encoding._worker_tokenizer  # pylint: disable=protected-access
  asked = []
  for t in (tok, worker):
    processor = t._sp  # pylint: disable=protected-access
    monkeypatch.setattr(t, "_sp", _Recording(processor, asked))
  texts = ["a b c " * 7, "x y"]
  assert worker.encode_batch(texts) == tok.encode_batch(texts)
  assert asked == [1, 4]


class _Recording:
  """A SentencePiece processor that notes the threads each batch asks."""

  def __init__(self, processor, asked):
    self.processor, self.asked = processor, asked

  def encode(self, texts, **options):
    self.asked.append(options["num_threads"])
    return self.processor.encode(texts, **options)


_UNGUARDED = """
import sys
sys.path.insert(0, {repo!r})
from configs import base
from mha import data
config = base.get_config("tiny")
config.update(dict(dataset_name="synthetic", source_lang="src",
                   target_lang="tgt", vocab_size=100, tokenize_processes=2))
tok = data.get_tokenizer(config, {workdir!r})
data.tokenized.tokenize_split(config, tok, "train[:50]")
"""


def test_a_script_without_a_main_guard_gets_an_error_not_a_hang(tmp_path):
  # Each worker imports the main script ('spawn'): one that tokenizes at
  # its top level would start workers of its own. It stops with the way
  # out named, in seconds.
  script = tmp_path / "unguarded.py"
  script.write_text(_UNGUARDED.format(
      repo=str(pathlib.Path(__file__).resolve().parents[1]),
      workdir=str(tmp_path / "work")))
  done = subprocess.run([sys.executable, str(script)], capture_output=True,
                        text=True, timeout=300, check=False)
  assert done.returncode == 1
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith("mha.errors.DataError: A tokenization worker "
                         "stopped")
  assert ("config.tokenize_processes) imports the main script: its code "
          "must run under `if __name__ == '__main__':`; or set "
          "config.tokenize_processes=1.") in last
