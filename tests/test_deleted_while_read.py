"""Readers beside a trainer that deletes checkpoints (issue 58, case 5).

A trainer keeping few checkpoints deletes a step while `mha.load`, eval.py
or `eval.py --follow` reads it. The deletion is injected at each point of
the read (the k-th file access of the reader, for every k), not left to
timing: every read ends with the step read whole or with the documented
`CheckpointNotFound` (a loader chooses its steps again, a follower skips the
step with one line), with no stack on stderr.

The stacks were `RuntimeError: Event loop is closed`, one per TensorStore
read still in flight when Orbax closed the event loop of a failed restore
(mha/runtime/event_loops.py).
"""
import asyncio
import contextlib
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest
import tensorstore as ts

from conftest import TINY_OVERRIDES, xla_flags
from mha.errors import DamagedCheckpointError
from mha.runtime import event_loops
from mha.evaluation import follow
from mha.store import trained

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# One read fails while another awaits TensorStore, in a loop run as Orbax's
# `asyncio_utils.run_sync` runs it (a new loop, `run_until_complete`,
# `close()`: nothing pending cancelled); then the read in flight completes.
_FAILED_READ = """
import asyncio, sys, threading
import tensorstore as ts
from mha.errors import DamagedCheckpointError
from mha.runtime import event_loops

promise, future = ts.Promise.new()

async def read():
  pending = asyncio.ensure_future(future)  # Orbax's gather of reads
  await asyncio.sleep(0)
  raise FileNotFoundError("checkpoints/2/state/manifest.ocdbt")

def run():
  loop = asyncio.new_event_loop()
  try:
    loop.run_until_complete(read())
  except FileNotFoundError:
    pass
  finally:
    loop.close()

if sys.argv[1] == "draining":
  with event_loops.draining():
    run()
else:
  run()
print("cancelled" if future.cancelled() else "in flight")
promise.set_result(1)
threading.Event().wait(0.2)  # TensorStore calls back on a thread of its own
"""


@pytest.mark.parametrize("mode", ["draining", "plain"])
def test_a_read_in_flight_when_its_loop_closes_is_cancelled_silently(mode):
  done = subprocess.run([sys.executable, "-c", _FAILED_READ, mode],
                        cwd=REPO, capture_output=True, text=True, check=True,
                        timeout=120)
  if mode == "draining":
    assert (done.stdout, done.stderr) == ("cancelled\n", "")
  else:  # what draining stops: a stack per read in flight, a lost task
    assert done.stdout == "in flight\n"
    assert "RuntimeError: Event loop is closed" in done.stderr
    assert "Task was destroyed but it is pending!" in done.stderr


def test_a_late_completion_after_a_drained_close_is_dropped():
  """A completion under way at the cancel, arriving after the close, is
  dropped (as `close()` drops those that arrive before it)."""
  loop = event_loops.DrainingEventLoop()
  task = loop.create_task(asyncio.sleep(10))
  loop.close()
  assert task.cancelled()
  assert loop.call_soon_threadsafe(print, "late") is None


def test_draining_changes_only_asyncios_default_policy_and_only_within():
  policy = asyncio.get_event_loop_policy()
  plain = policy.new_event_loop()
  with event_loops.draining():
    with event_loops.draining():  # nested: still draining after the inner
      pass
    inner = asyncio.new_event_loop()
  after = asyncio.new_event_loop()
  assert asyncio.get_event_loop_policy() is policy
  assert type(inner) is event_loops.DrainingEventLoop
  assert type(plain) is type(after) is not event_loops.DrainingEventLoop
  # A loop that closed with nothing pending keeps asyncio's rule.
  for loop in (inner, after, plain):
    loop.close()
  with pytest.raises(RuntimeError, match="Event loop is closed"):
    inner.call_soon_threadsafe(print)


# The deletion injected at the k-th file access of a reader under
# `checkpoints/`: Python's file accesses (audit events, in any thread) and
# the TensorStore stores Orbax opens (whose reads run in TensorStore's own
# threads). The audit hook cannot be removed: it is added once and does
# nothing while no injection is armed.
_ARMED = {}
_AUDITED = ("open", "os.listdir", "os.scandir")


def _access(what: tuple) -> None:
  injection = _ARMED.get("now")
  if injection is not None and not injection.running:
    injection.access(what)


def _audit(event, args):
  if event in _AUDITED and args and isinstance(args[0], (str, bytes)):
    path = os.fsdecode(args[0])
    injection = _ARMED.get("now")
    if injection is not None and path.startswith(injection.under):
      _access((event, os.path.relpath(path, injection.under)))


sys.addaudithook(_audit)


