"""train_and_evaluate end to end on a tiny config: resume, preemption, NaN."""
import errno
import gc
import json
import logging
import os
import re
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from tensorboard.plugins.hparams import plugin_data_pb2 as hparams_plugin_data_pb2
import tensorflow as tf

from mha.store import checkpoints
from mha import errors
from mha.store import metrics as metrics_lib
from mha.train import actions as train_actions
from mha.train import setup as train_setup
from mha.train import step as train_step
from mha.train import trainer
from mha.store import workdir as workdir_lib
from conftest import TINY_OVERRIDES
from conftest import built_once
from conftest import file_hashes
from conftest import tiny_config
from conftest import xla_flags
from test_packaging import outside_the_core
from test_packaging import with_imports_recorded

REPO = pathlib.Path(__file__).resolve().parents[1]


# The model of this file's runs: the tiny config with one layer a side.
# What these tests check (the loop, resume, saves, signals, processes,
# retraces) does not depend on the depth, and tracing and compiling the
# steps is most of their time: one layer a side cuts it by about a third.
ONE_LAYER = dict(num_layers=1)


def _tiny_config(**changes):
  """conftest's tiny_config with ONE_LAYER."""
  return tiny_config(**{**ONE_LAYER, **changes})


def _flags(**changes) -> list[str]:
  overrides = dict(TINY_OVERRIDES, **ONE_LAYER, **changes)
  return ["--config=configs/quickstart.py:tiny"] + [
      f"--config.{k}={v}" for k, v in overrides.items()]


def _env(num_devices: int) -> dict[str, str]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = xla_flags(num_devices)
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _train_cmd(workdir, *flags) -> list[str]:
  return [sys.executable, "train.py", f"--workdir={workdir}", *flags]


def _params(workdir, step=None):
  params, _ = checkpoints.restore_params(str(workdir), step)
  return params


def _state(workdir, step):
  """Checkpoint `step`'s whole state (parameters, Adam moments, step, RNG),
  as NumPy arrays, read without a target."""
  path = os.path.join(workdir_lib.Workdir(str(workdir)).checkpoints_path,
                      str(step), "state")
  with ocp.PyTreeCheckpointer() as reader:
    # Every leaf as a NumPy array, as its metadata says (no target needed).
    restore_args = jax.tree_util.tree_map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
        reader.metadata(path).item_metadata.tree)
    return reader.restore(path, args=ocp.args.PyTreeRestore(
        restore_args=restore_args))


def _assert_trees_equal(a, b):
  leaves_a, tree_a = jax.tree_util.tree_flatten(a)
  leaves_b, tree_b = jax.tree_util.tree_flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
  """(workdir, result, recorded) of a tiny run of 12 steps, checkpoints
  every 4, steps 5 and 6 profiled: the workdir shared, never modified.

  The write of checkpoint 4 is held (its final rename waits) until the loop
  has logged step 6: recorded["OVERLAPPED"] holds whether it was, before
  the wait timed out (a save that blocked training would never let it).
  recorded["RELEASED"]: release_free_heap's results; ["LIVE_BYTES"]: the
  bytes of all live jax arrays at each of those calls, and
  ["LIVE_BYTES_BEFORE"] before the run started.

  Trained once per session (built_once): what the run's process recorded,
  and its result, come with it in a file that each worker's fixture reads
  and removes from its copy.
  """
  path = built_once(tmp_path_factory, "trained_workdir", _train_recorded)
  records = json.loads((path / RECORDS).read_text())
  (path / RECORDS).unlink()
  return path, records["result"], records["recorded"]


@pytest.fixture(scope="module")
def trained_workdir(trained_run):
  """trained_run's (workdir, result)."""
  return trained_run[:2]


RECORDS = "test_records.json"


