"""--distributed=auto|on|off, eval.py's single-process check, and two real
processes on localhost where process 0 prepares the data and the other
reads it."""
import itertools
import json
import logging
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import REPO_ROOT
from conftest import TINY_OVERRIDES
from conftest import tiny_config
from conftest import xla_flags
from mha import data
from mha.runtime import distributed
from mha.data import multihost
from mha.data import sources
from mha.data import synthetic
from mha.errors import ConfigError


def _slurm_env(ntasks: int, procid: int = 0) -> dict[str, str]:
  """The variables by which JAX's SlurmCluster recognises a SLURM task."""
  return {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "localhost",
          "SLURM_NTASKS": str(ntasks), "SLURM_PROCID": str(procid),
          "SLURM_LOCALID": str(procid)}


@pytest.fixture
def initialize_calls(monkeypatch):
  """jax.distributed.initialize replaced by a recorder of its arguments."""
  calls = []
  monkeypatch.setattr(distributed.jax.distributed, "initialize",
                      lambda **kwargs: calls.append(kwargs))
  return calls


def _detected(monkeypatch, env):
  monkeypatch.setattr(distributed, "detect_cluster", lambda: env)


class FakeCluster:
  """Stands for the cluster class that detect_cluster returns."""


def test_auto_initializes_only_where_jax_detects_a_cluster(
    monkeypatch, initialize_calls, caplog):
  caplog.set_level(logging.INFO)
  _detected(monkeypatch, None)
  distributed.initialize("auto")
  assert initialize_calls == []
  assert "Process 0 of 1: 4 local of 4 global devices (cpu)." in caplog.text
  _detected(monkeypatch, FakeCluster)
  distributed.initialize("auto")
  distributed.initialize("on")
  # Without arguments: JAX's own detection fills them in.
  assert initialize_calls == [{}, {}]
  assert "jax.distributed through FakeCluster" in caplog.text


def test_off_never_initializes(monkeypatch, initialize_calls):
  _detected(monkeypatch, FakeCluster)
  distributed.initialize("off")
  assert initialize_calls == []
  with pytest.raises(ConfigError, match="--distributed=off cannot take"):
    distributed.initialize("off", "host:1234", 2, 0)


def test_explicit_flags_are_passed_on_and_go_together(monkeypatch,
                                                      initialize_calls):
  _detected(monkeypatch, None)
  distributed.initialize("auto", "host:1234", 2, 1)
  assert initialize_calls == [dict(coordinator_address="host:1234",
                                   num_processes=2, process_id=1)]
  with pytest.raises(ConfigError, match="--num_processes, --process_id "
                     "missing"):
    distributed.initialize("auto", "host:1234")


def test_on_without_a_cluster_is_one_line(monkeypatch, initialize_calls):
  _detected(monkeypatch, None)
  with pytest.raises(ConfigError) as e:
    distributed.initialize("on")
  assert "--distributed=on: JAX detects no cluster" in str(e.value)
  assert "\n" not in str(e.value) and initialize_calls == []
  with pytest.raises(ConfigError, match="use one of auto, on, off"):
    distributed.initialize("maybe")


def test_a_failing_initialize_is_one_line(monkeypatch):
  def fail(**kwargs):
    raise RuntimeError("DEADLINE_EXCEEDED: Barrier timed out\n  more")
  monkeypatch.setattr(distributed.jax.distributed, "initialize", fail)
  with pytest.raises(ConfigError) as e:
    distributed.initialize("on", "host:1234", 2, 1)
  assert str(e.value).startswith("jax.distributed.initialize "
                                 "(--coordinator_address) failed: "
                                 "DEADLINE_EXCEEDED: Barrier timed out more")


def test_detection_is_jaxs_own(monkeypatch):
  """The real detection: nothing here; a SLURM task's variables are JAX's
  SlurmCluster; Kubernetes without the kubernetes package is not a cluster
  (JAX warns)."""
  for name in _slurm_env(2):
    monkeypatch.delenv(name, raising=False)
  assert distributed.detect_cluster() is None
  for name, value in _slurm_env(2).items():
    monkeypatch.setenv(name, value)
  assert distributed.detect_cluster().__name__ == "SlurmCluster"
  for name in _slurm_env(2):
    monkeypatch.delenv(name)
  monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
  with pytest.warns(UserWarning, match="kubernetes"):
    assert distributed.detect_cluster() is None


def test_eval_py_refuses_a_cluster_of_several_processes(monkeypatch, eval_py,
                                                        tmp_path, capsys):
  for name, value in _slurm_env(2).items():
    monkeypatch.setenv(name, value)
  assert eval_py(f"--workdir={tmp_path / 'run'}") == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("eval.py: JAX detects a cluster of 2 processes "
                        "(SlurmCluster), but eval.py runs in one process")
  assert "\n" not in err
  # A job of one task is one process: the check lets it through (to the
  # missing workdir's own message).
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert eval_py(f"--workdir={tmp_path / 'run'}") == 1
  err = capsys.readouterr().err
  assert "cluster of" not in err and "does not exist" in err