class Deletion:
  """`trainer()` run at the `at`-th access under `under` (None: never; the
  accesses are recorded in `seen`)."""

  def __init__(self, under: str, at: int | None, trainer):
    self.under, self.at, self.trainer = under, at, trainer
    self.seen, self.running = [], False

  def access(self, what: tuple) -> None:
    self.seen.append(what)
    if len(self.seen) == self.at:
      with self.untracked():
        self.trainer()

  @contextlib.contextmanager
  def untracked(self):
    """The trainer's own accesses are not counted."""
    self.running = True
    try:
      yield
    finally:
      self.running = False

  def __enter__(self):
    _ARMED["now"] = self
    return self

  def __exit__(self, *exc):
    _ARMED.pop("now")


@pytest.fixture
def stores(monkeypatch):
  """TensorStore's opens counted as accesses."""
  for owner, name in ((ts, "open"), (ts.KvStore, "open")):
    original = getattr(owner, name)

    def counted(*args, _original=original, _name=name, **kwargs):
      _access((f"tensorstore.{_name}",))
      return _original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def points(seen: list[tuple]) -> list[int]:
  """The k (1-based) of each distinct point of a read: every access whose
  kind differs from the one before or after it (a run of TensorStore
  opens of one phase is tried at its first and its last)."""
  kinds = [what[0] for what in seen]
  return [k + 1 for k in range(len(seen))
          if k in (0, len(seen) - 1) or kinds[k - 1] != kinds[k]
          or kinds[k + 1] != kinds[k]]


@pytest.fixture
def unraisable(monkeypatch):
  """The exceptions reported through `sys.unraisablehook` (TensorStore's
  callbacks report theirs so: a stack on stderr outside pytest)."""
  seen = []
  monkeypatch.setattr(sys, "unraisablehook",
                      lambda report: seen.append(repr(report.exc_value)))
  return seen


class KeepOne:
  """A workdir whose trainer saves every step and keeps one checkpoint:
  `copy` of tiny_workdir (checkpoints 2, 4, 6) with step 2 alone in
  checkpoints/, the others in `saved` until `save_next` saves one (put in
  place whole, as Orbax renames a finished step) and deletes the one
  before (Orbax's deletion, after the save)."""

  def __init__(self, workdir: pathlib.Path, saved: pathlib.Path):
    self.workdir, self.saved = workdir, saved
    self.checkpoints = workdir / "checkpoints"

  def reset(self) -> None:
    """Step 2 alone, nothing evaluated (no follower's record)."""
    shutil.rmtree(self.workdir / "eval", ignore_errors=True)
    shutil.rmtree(self.checkpoints)
    shutil.copytree(self.saved / "2", self.checkpoints / "2")

  def save_next(self, stalled: bool = False) -> None:
    """With `stalled`, the old step's files are deleted and its folders
    left for the rest of the read (Orbax deletes the files first, in
    threads, then the folders: a deleter stalled in between)."""
    (present,) = [int(n) for n in os.listdir(self.checkpoints)
                  if n.isdigit()]
    new = self.checkpoints / f"{present + 2}.orbax-checkpoint-tmp"
    shutil.copytree(self.saved / str(present + 2), new)
    new.rename(self.checkpoints / str(present + 2))
    old = self.checkpoints / str(present)
    if not stalled:
      shutil.rmtree(old)
      return
    for folder, _, names in os.walk(old):
      for name in names:
        os.remove(os.path.join(folder, name))


@pytest.fixture
def keep_one(copy, tmp_path) -> KeepOne:
  saved = tmp_path / "saved"
  shutil.copytree(copy / "checkpoints", saved)
  for step in ("4", "6"):
    shutil.rmtree(copy / "checkpoints" / step)
  return KeepOne(copy, saved)


def _tree_equal(a, b) -> bool:
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  return tree_a == tree_b and all(
      np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b))


@pytest.mark.parametrize("stalled", [False, True])
def test_a_loader_reads_a_whole_step_wherever_the_deletion_falls(
    keep_one, tiny_workdir, stores, unraisable, capfd, caplog, stalled):
  """`trained.load_params` (mha.load's, eval.py's read) with step 2 deleted
  (step 4 saved first) at each point of its read, whole or (`stalled`) its
  files only: it returns step 4, read whole, having chosen its steps again
  (the documented warning) when it had chosen step 2; never an error,
  never a stack; the same run after run."""
  reference = {s: trained.load_params(str(tiny_workdir), s)[0]
               for s in (2, 4)}

  def load(at):
    keep_one.reset()
    caplog.clear()
    with caplog.at_level(logging.WARNING), Deletion(
        str(keep_one.checkpoints), at,
        lambda: keep_one.save_next(stalled)) as deletion:
      params, step, steps = trained.load_params(str(keep_one.workdir))
    assert steps == [step] and _tree_equal(params, reference[step]), at
    warned = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and r.name == "absl"
              and "Attempt" in r.getMessage()]
    return step, warned, deletion.seen

  step, warned, seen = load(None)
  assert step == 2 and not warned
  outcomes = [load(k)[:2] for k in points(seen)]
  assert len(outcomes) >= 8
  for (step, warned), k in zip(outcomes, points(seen)):
    assert step == 4, k
    assert all(w.startswith("Attempt 1 of 3: Checkpoint ") and (
        "was deleted while it was read" in w
        or "is damaged: " in w and "The checkpoints changed meanwhile (a "
        "trainer saving and deleting): choosing the steps again." in w)
               for w in warned), (k, warned)
  assert [load(k)[:2] for k in points(seen)[::3]] == outcomes[::3]
  assert unraisable == [] and "Traceback" not in capfd.readouterr().err


