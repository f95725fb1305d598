"""Faults from outside the program: made to happen for real where a test can.

A full disk is a small tmpfs filled with a file (root only); a read-only
folder is `chmod 555` for a user and a read-only bind mount for root (whom
chmod does not stop); Ctrl-C is a real SIGINT to a child train.py; odd
characters are in real temporary paths. Where the machine does not allow
one (no root, no mount), the test skips saying why. Each case checks the
one line, and that the workdir, its earlier checkpoints and the user's files
are as they were, and that nothing is left running or waiting.
"""
import asyncio
import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from conftest import TINY_OVERRIDES
from conftest import TINY_WORKDIR_LOOP
from conftest import file_hashes
from conftest import tiny_config
from conftest import xla_flags
from mha.store import checkpoints
from mha.store import failed_saves
from mha import errors
from mha.evaluation import evaluator
from mha.store import trained
from mha.runtime import files
from mha.store import metrics as metrics_lib
from mha.train import trainer
from mha.search import texts as translate
from mha.store import workdir as workdir_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
# The parts of a failed save that Orbax never ran: their coroutines are
# collected unawaited (train.py hides this warning, pytest resets filters).
pytestmark = pytest.mark.filterwarnings(
    "ignore:coroutine .* was never awaited:RuntimeWarning")


def _run(cmd: list[str], *args, **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run(cmd, *args, capture_output=True, text=True,
                        check=False, **kwargs)


@contextlib.contextmanager
def read_only(path: pathlib.Path):
  """`path` made read-only for real while the block runs: `chmod 555` for a
  user; for root (whom chmod does not stop) a read-only bind mount."""
  if os.geteuid() != 0:
    mode = path.stat().st_mode
    path.chmod(0o555)
    try:
      yield
    finally:
      path.chmod(mode)
    return
  mounted = _run(["mount", "--bind", "-o", "ro", str(path), str(path)])
  if mounted.returncode:
    pytest.skip("running as root, where chmod does not stop writes, and no "
                f"read-only bind mount here: {mounted.stderr.strip()}")
  try:
    try:
      (path / ".probe").touch()
    except OSError:
      pass
    else:
      (path / ".probe").unlink()
      pytest.skip("the bind mount is not read-only on this kernel")
    yield
  finally:
    _run(["umount", str(path)])


@contextlib.contextmanager
def small_disk(path: pathlib.Path, megabytes: int):
  """A tmpfs of `megabytes` mounted at `path` (root only) while the block
  runs: a disk that can be filled."""
  if os.geteuid() != 0:
    pytest.skip("a small tmpfs (a disk to fill) needs root")
  path.mkdir()
  mounted = _run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m",
                  "tmpfs", str(path)])
  if mounted.returncode:
    pytest.skip(f"no tmpfs mount here: {mounted.stderr.strip()}")
  try:
    yield path
  finally:
    _run(["umount", "-l", str(path)])


def _fill(disk: pathlib.Path, leave: int) -> pathlib.Path:
  """A file that takes all but `leave` bytes of `disk`'s free space."""
  filler = disk / "filler"
  stat = os.statvfs(disk)
  with open(filler, "wb") as f:
    os.posix_fallocate(f.fileno(), 0, stat.f_bavail * stat.f_frsize - leave)
  return filler


def _orbax_threads_waiting() -> list[str]:
  """Orbax's save threads still alive (they would keep the process from
  exiting)."""
  from orbax.checkpoint._src.futures import future  # pylint: disable=g-import-not-at-top
  return [t.name for t in threading.enumerate()
          if isinstance(t, future._SignalingThread) and t.is_alive()]  # pylint: disable=protected-access


def _assert_metrics_and_events_whole(workdir: pathlib.Path) -> None:
  """Every metrics.jsonl line a JSON record ending in a newline, every event
  file readable to its end with its checksums (TensorFlow's reader)."""
  text = (workdir / "metrics.jsonl").read_text()
  assert text.endswith("\n")
  assert all(json.loads(line) for line in text.splitlines())
  for path in workdir.glob("events.out.tfevents.*"):
    assert list(tf.compat.v1.train.summary_iterator(str(path)))