class FakeClient:
  """The coordination service's key-value store, in one process."""

  def __init__(self, values=None, timeouts=0):
    self.values = dict(values or {})
    self.timeouts = timeouts  # blocking gets that time out first

  def key_value_set(self, key, value):
    assert key not in self.values, key
    self.values[key] = value

  def blocking_key_value_get(self, key, timeout_in_ms):
    del timeout_in_ms
    if self.timeouts:
      self.timeouts -= 1
      raise jax.errors.JaxRuntimeError(f"DEADLINE_EXCEEDED: {key}")
    return self.values[key]


def _as_process(monkeypatch, index, client):
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: index)
  monkeypatch.setattr(multihost, "_client", lambda: client)
  monkeypatch.setattr(multihost, "_calls", itertools.count())


def test_process_zero_passes_its_error_to_the_others(monkeypatch):
  client = FakeClient()
  _as_process(monkeypatch, 0, client)

  def bad_step():
    raise data.DataError("train.de has 3 lines,\n train.en 4.")

  with pytest.raises(data.DataError, match="train.de has 3 lines"):
    multihost.process_zero_first("prepare the folder", bad_step)
  steps = []
  _as_process(monkeypatch, 1, FakeClient(client.values, timeouts=2))
  with pytest.raises(data.DataError) as e:
    multihost.process_zero_first("prepare the folder",
                                 lambda: steps.append(1))
  assert str(e.value) == ("Process 0 could not prepare the folder: "
                          "DataError: train.de has 3 lines, train.en 4.")
  assert steps == []  # the others do not run a step that failed


def test_calls_inside_a_step_do_not_wait(monkeypatch):
  """Process 0 trains (opening a split, itself a process_zero_first call)
  where process 1 loads: only the outer calls are numbered and waited on,
  so both processes agree on the numbers of the calls that follow."""
  client = FakeClient()
  for index, inner_calls in ((0, 2), (1, 0)):
    _as_process(monkeypatch, index, client)
    order = []

    def step(inner_calls=inner_calls, order=order):
      for _ in range(inner_calls):
        multihost.process_zero_first("open", lambda: order.append("inner"))
      order.append("outer")

    multihost.process_zero_first("train", step)
    multihost.process_zero_first("tokenize", lambda order=order:
                                 order.append("next"))
    assert order == ["inner"] * inner_calls + ["outer", "next"]
  assert client.values == {"mha/data/process_zero_first/0": "ok",
                           "mha/data/process_zero_first/1": "ok"}



def test_calls_inside_a_waiting_processs_step_do_not_wait_either(
    monkeypatch):
  """Process 1's step may itself call process_zero_first (opening a split
  while it loads the vocabulary): that call runs directly there too, so the
  outer calls keep the same numbers on every process."""
  client = FakeClient()
  for index in (0, 1):
    _as_process(monkeypatch, index, client)
    order = []

    def step(order=order):
      multihost.process_zero_first("open", lambda: order.append("inner"))
      order.append("outer")

    multihost.process_zero_first("train", step)
    multihost.process_zero_first("tokenize", lambda order=order:
                                 order.append("next"))
    assert order == ["inner", "outer", "next"]
  assert client.values == {"mha/data/process_zero_first/0": "ok",
                           "mha/data/process_zero_first/1": "ok"}

def test_prepare_splits_opens_every_split_after_process_zero(monkeypatch):
  """TFDS datasets are prepared by opening their splits: process 0 opens
  the three first, the others after it; a bad split names its field."""
  opened = []

  def open_split(config, split):
    if split == "nope":
      raise data.DataError("no split 'nope'")
    opened.append((jax.process_index(), split))

  monkeypatch.setattr(sources, "open_split", open_split)
  config = tiny_config(dataset_name="wmt14_translate/de-en")
  client = FakeClient()
  for index in (0, 1):
    _as_process(monkeypatch, index, client)
    sources.prepare_splits(config)
  assert opened == [(0, "train"), (0, "validation"), (0, "test"),
                    (1, "train"), (1, "validation"), (1, "test")]
  # Process 0 told the others it was done; process 1 waited for that word.
  assert list(client.values.values()) == ["ok"]
  _as_process(monkeypatch, 0, FakeClient())
  with pytest.raises(data.DataError,
                     match=r"^config.test_split='nope': no split 'nope'$"):
    sources.prepare_splits(tiny_config(test_split="nope"))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


# The corpus of the two-process test: the first lines of the synthetic pair.
_SIZES = {"train": 300, "validation": 24, "test": 8}


def _write_corpus(folder: pathlib.Path) -> None:
  """A parallel_text folder of the first _SIZES lines of the synthetic
  pair's splits."""
  folder.mkdir()
  splits = synthetic.generate(0)
  for split, count in _SIZES.items():
    for lang, lines in zip(synthetic.LANGUAGES, splits[split]):
      (folder / f"{split}.{lang}").write_text(
          "".join(line + "\n" for line in lines[:count]), encoding="utf-8")