def _train_recorded(workdir: pathlib.Path) -> None:
  """trained_workdir's run, with what its process recorded in RECORDS."""
  config = _tiny_config(num_train_steps=12, checkpoint_every_steps=4,
                        eval_every_steps=6, log_every_steps=2,
                        eval_bleu_sentences=8, profile_steps=(5, 2))
  release = trainer.host_memory.release_free_heap
  saver_call = train_actions.Saver.__call__
  savers = []
  recorded = {name: [] for name in ("OVERLAPPED", "RELEASED", "LIVE_BYTES",
                                    "LIVE_BYTES_BEFORE")}

  def recording_save(self, step, state, *scheduled):
    savers.append(self)
    return saver_call(self, step, state, *scheduled)

  def recording_release():
    recorded["RELEASED"].append(release())
    # A save in flight holds its own device copy of the state until Orbax
    # has written it (longer on a busy machine): the count waits for it.
    for saver in savers[-1:]:
      saver.manager.wait_until_finished()
    recorded["LIVE_BYTES"].append(_live_device_bytes())

  # Arrays that earlier tests of this worker process still hold (a
  # module's fixture, a jit cache) are not the run's: counted before it.
  gc.collect()
  recorded["LIVE_BYTES_BEFORE"].append(_live_device_bytes())
  with pytest.MonkeyPatch.context() as patch:
    _hold_write_until_logged(patch, recorded["OVERLAPPED"], save_step=4,
                             logged_step=6)
    patch.setattr(trainer.host_memory, "release_free_heap", recording_release)
    patch.setattr(train_actions.Saver, "__call__", recording_save)
    result = trainer.train_and_evaluate(config, str(workdir))
  (workdir / RECORDS).write_text(json.dumps(
      {"recorded": recorded, "result": result}, default=float))


def _live_device_bytes() -> int:
  """The bytes of the device buffers behind all live jax arrays, each
  buffer once (a replicated array's shards are arrays of its buffers)."""
  buffers = {}
  for x in jax.live_arrays():
    for shard in x.addressable_shards:
      buffers[(shard.device.id, shard.data.unsafe_buffer_pointer())] = (
          shard.data.nbytes)
  return sum(buffers.values())


def _hold_write_until_logged(patch, overlapped: list, save_step: int,
                             logged_step: int):
  """Orbax's rename that ends the save of `save_step` waits until the
  trainer has written the training metrics of `logged_step`."""
  from orbax.checkpoint._src.path import atomicity
  logged = threading.Event()
  finalize = atomicity.AtomicRenameTemporaryPath.finalize
  write = metrics_lib.MetricsWriter.write

  async def held(self):
    if self.get_final().name == str(save_step):
      overlapped.append(logged.wait(120))
    return await finalize(self)

  def recording(self, step, scalars):
    write(self, step, scalars)
    if step >= logged_step and "loss" in scalars:
      logged.set()

  patch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", held)
  patch.setattr(metrics_lib.MetricsWriter, "write", recording)


def test_end_to_end_loss_falls_and_workdir_layout(trained_workdir):
  workdir, result = trained_workdir
  assert result["step"] == 12
  records = metrics_lib.read_metrics(str(workdir))
  train = [r for r in records if "loss" in r]
  assert [r["step"] for r in train] == [2, 4, 6, 8, 10, 12]
  assert train[-1]["loss"] < train[0]["loss"]
  for key in ("accuracy", "learning_rate", "tokens_per_sec", "steps_per_sec",
              "perplexity"):
    assert key in train[-1]
  evals = [r for r in records if "eval_loss" in r]
  assert [r["step"] for r in evals] == [6, 12]
  # BLEU, chrF and decode speed of the 8 sentences are logged at each eval
  # (their values after 12 steps say nothing; the quickstart test and the
  # evaluator's tests check BLEU itself).
  for record in evals:
    assert all(np.isfinite(record[k]) for k in (
        "eval_bleu", "eval_chrf", "eval_decode_sentences_per_sec"))
    assert record["eval_seconds"] > 0
  # The first BLEU compiles its search; the second, on the same sentences,
  # reuses it: its time of compiling, logged apart, is 0.
  assert [r["eval_decode_compile_seconds"] > 0 for r in evals] == [True,
                                                                   False]
  assert evals[1]["eval_decode_compile_seconds"] == 0.0
  # The time each save paused training, logged at its step.
  saves = [r for r in records if "save_seconds" in r]
  assert [r["step"] for r in saves] == [4, 8, 12]
  assert all(r["save_seconds"] >= 0 for r in saves)
  assert checkpoints.all_steps(str(workdir)) == [4, 8, 12]
  assert (workdir / "spm.model").exists()
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["d_model"] == 32 and saved["num_train_steps"] == 12
  assert list(workdir.glob("events.out.tfevents.*"))
  # The learning rate logged at step 2 is the noam value of update 2.
  lr = [r["learning_rate"] for r in train if r["step"] == 2][0]
  config = _tiny_config()
  k = np.array([1.0, 2.0])  # the mean over the window of updates 1 and 2
  expected = (config.learning_rate_scale * config.d_model ** -0.5 *
              np.minimum(k ** -0.5, k * config.warmup_steps ** -1.5)).mean()
  assert lr == pytest.approx(expected, rel=1e-5)


