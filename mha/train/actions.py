"""The training loop's periodic actions, each a small object it calls.

* `MetricsWindow`: fetches each update's metrics (a non-finite loss stops
  the run), writes their means every `config.log_every_steps`.
* `Saver`: an asynchronous checkpoint save with the data position reached.
* `Profiler`: a `jax.profiler` trace of `config.profile_steps`.
* `StopSignal`: SIGTERM and Ctrl-C ask for a save and a stop at the next
  step boundary.
* `write_hparams`: the resolved config as TensorBoard hparams.
"""
import contextlib
import dataclasses
import signal
import time
from typing import Any, Iterator

from absl import logging
import jax
import ml_collections
import numpy as np

from mha.store import checkpoints
from mha.store import failed_saves
from mha.train import devices
from mha.store import metrics as metrics_lib
from mha.store import workdir as workdir_lib
from mha.errors import TrainingDiverged


class StopSignal:
  """Records SIGTERM (preemption) and SIGINT (Ctrl-C) so that the loop can
  save and stop at the next step boundary.

  Attributes:
    received: a signal asked the run to stop.
    interrupted: that signal was the user's Ctrl-C (the run then raises
      `Interrupted` once saved); a second Ctrl-C stops at once, without
      saving (KeyboardInterrupt).
  """

  def __init__(self):
    self.received = False
    self.interrupted = False
    self._previous = {}

  def __enter__(self):
    for signum in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # not the main thread: no signal handling
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT:
      if self.interrupted:
        raise KeyboardInterrupt
      self.interrupted = True
      logging.warning("Ctrl-C: saving a checkpoint at the next step "
                      "boundary (Ctrl-C again stops without saving).")
    else:
      logging.warning("SIGTERM: saving a checkpoint at the next step "
                      "boundary.")
    self.received = True

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}