# The tiny_workdir's run (checkpoints 2, 4, 6) continued to step 8.
RESUMED = dict(TINY_WORKDIR_LOOP, num_train_steps=8)
# How a stop for a full disk ends, after what could not be written.
FULL_DISK_STOP = (
    "the disk is full. Training stopped; the last good checkpoint is step 6: "
    "free space on its disk and run train.py again to resume from it.")


def _refused_resume(error: type[Exception], workdir: pathlib.Path
                    ) -> Exception:
  """The `error` that continuing `workdir`'s run to step 8 raises."""
  with pytest.raises(error) as refused:
    trainer.train_and_evaluate(tiny_config(**RESUMED), str(workdir))
  return refused.value


# -------------------------------------------------- saving checkpoints


def test_full_disk_during_a_save_stops_with_one_line_and_resumes(
    tiny_workdir, tmp_path, caplog, monkeypatch):
  unraisable = []  # what Python would print as "Exception ignored"
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  with small_disk(tmp_path / "disk", 16) as disk:
    run = disk / "run"
    shutil.copytree(tiny_workdir, run, ignore=shutil.ignore_patterns("eval"))
    before = file_hashes(run / "checkpoints")
    # Room for the metrics lines and a new event file, not a checkpoint.
    filler = _fill(disk, leave=200_000)
    refused = _refused_resume(errors.CheckpointSaveError, run)
    assert str(refused) == ("Checkpoint 8 could not be written into "
                            f"{run}/checkpoints: {FULL_DISK_STOP}")
    assert refused.exit_code == 1
    # Orbax's threads logged no stacks of the refused writes (hundreds of
    # lines): the one line says it.
    assert not [r for r in caplog.records if r.exc_info], [
        r.getMessage()[:200] for r in caplog.records if r.exc_info]
    assert not _orbax_threads_waiting()
    # Nor did Python print their calls into Orbax's closed asyncio loop
    # (a stack of 6 lines each, dozens of them).
    assert not [u for u in unraisable if "loop is closed" in str(u.exc_value)]
    assert not (run / "lock").exists()
    # Earlier checkpoints as they were, the failed step's files removed.
    assert file_hashes(run / "checkpoints") == before
    _assert_metrics_and_events_whole(run)
    filler.unlink()
    result = trainer.train_and_evaluate(tiny_config(**RESUMED), str(run))
  assert result["step"] == 8


def test_only_calls_into_a_closed_asyncio_loop_go_unprinted(monkeypatch):
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  monkeypatch.setattr(failed_saves, "_SAVE_FAILED", threading.Event())
  loop = asyncio.new_event_loop()
  loop.close()

  class Calls:  # an exception in __del__ is unraisable: Python prints it

    def __init__(self, call):
      self.call = call

    def __del__(self):
      self.call()

  with failed_saves.quiet_save_errors():
    Calls(lambda: loop.call_soon_threadsafe(print))
    Calls(lambda: 1 / 0)
  assert [type(u.exc_value) for u in unraisable] == [ZeroDivisionError]
  # No save failed: the hook is the one before the block again.
  assert sys.unraisablehook == unraisable.append  # pylint: disable=comparison-with-callable


def test_read_only_checkpoints_folder_stops_with_one_line(copy):
  before = file_hashes(copy / "checkpoints")
  with read_only(copy / "checkpoints"):
    refused = _refused_resume(errors.CheckpointSaveError, copy)
    assert not _orbax_threads_waiting()
  reason = ("the file system is read-only" if os.geteuid() == 0
            else "permission denied")
  assert str(refused) == (
      f"Checkpoint 8 could not be written into {copy}/checkpoints: {reason}."
      " Training stopped; the last good checkpoint is step 6: make "
      f"{copy}/checkpoints writable and run train.py again to resume from "
      "it.")
  assert not (copy / "lock").exists()
  assert file_hashes(copy / "checkpoints") == before
  _assert_metrics_and_events_whole(copy)


def test_full_disk_while_logging_names_the_file(copy, monkeypatch):
  # The file layer refuses metrics.jsonl's next line as a full disk does
  # (injected: a real disk cannot be filled between two appends).
  append = files.append_bytes

  def full(path, data):
    if str(path).endswith("metrics.jsonl"):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return append(path, data)

  monkeypatch.setattr(files, "append_bytes", full)
  refused = _refused_resume(errors.DiskError, copy)
  assert str(refused) == (
      f"{copy}/metrics.jsonl could not be written: {FULL_DISK_STOP}")
  assert not (copy / "lock").exists()
  assert checkpoints.all_steps(str(copy)) == [2, 4, 6]