def test_an_older_step_deleted_under_orbaxs_listing_is_not_an_error(
    copy, tiny_workdir, monkeypatch, unraisable, capfd, caplog):
  """The trainer deletes step 2 after Orbax's reader has listed the step
  folders (2 and 4) and found step 2 whole, before it reads its time (CI, 2026-11-29: an
  `os.stat` of the deleted folder raised `FileNotFoundError` from the
  reader's constructor and stopped eval.py --follow): reading step 4 is
  not disturbed by a step it does not read."""
  from orbax.checkpoint._src.path import step as orbax_step
  shutil.rmtree(copy / "checkpoints" / "6")
  original = orbax_step.build_step_metadatas
  deleted = []

  def listed_then_deleted(step_paths, build_metadata):
    def build(path):
      metadata = build_metadata(path)
      if path.name == "2" and not deleted:
        shutil.rmtree(path)
        deleted.append(2)
      return metadata
    return original(step_paths, build)

  monkeypatch.setattr(orbax_step, "build_step_metadatas", listed_then_deleted)
  with caplog.at_level(logging.WARNING):
    params, step, steps = trained.load_params(str(copy))
  assert deleted == [2] and (step, steps) == (4, [4])
  # Read at the first attempt: the reader does not look into other steps.
  assert not [r for r in caplog.records if "Attempt" in r.getMessage()]
  assert _tree_equal(params, trained.load_params(str(tiny_workdir), 4)[0])
  assert unraisable == [] and "Traceback" not in capfd.readouterr().err


def test_a_missing_file_of_any_deleted_step_means_deleted_not_a_bug(copy):
  """`read_errors` maps a `FileNotFoundError` naming a file of a step
  folder that is gone, read or not, to `CheckpointNotFound`; one naming a
  file of a step still there, or outside the checkpoints, propagates."""
  from mha.errors import CheckpointNotFound
  from mha.store.checkpoint_checks import read_errors
  directory = copy / "checkpoints"
  shutil.rmtree(directory / "2")
  gone = FileNotFoundError(2, "No such file", str(directory / "2" / "meta"))
  with pytest.raises(CheckpointNotFound, match=r"checkpoints/2 was deleted"):
    with read_errors(str(directory), [4], ("state",), "eval"):
      raise gone
  for name in (directory / "6" / "nothing", copy / "nothing"):
    with pytest.raises(FileNotFoundError):
      with read_errors(str(directory), [4], ("state",), "eval",
                       verified=False):
        raise FileNotFoundError(2, "No such file", str(name))


@pytest.mark.parametrize("stalled", [False, True])
def test_a_follower_skips_a_step_deleted_at_any_point_of_its_read(
    keep_one, stores, unraisable, capfd, caplog, stalled):
  """eval.py --follow beside the same trainer, step 2 deleted (step 4
  saved) at each point of the follower's read of it, step 6 saved at its
  next poll: step 2 is evaluated or skipped with the documented line, 4
  and 6 are evaluated; no error, no stack; the same run after run."""
  checkpoints = str(keep_one.checkpoints)

  def trainer():
    keep_one.save_next(stalled)

  def run(at):
    keep_one.reset()
    caplog.clear()
    ends = []

    def sleep(seconds):
      del seconds
      with deletion.untracked():
        for step in keep_one.checkpoints.iterdir():  # stalled ones end
          if not any(p.is_file() for p in step.rglob("*")):
            shutil.rmtree(step)
        if not (keep_one.checkpoints / "6").exists():
          keep_one.save_next()

    with caplog.at_level(logging.INFO), Deletion(
        checkpoints, at, trainer) as deletion:
      results = follow.follow(
          str(keep_one.workdir), split="test[:4]", timeout_seconds=0,
          report=lambda r: ends.append(len(deletion.seen)), sleep=sleep)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "absl" and r.pathname.endswith("follow.py")
             and r.getMessage().startswith("Step ")]
    return [r["checkpoint_step"] for r in results], lines, (
        deletion.seen[:ends[0]] if ends else [])

  evaluated, lines, seen = run(None)  # the accesses of step 2's evaluation
  assert evaluated == [2, 4, 6] and lines == []
  ks = [k for k in points(seen) if k == 1 or seen[k - 2][0] != seen[k - 1][0]]
  outcomes = [run(k)[:2] for k in ks]
  assert len(outcomes) >= 6
  for (evaluated, lines), k in zip(outcomes, ks):
    assert evaluated == [4, 6], k
    if stalled:  # its empty folders listed: found damaged, tried again
      assert lines[0].startswith(
          "Step 2 (test_4) cannot be read now: tried again after the next "
          "poll (a trainer deletes a step's files before its folder)."), k
      lines = lines[1:]
    elif k == 1:  # deleted before the first listing: never seen
      assert lines == []
      continue
    assert len(lines) == 1 and (lines[0].startswith(
        "Step 2 (test_4) was deleted while it was read (the trainer keeps "
        "the last keep_checkpoints): skipped.") or lines[0] == (
            "Step 2: deleted before its turn, not evaluated (test_4).")), (
                k, lines)
  assert [run(k)[:2] for k in ks[::3]] == outcomes[::3]
  assert unraisable == [] and "Traceback" not in capfd.readouterr().err


