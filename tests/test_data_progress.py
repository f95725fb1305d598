"""Progress lines of the data steps (mha/data/progress.py): their times
against an injected clock, their text, the thread that logs while a
library works, and the lines of preparation, vocabulary and tokenization."""
import logging
import threading

import pytest

from configs import base
from mha import data
from mha.data import progress


class _Clock:
  """Seconds that pass only when the test says so."""

  def __init__(self):
    self.now = 100.0

  def __call__(self) -> float:
    return self.now


@pytest.fixture
def lines(caplog):
  """The progress lines logged so far (absl logs through `logging`)."""
  caplog.set_level(logging.INFO)
  return lambda: [r.getMessage() for r in caplog.records
                  if r.getMessage().startswith(("Tokenizing", "Preparing",
                                                "Training the vocabulary",
                                                "Counting"))]


def test_a_line_at_most_every_period_with_count_total_and_rate(lines):
  clock = _Clock()
  counter = progress.Progress("Counting x", 1000, every=30, clock=clock)
  counter.add(100)          # t = 0: no line yet
  clock.now += 29.9
  counter.add(100)          # 29.9 s: still none
  assert not lines()
  clock.now += 0.1
  counter.add(100)          # 30 s: the first line
  assert lines() == ["Counting x: 300 of 1,000 pairs (30%), 10 pairs/s, "
                     "30 s."]
  clock.now += 10
  counter.add(100)          # 10 s after the line: none
  clock.now += 20
  counter.add(1200)         # 30 s after it: the second
  assert lines()[1:] == ["Counting x: 1,600 of 1,000 pairs (160%), "
                         "27 pairs/s, 1 min 0 s."]


def test_a_line_without_total_and_the_durations():
  clock = _Clock()
  counter = progress.Progress("Counting y", None, "sentences", clock=clock)
  counter.add(7_200_000)
  clock.now += 3600 * 2 + 60 * 3 + 5
  assert counter.line() == ("Counting y: 7,200,000 sentences, 975 "
                            "sentences/s, 2 h 3 min.")
  assert counter.elapsed() == 3600 * 2 + 60 * 3 + 5
  assert progress.Progress("z", 0, clock=clock).line().startswith(
      "z: 0 of 0 pairs (100%), 0 pairs/s")


def test_the_thread_logs_while_the_step_is_busy(lines):
  # The step adds nothing for a while (a library at work): `with` still
  # gives a line each period, from its own thread.
  clock = _Clock()
  released = threading.Event()
  counter = progress.Progress("Counting z", 10, every=30, clock=clock,
                              poll=0.001)
  with counter:
    counter.add(4)
    for expected in (1, 2):
      clock.now += 30
      for _ in range(2000):
        if len(lines()) == expected:
          break
        released.wait(0.005)
      assert len(lines()) == expected
  assert lines() == ["Counting z: 4 of 10 pairs (40%), 0 pairs/s, 30 s.",
                     "Counting z: 4 of 10 pairs (40%), 0 pairs/s, 1 min 0 s."]
  clock.now += 60
  released.wait(0.05)  # the thread has stopped with the `with`
  assert len(lines()) == 2


def test_preparation_vocabulary_and_tokenization_log_progress(
    tmp_path, monkeypatch, lines):
  # With a line at every count, each long step of a new run's data says
  # what it does and how far it is, with the total where it is known.
  monkeypatch.setenv("MHA_TFDS_DIR", str(tmp_path / "tfds"))
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0.0)
  for lang, words in (("de", "ein hund"), ("en", "a dog")):
    (tmp_path / f"train.{lang}").write_text(
        "".join(f"{words} {i}\n" for i in range(40)))
  config = base.get_config("tiny")
  config.update(dict(dataset_name="parallel_text", data_dir=str(tmp_path),
                     source_lang="de", target_lang="en", vocab_size=30))
  tok = data.get_tokenizer(config, str(tmp_path / "work"))
  data.tokenized.tokenize_split(config, tok, "train")
  prepared = [x for x in lines() if x.startswith("Preparing")]
  assert prepared[-1].startswith(f"Preparing {tmp_path} (de-en-")
  assert ": 40 of 40 pairs (100%), " in prepared[-1]
  trained = [x for x in lines() if x.startswith("Training")]
  assert trained[-1].startswith(
      f"Training the vocabulary on {tmp_path} de-en train: 80 sentences, ")
  tokenized = [x for x in lines() if x.startswith("Tokenizing")]
  assert tokenized[-1].startswith(
      f"Tokenizing {tmp_path} de-en train: 40 of 40 pairs (100%), ")