def _hparams(workdir) -> dict:
  """The hparams of the workdir's TensorBoard event files."""
  found = {}
  for path in workdir.glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name != "hparams":
          continue
        data = hparams_plugin_data_pb2.HParamsPluginData.FromString(
            value.metadata.plugin_data.content)
        for key, hparam in data.session_start_info.hparams.items():
          found[key] = getattr(hparam, hparam.WhichOneof("kind"))
  return found


def test_hparams_and_profile_are_written_into_the_workdir(trained_workdir):
  workdir, _ = trained_workdir
  hparams = _hparams(workdir)
  saved = json.loads((workdir / "config.json").read_text())
  # Every field of the resolved config, as config.json holds it.
  assert set(hparams) == set(saved)
  assert hparams["d_model"] == 32 and hparams["num_train_steps"] == 12
  assert hparams["attention_type"] == saved["attention_type"]
  assert hparams["profile_steps"] == "(5, 2)"
  # config.profile_steps=(5, 2): one jax.profiler trace, where TensorBoard
  # looks for it.
  traces = list(pathlib.Path(workdir_lib.Workdir(workdir).profile_path)
                .glob("*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_free_heap_is_released_after_each_compilation(trained_run):
  # After the first update and after each of the two evaluations (steps 6
  # and 12), glibc's malloc_trim: True where libc has it (Linux).
  _, _, recorded = trained_run
  assert recorded["RELEASED"] == [sys.platform.startswith("linux")] * 3


def test_training_keeps_one_copy_of_the_state(trained_run):
  # During the run the live arrays are the replicated state (a copy per
  # device) and a few scalars: the set-up's step-0 state is not kept too.
  workdir, _, recorded = trained_run
  state_bytes = sum(np.asarray(x).nbytes for x in
                    jax.tree_util.tree_leaves(_state(workdir, 12)))
  replicated = jax.local_device_count() * state_bytes
  (before,) = recorded["LIVE_BYTES_BEFORE"]
  run = [live - before for live in recorded["LIVE_BYTES"]]
  assert run and all(replicated <= live < replicated + state_bytes // 2
                     for live in run), (recorded, state_bytes)


def test_resume_continues_from_latest_checkpoint(trained_workdir, tmp_path):
  # Without its step-12 checkpoint the run resumes from step 8 and must
  # train steps 9-12 to the very parameters of the uninterrupted run.
  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  shutil.rmtree(copy / "checkpoints" / "12")
  assert checkpoints.latest_step(str(copy)) == 8
  result = trainer.train_and_evaluate(
      _tiny_config(num_train_steps=12, checkpoint_every_steps=4,
                   eval_every_steps=100, log_every_steps=2), str(copy))
  assert result["step"] == 12
  assert checkpoints.all_steps(str(copy)) == [4, 8, 12]
  # Both runs saved asynchronously: the whole state, Adam's moments and
  # count included, is bit-identical.
  resumed, straight = _state(copy, 12), _state(workdir, 12)
  assert set(resumed) == {"params", "opt_state", "step", "rng"}
  _assert_trees_equal(resumed, straight)
  assert int(resumed["step"]) == 12
  steps = [r["step"] for r in metrics_lib.read_metrics(str(copy))
           if "loss" in r]
  assert steps[-2:] == [10, 12]


def test_training_goes_on_while_a_checkpoint_is_written(trained_run):
  # Checkpoint 4's write was held until step 6 was logged: training went on
  # meanwhile, and the run still waited for every write before returning.
  workdir, result, recorded = trained_run
  assert recorded["OVERLAPPED"] == [True]
  assert result["step"] == 12 and result["save_seconds"] >= 0
  assert checkpoints.all_steps(str(workdir)) == [4, 8, 12]
  assert not list((workdir / "checkpoints").glob("*tmp*"))


def test_finished_workdir_is_left_as_it_is_without_reading_data(
    trained_workdir, tmp_path):
  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  before = file_hashes(copy)
  # A split that does not exist: reading the training data would raise.
  result = trainer.train_and_evaluate(
      _tiny_config(num_train_steps=12, checkpoint_every_steps=4,
                   train_split="no_such_split"), str(copy))
  assert result == {"step": 12}
  # Not a file added (an event file of its own) or changed.
  assert file_hashes(copy) == before
  assert trainer.train_and_evaluate(_tiny_config(num_train_steps=8),
                                    str(copy)) == {"step": 12}
  assert file_hashes(copy) == before


def test_resume_with_other_grad_accum_continues_the_data(
    trained_workdir, tmp_path, caplog, train_batches_starts):
  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  assert checkpoints.read_meta(str(copy))["data_position"] == 12
  result = trainer.train_and_evaluate(
      _tiny_config(num_train_steps=14, checkpoint_every_steps=4,
                   eval_every_steps=100, grad_accum_steps=2), str(copy))
  assert result["step"] == 14
  # 12 micro-batches before the resume: the 13th batch of the plan is the
  # first one read (none replayed or skipped), then 2 updates of 2.
  assert train_batches_starts == [12]
  meta = checkpoints.read_meta(str(copy), 14)
  assert (meta["data_position"], meta["grad_accum_steps"]) == (16, 2)
  assert "grad_accum_steps: 1 -> 2" in caplog.text
  assert "not bit-identical" in caplog.text


def test_other_data_settings_without_a_checkpoint_are_no_resume(tmp_path,
                                                                 caplog):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(_tiny_config(seed=5).to_json())
  caplog.set_level(logging.INFO)
  trainer.train_and_evaluate(_tiny_config(num_train_steps=0), str(workdir))
  assert "Starting a new run" in caplog.text
  assert "other data settings" not in caplog.text
  assert json.loads((workdir / "config.json").read_text())["seed"] == 0


def test_another_language_pair_is_refused_with_the_warm_start_named(
    tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(_tiny_config().to_json())
  before = (workdir / "config.json").read_bytes()
  for field in ("source_lang", "target_lang"):
    with pytest.raises(errors.ConfigError, match=(
        f"written with {field}='(src|tgt)' but the config gives {field}='fr'"
        "; a workdir translates one language pair. Use another --workdir "
        r"\(config.init_from=")):
      trainer.train_and_evaluate(_tiny_config(**{field: "fr"}), str(workdir))
  assert sorted(os.listdir(workdir)) == ["config.json"]
  assert (workdir / "config.json").read_bytes() == before


@pytest.mark.parametrize("changes, message", [
    (dict(eval_every_steps=0), "config.eval_every_steps must be >= 1, got 0"),
    (dict(checkpoint_every_steps=-1), "config.checkpoint_every_steps must"),
    (dict(log_every_steps=0), "config.log_every_steps must be >= 1"),
    (dict(grad_accum_steps=0), "config.grad_accum_steps must be >= 1"),
    (dict(num_train_steps=-5), "config.num_train_steps must be >= 0"),
    (dict(profile_steps=(0, 2)),
     r"config.profile_steps must be \(\) \(off\) or \(first, count\).*"
     r"got \(0, 2\)"),
    (dict(profile_steps=(3,)), r"config.profile_steps must be .*got \(3,\)"),
])
def test_bad_loop_settings_are_refused_before_anything_is_written(
    tmp_path, changes, message):
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=message):
    trainer.train_and_evaluate(_tiny_config(**changes), str(workdir))
  assert not workdir.exists()


def test_train_py_prints_one_message_for_bad_input(tmp_path):
  workdir = tmp_path / "run"
  result = subprocess.run(
      _train_cmd(workdir, *_flags(eval_every_steps=0)), cwd=REPO,
      env=_env(1), capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 1
  assert result.stderr.rstrip().endswith(
      "train.py: config.eval_every_steps must be >= 1, got 0.")
  assert "Traceback" not in result.stderr
  assert not workdir.exists()


def test_conflicting_model_field_is_refused(trained_workdir, tmp_path):
  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  before = checkpoints.all_steps(str(copy))
  with pytest.raises(ValueError, match=r"d_model=32 .* d_model=48"):
    trainer.train_and_evaluate(_tiny_config(d_model=48), str(copy))
  assert checkpoints.all_steps(str(copy)) == before


def test_nan_stops_with_step_named_and_checkpoints_intact(trained_workdir,
                                                          tmp_path):
  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  before = _params(copy, 12)
  # An absurd learning rate makes the parameters overflow after one update.
  config = _tiny_config(num_train_steps=24, checkpoint_every_steps=1,
                        learning_rate_scale=1e30, log_every_steps=100)
  with pytest.raises(FloatingPointError, match=r"at step \d+") as error:
    trainer.train_and_evaluate(config, str(copy))
  bad_step = int(re.search(r"at step (\d+)", str(error.value)).group(1))
  assert 12 < bad_step <= 24
  steps = checkpoints.all_steps(str(copy))
  assert max(steps) < bad_step
  _assert_trees_equal(_params(copy, 12), before)


def test_no_retrace_for_a_batch_shape_seen_before(tiny_workdir, tmp_path,
                                                  monkeypatch):
  traced_shapes = []
  make = train_step.make_train_step

  def counting(*args, **kwargs):
    step = make(*args, **kwargs)

    def traced(state, batch, stop):
      traced_shapes.append(tuple(sorted(
          (k, v.shape) for k, v in batch.items())))
      return step(state, batch, stop)

    return traced

  monkeypatch.setattr(train_step, "make_train_step", counting)
  _seed_vocabulary(tiny_workdir, tmp_path / "run")
  trainer.train_and_evaluate(
      _tiny_config(num_train_steps=30, checkpoint_every_steps=100,
                   eval_every_steps=100, log_every_steps=10),
      str(tmp_path / "run"))
  assert traced_shapes, "the train step was never traced"
  assert len(traced_shapes) == len(set(traced_shapes)), traced_shapes
  assert len(traced_shapes) <= 3


def _seed_vocabulary(source: pathlib.Path, target: pathlib.Path) -> None:
  """Copies a finished run's vocabulary and tokenized splits into a new
  workdir: the same files its own first start would write, minus the time.

  The runs below that start from conftest's tiny_workdir's (the same
  vocabulary and data settings, TINY_OVERRIDES) test the loop, signals and
  processes, not the vocabulary's training: trained once per session, it
  saves each of them ~2.5 s of CPU."""
  target.mkdir(parents=True)
  shutil.copy(source / "spm.model", target / "spm.model")
  shutil.copytree(source / "tokenized", target / "tokenized")


def _wait_for(predicate, process, timeout=240.0):
  end = time.time() + timeout
  while time.time() < end:
    if predicate():
      return True
    if process.poll() is not None:
      return predicate()
    time.sleep(0.02)
  return False


# train.py, killed (SIGKILL) inside the save of step $MHA_TEST_KILL_AT_SAVE:
# its files are written under Orbax's temporary name, not yet renamed.
_KILLED_IN_SAVE = r"""
import os, runpy, signal, sys
from orbax.checkpoint._src.path import atomicity

finalize = atomicity.AtomicRenameTemporaryPath.finalize
async def killing(self):
  if self.get_final().name == os.environ["MHA_TEST_KILL_AT_SAVE"]:
    os.kill(os.getpid(), signal.SIGKILL)
  return await finalize(self)
atomicity.AtomicRenameTemporaryPath.finalize = killing
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.exact
def test_sigkill_and_resume_is_bit_identical(tiny_workdir, tmp_path):
  flags = _flags(num_train_steps=40, checkpoint_every_steps=10,
                 keep_checkpoints=10, eval_every_steps=1000,
                 log_every_steps=5)
  straight = tmp_path / "straight"
  _seed_vocabulary(tiny_workdir, straight)
  imports = tmp_path / "imports.json"
  subprocess.run(with_imports_recorded(imports, "train.py",
                                       f"--workdir={straight}", *flags),
                 cwd=REPO, env=_env(2), check=True, capture_output=True)
  # Everything training imported is installed by the README's main command.
  assert not outside_the_core(json.loads(imports.read_text()))

  interrupted = tmp_path / "interrupted"
  _seed_vocabulary(straight, interrupted)
  # 1. Killed inside the first save: steps 5 and 10 logged, no checkpoint.
  killed = subprocess.run(
      [sys.executable, "-c", _KILLED_IN_SAVE, f"--workdir={interrupted}",
       *flags], cwd=REPO, env=dict(_env(2), MHA_TEST_KILL_AT_SAVE="10"),
      capture_output=True, check=False)
  assert killed.returncode == -signal.SIGKILL
  assert checkpoints.all_steps(str(interrupted)) == []
  assert [p.name for p in (interrupted / "checkpoints").iterdir()
          if p.name.startswith("10.")], "not killed inside the save"
  assert (interrupted / "lock").exists()  # left by the killed run
  # 2. Killed from outside at whatever moment follows the first checkpoint.
  process = subprocess.Popen(_train_cmd(interrupted, *flags), cwd=REPO,
                             env=_env(2), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  try:
    assert _wait_for(lambda: checkpoints.all_steps(str(interrupted)),
                     process), "no checkpoint appeared"
    process.send_signal(signal.SIGKILL)
    process.wait()
  finally:
    process.kill()
  killed_at = checkpoints.latest_step(str(interrupted))
  assert killed_at < 40, "the run finished before it could be killed"
  # 3. Resumed to the end: the same parameters, each step logged once.
  subprocess.run(_train_cmd(interrupted, *flags), cwd=REPO, env=_env(2),
                 check=True, capture_output=True)
  assert checkpoints.latest_step(str(interrupted)) == 40
  _assert_trees_equal(_params(interrupted, 40), _params(straight, 40))

  def logged(workdir):
    return [r["step"] for r in metrics_lib.read_metrics(str(workdir))
            if "loss" in r]

  assert logged(interrupted) == logged(straight) == list(range(5, 41, 5))
  assert not (interrupted / "lock").exists()


def test_sigterm_saves_a_checkpoint_where_it_stopped(tiny_workdir, tmp_path):
  workdir = tmp_path / "run"
  _seed_vocabulary(tiny_workdir, workdir)
  schedule = dict(checkpoint_every_steps=10, keep_checkpoints=2,
                  eval_every_steps=100000, log_every_steps=1)
  flags = _flags(num_train_steps=100000, **schedule)
  process = subprocess.Popen(_train_cmd(workdir, *flags), cwd=REPO,
                             env=_env(2), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  try:
    assert _wait_for(lambda: len(checkpoints.all_steps(str(workdir))) >= 2,
                     process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
  finally:
    process.kill()
  assert process.returncode == 0, stderr[-2000:]
  last_logged = max(r["step"] for r in metrics_lib.read_metrics(str(workdir)))
  saved = checkpoints.latest_step(str(workdir))
  assert saved == last_logged
  assert 20 <= saved < 100000  # stopped early, past two checkpoints
  assert "Preempted" in stderr
  # The save where it stopped displaced neither of the last 2 scheduled
  # checkpoints (every 10 steps: the ones averaged); resumed to the next
  # scheduled step, the run keeps the schedule's alone.
  scheduled = [saved // 10 * 10 - 10, saved // 10 * 10]
  assert checkpoints.all_steps(str(workdir)) == sorted({*scheduled, saved})
  resume_to = scheduled[-1] + 10
  subprocess.run(_train_cmd(workdir, *_flags(num_train_steps=resume_to,
                                             **schedule)),
                 cwd=REPO, env=_env(2), check=True, capture_output=True)
  assert checkpoints.all_steps(str(workdir)) == [resume_to - 10, resume_to]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_like_one(tiny_workdir, tmp_path):
  flags = _flags(num_train_steps=6, checkpoint_every_steps=6,
                 eval_every_steps=6, log_every_steps=1, dropout_rate=0.0)
  single = tmp_path / "single"
  _seed_vocabulary(tiny_workdir, single)
  # The two runs' rounding differs by psums across processes, which Adam's
  # per-entry scaling magnifies: the parameters agree to 9e-7 on an Intel
  # Xeon, where a run that averaged wrongly would be off by its updates
  # (the learning rate, 1e-2 here, per entry and step).
  subprocess.run(_train_cmd(single, *flags), cwd=REPO, env=_env(4),
                 check=True, capture_output=True)

  multi = tmp_path / "multi"
  _seed_vocabulary(single, multi)
  address = f"localhost:{_free_port()}"
  processes = [
      subprocess.Popen(
          _train_cmd(multi, *flags, f"--coordinator_address={address}",
                     "--num_processes=2", f"--process_id={i}"),
          cwd=REPO, env=_env(2),
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outputs = []
  for p in processes:
    try:
      outputs.append(p.communicate(timeout=300)[0])
    finally:
      p.kill()
  for p, out in zip(processes, outputs):
    assert p.returncode == 0, out[-3000:]
  assert "Process 1 of 2" in outputs[1]

  def losses(workdir):
    return [r["loss"] for r in metrics_lib.read_metrics(str(workdir))
            if "loss" in r]

  np.testing.assert_allclose(losses(multi), losses(single), rtol=1e-5)
  assert len(losses(single)) == 6
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
      _params(multi, 6), _params(single, 6))


def test_processes_with_different_vocabularies_are_refused(monkeypatch):
  class FakeTokenizer:
    path = "/w/spm.model"
    sha256 = "ab" * 32

  ours = np.frombuffer(bytes.fromhex(FakeTokenizer.sha256), np.uint8)
  theirs = ours.copy()
  theirs[0] ^= 1
  monkeypatch.setattr(jax, "process_count", lambda: 3)
  gathered = np.stack([ours, ours, theirs])
  monkeypatch.setattr(train_setup.multihost_utils, "process_allgather",
                      lambda x: gathered)
  with pytest.raises(errors.UserError,
                     match=r"Processes \[2\] hold a different "
                     r"SentencePiece model .*/w/spm.model"):
    train_setup.check_same_vocabulary(FakeTokenizer())
  gathered = np.stack([ours, ours, ours])
  train_setup.check_same_vocabulary(FakeTokenizer())  # the same: accepted


class _LoopParts:
  """Stand-ins for `trainer._loop`'s parts, recording what it asks of them:
  the state is the number of updates made, an update's metrics carry the
  stop flag it was given, and SIGTERM arrives during update `sigterm_at`."""

  def __init__(self, monkeypatch, sigterm_at=None):
    self.events = []
    self.sigterm_at = sigterm_at
    self.stop = False  # the window's: a fetched update carried the flag
    self.received = self.interrupted = False  # the signal's
    monkeypatch.setattr(trainer.host_memory, "release_free_heap",
                        lambda: self.events.append(("release",)))

  def update(self, state, micro, stop):
    assert len(micro) == 2  # grad_accum_steps batches
    if state["params"] + 1 == self.sigterm_at:
      self.received = True
    return {"params": state["params"] + 1}, int(stop[0])

  # MetricsWindow
  def add(self, step, stop_flag):
    self.events.append(("add", step))
    self.stop = self.stop or stop_flag > 0

  def write(self, step, scalars):
    self.events.append(("write", step, sorted(scalars)))

  def saved(self):
    self.events.append(("saved",))

  # Saver
  def save(self, step, state, scheduled):
    self.events.append(("save", step, state["params"], scheduled))
    return 0.5

  # an evaluation
  def due(self, step):
    return step % 5 == 0

  def __call__(self, params):
    self.events.append(("eval", params))
    return {"eval_loss": 1.0}

  # Profiler
  def before_update(self, step):
    self.events.append(("profile", step))

  def after_update(self, step, state):
    pass

  def close(self):
    pass

  # StopSignal
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def run(self, num_train_steps=12):
    config = ml_collections.ConfigDict(dict(
        num_train_steps=num_train_steps, checkpoint_every_steps=4,
        grad_accum_steps=2))
    step = trainer._loop(  # pylint: disable=protected-access
        config, {"params": 0}, 0, iter(range(1000)), self.update, self,
        self.save, [self], self, self)
    return step, [e for e in self.events if e[0] != "profile"], [
        e[1] for e in self.events if e[0] == "profile"]


def test_loop_saves_evaluates_and_fetches_metrics_on_schedule(monkeypatch):
  """Updates 1..num_train_steps (the profiler told each one's step); each
  update's metrics fetched once, in order, before its step's save or
  evaluation; scheduled saves at every checkpoint_every_steps-th step and
  the last; evaluations where due, with the parameters of that step; the
  heaps' free pages released after the first update and each evaluation."""
  parts = _LoopParts(monkeypatch)
  step, events, profiled = parts.run(num_train_steps=10)
  assert step == 10 and profiled == list(range(1, 11))
  assert [e[1] for e in events if e[0] == "add"] == list(range(1, 11))
  assert [e for e in events if e[0] in ("save", "eval")] == [
      ("save", 4, 4, True), ("eval", 5), ("save", 8, 8, True),
      ("save", 10, 10, True), ("eval", 10)]
  for kind, at in (("save", 4), ("eval", 5), ("save", 8), ("save", 10)):
    first = next(i for i, e in enumerate(events)
                 if e[0] == kind and e[1] == at)
    assert ("add", at) in events[:first], (kind, at)
  assert events[0] == ("release",) and events.count(("release",)) == 3


def test_loop_stops_where_it_fetches_a_sigterms_flag_and_saves_there(
    monkeypatch):
  """A SIGTERM during update 5 sets the stop flag of update 6; once that
  update's metrics are fetched (during step 7) the run saves step 7,
  unscheduled, and returns it."""
  parts = _LoopParts(monkeypatch, sigterm_at=5)
  step, events, _ = parts.run()
  assert step == 7
  assert [e for e in events if e[0] in ("save", "eval")] == [
      ("save", 4, 4, True), ("eval", 5), ("save", 7, 7, False)]
  assert events[-2:] == [("write", 7, ["save_seconds"]), ("saved",)]


@pytest.mark.parametrize("code, reason", [
    (errno.ENOSPC, "the disk is full"),
    (errno.EROFS, "the file system is read-only"),
    (errno.EACCES, "permission denied"),
    (errno.EDQUOT, None), (errno.EPERM, None)])
def test_a_refused_write_is_one_line_naming_the_file(tmp_path, code, reason):
  """A write the machine refuses (full disk or quota, read-only file system,
  no permission) is a DiskError naming the file and what to do; any other
  OSError is left as it is."""
  path = str(tmp_path / "metrics.jsonl")
  folder = workdir_lib.Workdir(str(tmp_path))
  with pytest.raises(errors.DiskError) as e:
    with trainer._disk_errors(folder):  # pylint: disable=protected-access
      raise OSError(code, os.strerror(code), path)
  assert str(e.value).startswith(f"{path} could not be written: ")
  if reason is not None:
    assert str(e.value).startswith(f"{path} could not be written: {reason}.")
  assert "no checkpoint was written before" in str(e.value)
  with pytest.raises(FileNotFoundError):
    with trainer._disk_errors(folder):  # pylint: disable=protected-access
      raise FileNotFoundError(errno.ENOENT, "No such file", path)