def test_os_reason_reads_tensorstore_errors():
  # Orbax writes arrays through TensorStore, whose errors are ValueErrors
  # carrying the errno in their text.
  error = ValueError("RESOURCE_EXHAUSTED: Error writing \"a/0\": Failed to "
                     "write 67095 bytes to file 15: No space left on device "
                     "[os_error_code='28']")
  assert errors.os_errno(error) == errno.ENOSPC
  assert errors.os_reason(error) == "the disk is full"
  assert errors.os_reason(OSError(errno.EROFS, "x")) == (
      "the file system is read-only")
  assert errors.os_errno(ValueError("INVALID_ARGUMENT: a bug")) is None


# ------------------------------------------------------------------ Ctrl-C


def _train_cmd(workdir: pathlib.Path, **changes) -> list[str]:
  overrides = dict(TINY_OVERRIDES, **changes)
  return [sys.executable, "train.py", f"--workdir={workdir}",
          "--config=configs/quickstart.py:tiny"] + [
              f"--config.{k}={v}" for k, v in overrides.items()]


def _env() -> dict[str, str]:
  return dict(os.environ, JAX_PLATFORMS="cpu",
              XLA_FLAGS=xla_flags(2))


def _wait_for(predicate, process: subprocess.Popen,
              limit: float = 600.0) -> bool:
  """Polls `predicate` until it holds or `process` ends; `limit` seconds
  only bound a hung child, far beyond a loaded machine's time."""
  end = time.monotonic() + limit
  while not predicate():
    if process.poll() is not None or time.monotonic() > end:
      return predicate()
    time.sleep(0.05)
  return True


@pytest.mark.slow
def test_ctrl_c_saves_where_it_stopped_and_exits_130(tiny_workdir, tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  shutil.copy(tiny_workdir / "spm.model", workdir / "spm.model")
  shutil.copytree(tiny_workdir / "tokenized", workdir / "tokenized")
  # One layer a side (the vocabulary and data are tiny_workdir's, the
  # model is the run's own): the depth does not matter to the signal, and
  # the steps compile and trace in a third less time.
  process = subprocess.Popen(
      _train_cmd(workdir, num_train_steps=100000, checkpoint_every_steps=4,
                 eval_every_steps=100000, log_every_steps=1, num_layers=1),
      cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True)
  try:
    assert _wait_for(lambda: checkpoints.all_steps(str(workdir)), process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
  finally:
    process.kill()
  saved = checkpoints.latest_step(str(workdir))
  last_logged = max(r["step"] for r in metrics_lib.read_metrics(str(workdir)))
  assert process.returncode == 130, stderr[-2000:]
  assert stderr.splitlines()[-1] == (
      f"train.py: Interrupted (Ctrl-C): saved checkpoint {saved} in "
      f"{workdir}/checkpoints; run train.py again to resume from it.")
  assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
  # Saved where it stopped, with the data position of that step: a resume
  # goes on exactly from there (as after SIGTERM).
  assert 4 <= saved == last_logged < 100000
  assert checkpoints.read_meta(str(workdir), saved)["data_position"] == saved
  assert not (workdir / "lock").exists()


# ------------------------------------------------------------- evaluation

SPLIT = "test[:4]"


def _fake_search(model_config, params, tokenizer, sources, settings=None,
                 **kwargs):
  """Stands in for the beam search (tested in test_evaluator.py)."""
  del model_config, params, tokenizer, settings, kwargs
  return translate.Translations([s.upper() for s in sources],
                                [None] * len(sources), [None] * len(sources),
                                1.0)


def _no_reading(*args, **kwargs):
  raise AssertionError("a checkpoint was read")


def test_a_users_folder_as_output_dir_is_refused_before_decoding(
    copy, tmp_path, monkeypatch):
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "translations.txt").write_text("my own translations\n")
  (mine / "notes.txt").write_text("mine\n")
  before = file_hashes(tmp_path)
  monkeypatch.setattr(trained, "load_params", _no_reading)
  with pytest.raises(evaluator.EvalError) as refused:
    evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(mine))
  assert str(refused.value) == (
      f"output_dir={mine} holds files that are not the results of an "
      "evaluation (it has no metrics.json); eval.py never writes over them: "
      "give a new or empty folder.")
  assert file_hashes(tmp_path) == before
  # An empty folder the user made for the results is fine.
  monkeypatch.undo()
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  empty = tmp_path / "empty"
  empty.mkdir()
  result = evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(empty))
  assert (empty / "translations.txt").read_text() == "".join(
      t + "\n" for t in result["translations"])