@dataclasses.dataclass
class Saver:
  """Saving: a checkpoint with the data position it has reached.

  Asynchronous: training goes on while Orbax writes the step's files in the
  background; the next save waits for that write first, and so does the end
  of the run (`finish`). A save the machine refuses (a full disk, a
  read-only folder) raises `checkpoints.CheckpointSaveError` naming the
  step and the last good checkpoint, once Orbax's threads are ended.

  Attributes:
    manager: the run's Orbax CheckpointManager.
    start_step: the run's first step (0, or the checkpoint it resumed).
    start_position: micro-batches read before `start_step`.
    grad_accum_steps: micro-batches per update.
    pending: the step being written in the background.
  """
  manager: Any
  start_step: int
  start_position: int
  grad_accum_steps: int
  pending: int | None = None

  def __call__(self, step: int, state, scheduled: bool = True) -> float:
    """Starts saving the replicated `state` of `step`; `scheduled=False`
    for a save because the run stops (kept only while it is the latest:
    `checkpoints.LatestScheduled`).

    Returns:
      The seconds training paused: waiting for the previous save's write,
      then Orbax's copy of the arrays to the host.
    """
    begin = time.perf_counter()
    self._wait()
    waited = time.perf_counter() - begin
    accum = self.grad_accum_steps
    position = self.start_position + (step - self.start_step) * accum
    self.pending = step
    with self._failures():
      checkpoints.save(self.manager, step, devices.checkpoint_arrays(state),
                       {"step": step, "data_position": position,
                        "grad_accum_steps": accum,
                        checkpoints.SCHEDULED: scheduled},
                       force=True, wait=False)
    paused = time.perf_counter() - begin
    logging.info("Saving checkpoint %d in the background: training paused "
                 "%.2f s (%.2f s of it for the previous save's write).",
                 step, paused, waited)
    return paused

  def finish(self) -> None:
    """Waits for the last save's write (before the run returns or raises)."""
    begin = time.perf_counter()
    self._wait()
    logging.info("Checkpoints written (%.2f s waited at the end).",
                 time.perf_counter() - begin)

  def _wait(self) -> None:
    with self._failures():
      self.manager.wait_until_finished()
    self.pending = None

  @contextlib.contextmanager
  def _failures(self) -> Iterator[None]:
    """A failed save of `pending` as a CheckpointSaveError (or, if not the
    machine's, as it was), with Orbax's waiting threads ended either way."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      step, self.pending = self.pending, None
      if step is None:
        raise
      error = failed_saves.save_failure(self.manager, step, e)
      if error is None:
        raise
      raise error from None


def check_finite(step: int, metrics: dict[str, float]) -> None:
  """Stops the run on a non-finite loss.

  Raises:
    TrainingDiverged: naming the step.
  """
  if not np.isfinite(metrics["loss"]):
    raise TrainingDiverged(
        f"Training loss is {metrics['loss']} at step {step}; stopping.")


class MetricsWindow:
  """The updates since the last logged step.

  Each update's metrics are fetched (a non-finite loss raises
  TrainingDiverged), and at every `log_every_steps`-th step (and the last)
  their means, the perplexity and the token and step rates are written.

  Attributes:
    last: the last written summary and evaluation metrics.
    stop: some process asked to stop (SIGTERM or Ctrl-C) in an update
      fetched so far.
  """

  def __init__(self, config: ml_collections.ConfigDict,
               writer: metrics_lib.MetricsWriter,
               progress: metrics_lib.Progress):
    self.last: dict[str, float] = {}
    self.stop = False
    self._config = config
    self._writer = writer
    self._progress = progress
    self._window: list[dict[str, float]] = []
    self._start = time.perf_counter()

  def add(self, step: int, device_metrics) -> None:
    """Fetches the metrics of the update that made `step`."""
    m = {k: float(v)
         for k, v in devices.pmap_unreplicate(device_metrics).items()}
    check_finite(step, m)
    self.stop = self.stop or m.pop("stop") > 0
    self._window.append(m)
    if (step % self._config.log_every_steps == 0 or
        step == self._config.num_train_steps):
      self._log(step)

  def saved(self) -> None:
    """The run has started saving a checkpoint: from now on a failure
    keeps what it wrote, so its metrics lines need not be remembered."""
    self._writer.forget_lines()

  def _log(self, step: int) -> None:
    window = self._window
    elapsed = max(time.perf_counter() - self._start, 1e-9)
    summary = {k: float(np.mean([w[k] for w in window]))
               for k in ("loss", "nll", "accuracy", "learning_rate",
                         "grad_norm")}
    summary["tokens_per_sec"] = sum(w["tokens"] for w in window) / elapsed
    # Real (non-padding) tokens per update and side, what the paper's
    # "25000 source and 25000 target tokens" per batch count.
    summary["target_tokens_per_update"] = float(np.mean(
        [w["target_tokens"] for w in window]))
    summary["source_tokens_per_update"] = float(np.mean(
        [w["tokens"] - w["target_tokens"] for w in window]))
    summary["steps_per_sec"] = len(window) / elapsed
    summary["perplexity"] = float(np.exp(summary["nll"]))
    self.write(step, summary)
    self._progress.report(step, summary["loss"])
    self._window, self._start = [], time.perf_counter()

  def write(self, step: int, metrics: dict[str, float]) -> None:
    """Writes `metrics` (a summary or an evaluation) and keeps them."""
    self._writer.write(step, metrics)
    self.last.update(metrics)


def write_hparams(config: ml_collections.ConfigDict,
                  writer: metrics_lib.MetricsWriter) -> None:
  """The resolved config as TensorBoard hparams (its HParams tab), in the
  run's event file (`writer`'s; process 0 only). Nested fields are
  flattened ('a.b'); values that are not numbers, strings or booleans
  (tuples, None) are written as their text."""
  writer.write_hparams(
      {k: v if isinstance(v, (bool, int, float, str)) else str(v)
       for k, v in _flat(config.to_dict()).items()})


def _flat(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


class Profiler:
  """`config.profile_steps = (first, count)`: a `jax.profiler` trace of the
  `count` updates from the one that makes step `first`, on process 0, into
  `<workdir>/plugins/profile/<time>/` (JAX makes the `<time>` folder under
  `Workdir.profile_path`; TensorBoard's Profile tab reads it beside the
  scalars). Off when empty, when the count is 0, or when the run starts
  past `first`.
  """

  def __init__(self, config: ml_collections.ConfigDict,
               folder: workdir_lib.Workdir):
    first, count = tuple(config.get("profile_steps") or ()) or (0, 0)
    on = count > 0 and jax.process_index() == 0
    self._first, self._last = (first, first + count - 1) if on else (0, -1)
    self._folder = folder
    self._tracing = False

  def before_update(self, step: int) -> None:
    """Called before the update that makes `step` is dispatched."""
    if step == self._first:
      logging.info("Profiling steps %d to %d into %s.", self._first,
                   self._last, self._folder.profile_path)
      # The workdir is the trace's logdir: jax writes plugins/profile/ in it.
      jax.profiler.start_trace(self._folder.path)
      self._tracing = True

  def after_update(self, step: int, state) -> None:
    """Called once the update that made `step` is dispatched."""
    if self._tracing and step >= self._last:
      jax.block_until_ready(state)
      self.close()

  def close(self) -> None:
    """Ends the trace if it runs (also when the loop stops early)."""
    if self._tracing:
      self._tracing = False
      jax.profiler.stop_trace()
      logging.info("Profile written into %s.", self._folder.profile_path)
