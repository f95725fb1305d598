"""Training loop: `train_and_evaluate(config, workdir)`.

Read top to bottom: the inputs are checked and loaded before anything is
written (`train_setup.check_inputs`), and a finished run stops there; under
the workdir's lock the set-up (`train_setup.set_up`) builds the
vocabulary, models, optimizer and the in-training evaluations, resumes the
latest checkpoint or starts at step 0, and hands over the loop's parts
(`train_setup.Loop`); then `_loop` runs the `pmap`ped update
(`train_step.CompiledUpdate`) and its periodic actions (`train_actions`):
log the metrics, save, evaluate, profile, stop on a signal.

A run resumes exactly from the workdir's latest checkpoint: the step,
parameters, optimizer state and RNG are restored, and the input pipeline
restarts at the saved position. Checkpoints are saved asynchronously
(`train_actions.Saver`): training goes on while Orbax writes a step, and
waits for that write at the next save and at the end. Evaluations are
plug-ins (`Evaluation`): the loop runs those the set-up hands over
(`train_evals.from_config`) and imports none. Evaluation and save times,
the config as TensorBoard hparams and an optional `jax.profiler` trace
(`config.profile_steps`) are written into the workdir.
"""
import contextlib
import errno
import time
from typing import Iterator, Protocol

from absl import logging
import jax
import ml_collections
import numpy as np

from mha import errors
from mha.runtime import host_memory
from mha.store import failed_saves
from mha.store import workdir as workdir_lib
from mha.train import setup as train_setup
from mha.train.actions import MetricsWindow
from mha.train.actions import Profiler
from mha.train.actions import Saver
from mha.train.actions import StopSignal
from mha.train.step import CompiledUpdate
from mha.train.step import State

# The errnos of a write the machine refuses: the run stops with one line.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
               errno.EPERM)


class Evaluation(Protocol):
  """An evaluation during training, handed to the loop (`mha.train.evals`).

  The loop calls it at the steps it is `due`, with the parameters
  replicated over the local devices, and writes the metrics of all the
  evaluations due at a step as one record (with `eval_seconds`).
  """

  def due(self, step: int) -> bool:
    ...

  def __call__(self, params) -> dict[str, float]:
    ...


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, float]:
  """Trains `config` in `workdir`, resuming from its latest checkpoint.

  Every input is checked first (`train_setup.check_inputs`); only then is
  the workdir created, locked (`<workdir>/lock`, one run per workdir) and
  written. A SIGTERM (preemption) makes the run save a checkpoint at the
  next step boundary and return; a Ctrl-C (SIGINT) too, and then it raises
  `Interrupted` (a second Ctrl-C raises it at once, without saving). Either
  signal during the set-up, before the loop, leaves the workdir as it was
  (a SIGTERM raises `Terminated`, a Ctrl-C `Interrupted`). A non-finite
  loss raises TrainingDiverged naming the step; checkpoints saved before
  it are left as they are, and a run that saved none leaves the workdir as
  it was (config.json, metrics.jsonl, no files of its own). A write the
  machine refuses (a full disk, a read-only folder) raises a DiskError
  naming the file or checkpoint and the last good checkpoint, with Orbax's
  threads ended.

  Returns:
    The metrics of the last logged step and evaluation, and `step`.

  Raises:
    UserError: bad input (nothing written), another run holding the
      workdir, a diverged run, a refused write (DiskError), a Ctrl-C
      (Interrupted).
  """
  folder = workdir_lib.Workdir(workdir)
  inputs = train_setup.check_inputs(config, folder)
  if inputs.finished:
    # Nothing is restored, locked or written (not even an event file of
    # this process).
    return {"step": inputs.latest}
  try:
    with train_setup.workdir_lock(folder), _disk_errors(folder):
      return _train(config, folder, inputs)
  except KeyboardInterrupt:
    # A Ctrl-C outside the loop (set-up, compilation) or a second one in it.
    last = failed_saves.latest_step_or_none(folder.checkpoints_path)
    raise errors.Interrupted(
        "Interrupted (Ctrl-C) without saving: " +
        (f"the last checkpoint is step {last}; run train.py again to resume "
         "from it." if last is not None else "no checkpoint was written.")
    ) from None