def test_two_processes_process_zero_prepares_the_other_reads(tmp_path):
  """Two processes of a SLURM-like job on localhost (2 CPU devices each):
  process 0 prepares the TFDS folder, trains the vocabulary and writes the
  tokenized caches; process 1 writes nothing and reads the same vocabulary;
  their batches are the two halves of the one-process global batches."""
  corpus, workdir = tmp_path / "corpus", tmp_path / "run"
  _write_corpus(corpus)
  overrides = dict(TINY_OVERRIDES, vocab_size=100, dataset_name="parallel_text",
                   data_dir=str(corpus))
  port = str(_free_port())
  procs = []
  for i in range(2):
    env = dict(os.environ, **_slurm_env(2, i), JAX_COORDINATOR_PORT=port,
               XLA_FLAGS=xla_flags(2),
               MHA_TFDS_DIR=str(tmp_path / "tfds"))
    procs.append(subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "tests" / "multiprocess_data.py"),
         str(tmp_path / f"out{i}.npz"), str(workdir), json.dumps(overrides)],
        env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True))
  logs = [p.communicate(timeout=240)[1] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  out = [np.load(tmp_path / f"out{i}.npz") for i in range(2)]
  for i, log in enumerate(logs):
    assert (f"Process {i} of 2, jax.distributed through SlurmCluster: 2 "
            "local of 4 global devices (cpu)." in log)
  counts = [json.loads(str(o["counts"])) for o in out]
  # spm.model and the train and validation caches, written by process 0.
  assert counts[0] == {"train_model": 1, "download_and_prepare": 1,
                       "write_bytes_atomic": 3}
  assert counts[1] == {}
  assert "Process 1 waits for process 0 to train the vocabulary" in logs[1]
  assert len(list((tmp_path / "tfds" / "parallel_text").iterdir())) == 1

  # The same vocabulary, and each process's rows are its half of the
  # global batch that one process with 4 devices builds: here from the same
  # sentences read from the synthetic dataset itself, tokenized without a
  # cache (the tokenizer has no path), without TFDS.
  tok = data.Tokenizer((workdir / "spm.model").read_bytes())
  assert str(out[0]["sha256"]) == str(out[1]["sha256"]) == tok.sha256
  config = tiny_config(**dict(
      overrides, dataset_name="synthetic", data_dir=None,
      **{f"{field}_split": f"{split}[:{_SIZES[split]}]" for field, split in
         (("train", "train"), ("eval", "validation"), ("test", "test"))}))
  kwargs = dict(process_index=0, process_count=1, num_global_devices=4)
  whole = {"train": data.train_batches(config, tok, **kwargs),
           "eval": data.eval_batches(config, tok, config.eval_split, **kwargs)}
  whole["eval"] = iter(whole["eval"])
  names = sorted(k for k in out[0].files if k[:4] in ("trai", "eval"))
  assert names == sorted(k for k in out[1].files if k[:4] in ("trai", "eval"))
  seen = 0
  for kind in ("train", "eval"):
    for i in range(sum(k.startswith(f"{kind}") and k.endswith("_inputs")
                       for k in names)):
      batch = next(whole[kind])
      for key, value in batch.items():
        halves = [o[f"{kind}{i}_{key}"] for o in out]
        assert len(halves[0]) == len(halves[1]) == len(value) // 2
        np.testing.assert_array_equal(np.concatenate(halves), value)
        seen += 1
  assert seen >= 2 * 4


def test_train_py_starts_the_processes_it_is_told_then_prepares(
    tmp_path, monkeypatch, initialize_calls):
  """train.py hands --coordinator_address, --num_processes and
  --process_id to jax.distributed as given, then prepares the splits (process
  0 first) before it trains."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from mha.runtime import library_logs  # pylint: disable=import-outside-toplevel
  from mha.train import trainer  # pylint: disable=import-outside-toplevel
  from mha.cli import train as train_py  # pylint: disable=import-outside-toplevel
  _detected(monkeypatch, None)
  steps = []
  monkeypatch.setattr(sources, "prepare_splits", lambda config: steps.append(
      ("prepare", config.dataset_name)))
  monkeypatch.setattr(trainer, "train_and_evaluate", lambda config, workdir: (
      steps.append(("train", workdir))))
  monkeypatch.setattr(sys, "argv", ["train.py"])
  level = logging.getLogger("absl").level
  flags.FLAGS.unparse_flags()
  try:
    train_py.parse_flags([
        "train.py", f"--config={REPO_ROOT / 'configs' / 'quickstart.py'}",
        f"--workdir={tmp_path}", "--coordinator_address=host:1234",
        "--num_processes=3", "--process_id=1"])
    train_py.main(["train.py"])
  finally:
    flags.FLAGS.unparse_flags()
    logging.getLogger("absl").setLevel(level)
    library_logs.configure(verbose=True)  # as the library is left by default
  assert initialize_calls == [dict(coordinator_address="host:1234",
                                   num_processes=3, process_id=1)]
  assert steps == [("prepare", "synthetic"), ("train", str(tmp_path))]