@pytest.mark.slow
def test_a_real_follower_beside_a_real_trainer_keeping_one_checkpoint(
    tiny_workdir, tmp_path):
  """train.py saving every step and keeping one checkpoint, eval.py
  --follow beside it, each in a process of its own: both end with status
  0; every step the follower saw is evaluated or skipped with the
  documented line, the last one evaluated; no stack in either log."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  shutil.copy(tiny_workdir / "spm.model", workdir / "spm.model")
  shutil.copytree(tiny_workdir / "tokenized", workdir / "tokenized")
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(2))
  changes = dict(TINY_OVERRIDES, num_train_steps=8, checkpoint_every_steps=1,
                 keep_checkpoints=1, eval_every_steps=100000, num_layers=1)
  trainer = subprocess.Popen(
      [sys.executable, "train.py", f"--workdir={workdir}",
       "--config=configs/quickstart.py:tiny"] + [
           f"--config.{k}={v}" for k, v in changes.items()],
      cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      text=True)
  try:
    while not (workdir / "config.json").exists() and trainer.poll() is None:
      threading.Event().wait(0.05)
    follower = subprocess.run(
        [sys.executable, "eval.py", f"--workdir={workdir}", "--follow",
         "--split=test[:4]", "--follow_interval=0.05",
         "--follow_timeout=600"], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=900)
    trained_log = trainer.communicate(timeout=900)[1]
  finally:
    trainer.kill()
  assert trainer.returncode == 0, trained_log[-3000:]
  assert follower.returncode == 0, follower.stderr[-3000:]
  for log in (trained_log, follower.stderr):
    assert "Traceback" not in log and "Event loop is closed" not in log
  record = json.loads((workdir / "eval" / "follow_test_4.json").read_text())
  seen = record["evaluated"]["test_4"]
  evaluated = sorted(int(p.name.rsplit("_", 1)[1])
                     for p in (workdir / "eval").glob("test_4_*"))
  skipped = sorted(int(line.split()[1]) for line in
                   follower.stderr.splitlines() if "] Step " in line
                   for line in [line.split("] ", 1)[1]])
  assert seen == sorted(evaluated + skipped) and seen[-1] == 8 == evaluated[-1]
  for line in follower.stderr.splitlines():
    if "] Step " in line:
      assert ("was deleted while it was read (the trainer keeps the last "
              "keep_checkpoints): skipped." in line
              or "deleted before its turn, not evaluated" in line), line


def test_a_follower_stops_on_a_step_still_damaged_after_a_poll(keep_one,
                                                               caplog):
  """A damaged step that no trainer deletes: tried again after one poll,
  then the error naming it (eval.py's one line, status 1)."""
  keep_one.reset()
  (keep_one.checkpoints / "2" / "state" / "_METADATA").unlink()
  sleeps = []

  def sleep(seconds):
    sleeps.append(seconds)
    assert len(sleeps) < 5, "still polling a damaged step"

  with caplog.at_level(logging.INFO), pytest.raises(
      DamagedCheckpointError, match="checkpoints/2 is damaged: "
      "state/_METADATA is missing"):
    follow.follow(str(keep_one.workdir), split="test[:4]", timeout_seconds=0,
                  sleep=sleep)
  assert len(sleeps) == 1
  assert [r.getMessage()[:39] for r in caplog.records
          if r.getMessage().startswith("Step ")] == [
              "Step 2 (test_4) cannot be read now: tri"]