def _train(config: ml_collections.ConfigDict, folder: workdir_lib.Workdir,
           inputs: train_setup.Inputs) -> dict[str, float]:
  """The run itself, under the workdir's lock: set-up, then the loop.

  A loss that diverges before the run saves a checkpoint leaves the workdir
  as it was (as a set-up that fails does: `train_setup.set_up`).
  """
  run = train_setup.set_up(config, folder, inputs)
  stop_signal = StopSignal()
  diverged = None
  with failed_saves.quiet_save_errors():
    try:
      step = _loop(config, run.state, run.step, run.batches, run.update,
                   run.window, run.saver, run.evaluations, run.profiler,
                   stop_signal)
    except errors.TrainingDiverged as e:
      if run.saver.pending is not None:  # a checkpoint of this run: kept
        raise errors.TrainingDiverged(
            f"{e} The checkpoints saved before this step are intact."
        ) from None
      diverged = e
    finally:
      # Also when the loop raises (a diverged run): the checkpoint being
      # written is completed before the workdir's lock is released.
      try:
        run.saver.finish()
      finally:
        run.manager.close()
  if diverged is not None:
    run.writer.close()
    if run.before is not None:
      run.before.restore(run.writer.lines)
    raise errors.TrainingDiverged(
        f"{diverged} This run saved no checkpoint: the workdir is left as "
        "it was before it.") from None
  run.writer.flush()
  if stop_signal.interrupted:
    raise errors.Interrupted(
        f"Interrupted (Ctrl-C): saved checkpoint {step} in "
        f"{folder.checkpoints_path}; run train.py again to resume from it.")
  return dict(run.window.last, step=step)


def _loop(config: ml_collections.ConfigDict, state: State, step: int,
          batches: Iterator, update: CompiledUpdate, window: MetricsWindow,
          save: Saver, evaluations: list[Evaluation], profiler: Profiler,
          stop_signal: StopSignal) -> int:
  """Updates from `step` to num_train_steps; returns the last step.

  Preemption: a SIGTERM (or Ctrl-C) on any process sets the stop flag of
  the next update; once fetched, the run saves that step and returns.

  After the first update and after each evaluation (the compilations) the
  heaps' free pages go back to the kernel (`host_memory.release_free_heap`),
  so that they do not add to every later step's peak resident memory.
  """
  num_devices = jax.local_device_count()
  pending = None  # (step, device metrics) of the update in flight
  compiled = False
  with stop_signal as sigterm, contextlib.closing(profiler):
    while step < config.num_train_steps:
      micro = [next(batches) for _ in range(config.grad_accum_steps)]
      stop = np.full((num_devices,), int(sigterm.received), np.int32)
      profiler.before_update(step + 1)
      state, device_metrics = update(state, micro, stop)
      if not compiled:
        host_memory.release_free_heap()
        compiled = True
      if pending is not None:
        window.add(*pending)  # overlaps with the update just dispatched
      step += 1
      profiler.after_update(step, state)
      pending = (step, device_metrics)
      need_save = (step % config.checkpoint_every_steps == 0 or
                   step == config.num_train_steps)
      due = [evaluation for evaluation in evaluations if evaluation.due(step)]
      if need_save or due or window.stop:
        window.add(*pending)
        pending = None
      if need_save or window.stop:
        window.write(step, {"save_seconds": save(step, state, need_save)})
        window.saved()
      if due:
        window.write(step, _evaluate(due, state["params"]))
      if window.stop:
        logging.warning("%s: saved step %d; exiting.", "Interrupted" if
                        sigterm.interrupted else "Preempted", step)
        break
  return step


def _evaluate(evaluations: list[Evaluation], params) -> dict[str, float]:
  """The metrics of `evaluations` in turn, and the seconds they took; then
  the heaps' free pages (of their compilations) go back to the kernel."""
  begin = time.perf_counter()
  metrics = {}
  for evaluation in evaluations:
    metrics.update(evaluation(params))
  metrics["eval_seconds"] = time.perf_counter() - begin
  host_memory.release_free_heap()
  return metrics


@contextlib.contextmanager
def _disk_errors(folder: workdir_lib.Workdir) -> Iterator[None]:
  """A file of the run that the machine refuses to write (metrics.jsonl or
  an event file on a full disk, a read-only folder) as a DiskError naming
  the file and the checkpoint to resume from; other OSErrors as they are."""
  try:
    yield
  except OSError as e:
    code = errors.os_errno(e)
    if code not in DISK_ERRNOS:
      raise
    last = failed_saves.latest_step_or_none(folder.checkpoints_path)
    where = e.filename or folder.path
    raise errors.DiskError(
        f"{where} could not be written: {errors.os_reason(e)}. Training "
        f"stopped; {failed_saves.resume_advice(folder.path, last, code)}."
    ) from None