def test_two_evaluations_into_one_folder_one_is_refused(copy, tmp_path,
                                                        monkeypatch):
  out = tmp_path / "out"
  second = []

  def search_while_another_starts(*args, **kwargs):
    # The first evaluation decodes: a second one into the same folder.
    with pytest.raises(evaluator.EvalError) as refused:
      evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(out))
    second.append(str(refused.value))
    return _fake_search(*args, **kwargs)

  monkeypatch.setattr(translate, "translate_with_ids",
                      search_while_another_starts)
  result = evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(out))
  (message,) = second
  assert message.startswith(f"Another evaluation (process {os.getpid()}, ")
  assert message.endswith(
      f") is writing {out} (lock {tmp_path}/.out.lock): wait for it, or give "
      "another output_dir.")
  # The first one's results, whole; no lock or temporary folder left.
  assert json.loads((out / "metrics.json").read_text())["num_sentences"] == 4
  assert (out / "translations.txt").read_text().splitlines() == result[
      "translations"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]


def test_a_killed_evaluations_leftovers_are_cleaned(copy, monkeypatch):
  # What a kill -9 during the write leaves beside <workdir>/eval/test_4_6:
  # its lock (of a process that no longer runs) and its temporary folder.
  eval_root = copy / "eval"
  eval_root.mkdir()
  dead = subprocess.Popen(["true"])
  dead.wait()
  lock = workdir_lib.WorkdirLock(str(eval_root / "test_4_6"),
                                 str(eval_root / ".test_4_6.lock"))
  (eval_root / ".test_4_6.lock").write_text(
      json.dumps(dict(lock.info, pid=dead.pid)))
  staging = eval_root / ".test_4_6.tmp-0123456789ab"
  staging.mkdir()
  (staging / "translations.txt").write_text("half")
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  evaluator.evaluate(str(copy), split=SPLIT)
  assert sorted(p.name for p in eval_root.iterdir()) == ["test_4_6"]
  assert sorted(p.name for p in (eval_root / "test_4_6").iterdir()) == [
      "metrics.json", "translations.txt"]


def test_ctrl_c_during_an_evaluation_is_one_line_and_writes_nothing(
    copy, eval_py, capsys, monkeypatch):
  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt  # what Python raises on SIGINT

  monkeypatch.setattr(translate, "translate_with_ids", interrupted)
  try:
    status = eval_py(f"--workdir={copy}", f"--split={SPLIT}")
  except KeyboardInterrupt:  # would end the whole pytest session
    pytest.fail("eval.py let the KeyboardInterrupt through")
  assert status == 130
  assert capsys.readouterr().err == (
      "eval.py: Interrupted (Ctrl-C) before the results were written: "
      "nothing was written.\n")
  assert not (copy / "eval").exists()  # no lock, folder or staging left


def test_read_only_workdir_without_output_dir_is_refused_before_decoding(
    copy, tmp_path, monkeypatch):
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  before = file_hashes(copy)
  with read_only(copy):
    with monkeypatch.context() as patch:
      patch.setattr(trained, "load_params", _no_reading)
      with pytest.raises(evaluator.EvalError) as refused:
        evaluator.evaluate(str(copy), split=SPLIT)
    # Elsewhere, it evaluates the read-only workdir.
    result = evaluator.evaluate(str(copy), split=SPLIT,
                                output_dir=str(tmp_path / "out"))
  reason = ("the file system is read-only" if os.geteuid() == 0
            else "permission denied")
  assert str(refused.value) == (
      f"Workdir {copy} cannot be written ({reason}: {copy}/eval): give "
      "output_dir=<a folder you can write> for the results.")
  assert result["output_dir"] == str(tmp_path / "out")
  assert file_hashes(copy) == before


def test_full_output_disk_is_refused_before_decoding(copy, tmp_path,
                                                     monkeypatch):
  monkeypatch.setattr(trained, "load_params", _no_reading)
  with small_disk(tmp_path / "disk", 1) as disk:
    (disk / "earlier").mkdir()
    _fill(disk, leave=0)
    with pytest.raises(evaluator.EvalError) as refused:
      evaluator.evaluate(str(copy), split=SPLIT,
                         output_dir=str(disk / "out"))
    assert sorted(p.name for p in disk.iterdir()) == ["earlier", "filler"]
  assert str(refused.value) == (
      f"output_dir={disk}/out cannot be written (the disk is full: "
      f"{disk}).")


# ------------------------------------------------------------ workdir paths


@pytest.mark.parametrize("name", ["run [x]", "run*", "a[b]/run", "run?"])
def test_workdir_paths_with_glob_characters_are_refused_at_start(
    tmp_path, name):
  workdir = tmp_path / name
  found = " ".join(sorted({c for c in name if c in "[]*?"}))
  message = (f"--workdir={workdir}: its path holds {found}, which the "
             "checkpoint library (Orbax) reads as a file pattern, so "
             "checkpoints written there could not be read back. Use a path "
             "without [ ] * ?.")
  with pytest.raises(errors.WorkdirError) as refused:
    trainer.train_and_evaluate(tiny_config(), str(workdir))
  assert str(refused.value) == message
  assert list(tmp_path.iterdir()) == []
  workdir.mkdir(parents=True)  # a workdir written before this check
  with pytest.raises(errors.WorkdirError) as refused:
    evaluator.evaluate(str(workdir), split=SPLIT)
  assert str(refused.value) == message


def test_workdir_paths_with_hash_and_percent_work_end_to_end(
    tiny_workdir, tmp_path, monkeypatch):
  # '#' and '%' are URL syntax, not file-name syntax: resumed, saved, read
  # back whole, averaged and evaluated.
  workdir = tmp_path / "run#3 %20b"
  shutil.copytree(tiny_workdir, workdir, ignore=shutil.ignore_patterns("eval"))
  assert checkpoints.check_step(str(workdir), 6) == 6
  result = trainer.train_and_evaluate(tiny_config(**RESUMED), str(workdir))
  assert result["step"] == 8
  assert checkpoints.check_step(str(workdir), 8) == 8
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  evaluated = evaluator.evaluate(str(workdir), split=SPLIT, average_last=2)
  assert evaluated["averaged_steps"] == [6, 8]
  assert (workdir / "eval" / "test_4_avg2_8" / "metrics.json").exists()


def test_a_workdir_inside_another_runs_workdir_is_refused(copy, tmp_path):
  # A symbolic link is followed to where the files would go.
  link = tmp_path / "link"
  link.symlink_to(copy / "checkpoints")
  before = file_hashes(tmp_path)
  for inside in (copy / "checkpoints", copy / "sub" / "run", link):
    with pytest.raises(errors.WorkdirError) as refused:
      trainer.train_and_evaluate(tiny_config(), str(inside))
    assert str(refused.value) == (
        f"--workdir={inside} lies inside {copy}, the workdir of another run "
        "(it holds config.json and its checkpoints or vocabulary): use a "
        "folder outside it.")
  # A folder that holds a run's workdir (`runs/` holding `runs/run`).
  with pytest.raises(errors.WorkdirError) as refused:
    trainer.train_and_evaluate(tiny_config(), str(tmp_path))
  assert str(refused.value) == (
      f"--workdir={tmp_path} holds {copy}, the workdir of another run: give "
      "that folder to resume it, or a new folder outside it.")
  assert file_hashes(tmp_path) == before


def test_full_output_disk_after_decoding_keeps_earlier_results(
    copy, tmp_path, monkeypatch):
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  with small_disk(tmp_path / "disk", 1) as disk:
    out = disk / "out"
    evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(out))
    kept = file_hashes(out)
    # One page free: the lock takes it, the results find none.
    _fill(disk, leave=4096)
    with pytest.raises(evaluator.EvalError) as refused:
      evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(out))
    assert file_hashes(out) == kept
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "out"]
  assert str(refused.value) == (
      f"The results could not be written into {out} (the disk is full); "
      "earlier results there are as they were: free space, or give another "
      "output_dir.")
