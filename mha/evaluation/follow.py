"""Evaluation beside training: `eval.py --follow`.

    from mha.evaluation import follow
    follow.follow("/tmp/run", split="validation", average_last=5)

Watches a training workdir (local or gs://) and evaluates each new
checkpoint as it appears with `evaluator.evaluate` (each leaves its usual
`eval/<split>_<step>/` folder): the checkpoint alone and, with
`average_last=N`, the average of the last N checkpoints up to it. The
scores go into the run's metrics beside the trainer's
(`metrics.MetricsWriter`: an event file of its own in the workdir for
TensorBoard, and lines of `metrics.jsonl`), at the checkpoint's step, under
tags named by what was evaluated: `<name>/<metric>` for each metric of the
table computed (`mha.scoring.metric_table`: `<name>/bleu`, `<name>/chrf`,
and `<name>/bleu_paper` with `paper_bleu`), `<name>` being the split
(`test`, `validation`), `<split>_avg<N>` for averages, followed by the
search settings that differ from the config's (`test_beam8`). The
trainer's own tags (`eval_bleu`, `eval_chrf`, ...) have no '/'.

It reads the workdir as eval.py does and never takes the trainer's `lock`.
The trainer deletes old checkpoints (`keep_checkpoints`): a step deleted
before or while it is read is skipped with one log line; one found
damaged is tried again after the next poll (the trainer deletes a step's
files before its folders), skipped if gone by then. Steps are
evaluated oldest first, one at a time, the checkpoint folder listed again
after each, so a follower slower than the trainer's saves skips the steps
deleted before their turn.

What has been evaluated (or skipped) is recorded in
`eval/follow_<split><settings>.json` once its metrics are written, so a
follower started again evaluates no step twice. One follower per workdir,
split and settings: it holds the lock `eval/.follow_<split><settings>.lock`
(`eval_output`'s lock), and a second one is refused with one line.

The follower lists the checkpoint folder every `poll_seconds` (the state of
the files, nothing else) and stops once the run's last step
(`num_train_steps` in config.json, read again then) has been evaluated, or
after `timeout_seconds` without a new checkpoint.
"""
import dataclasses
import json
import os
import time
from typing import Any, Callable

from absl import logging

from mha.store import checkpoints
from mha.evaluation import output as eval_output
from mha.evaluation import evaluator
from mha.store import trained
from mha.runtime import files
from mha.scoring import metric_table
from mha.store import metrics as metrics_lib
from mha import validation
from mha.store import workdir as workdir_lib
from mha.errors import CheckpointError
from mha.errors import DamagedCheckpointError
from mha.errors import UserError
from mha.evaluation.output import EvalError
from mha.search.settings import SearchSettings

RECORD_PREFIX = "follow_"


class FollowLock(eval_output.OutputLock):
  """`eval/.follow_<split><settings>.lock`: one follower of a workdir with
  the same split and settings at a time."""

  def busy(self, holder: dict, same_host: bool) -> UserError:
    where = "" if same_host else f" on host {holder.get('host')}"
    gone = "" if same_host else f"; if it is gone, delete {self.path}"
    return EvalError(
        f"Another eval.py --follow (process {holder.get('pid')}{where}, "
        f"started {holder.get('started')}) follows this workdir with the "
        f"same split and settings (lock {self.path}): stop it, or follow "
        f"with other settings{gone}.")


@dataclasses.dataclass
class Record:
  """The steps a follower has evaluated (or skipped), per evaluation name.

  Attributes:
    path: the JSON file (`{"evaluated": {name: [steps]}}`), local or gs://.
    done: name -> the steps done.
  """
  path: str
  done: dict[str, list[int]]

  @classmethod
  def load(cls, path: str) -> "Record":
    """The record at `path`; empty if there is none.

    Raises:
      EvalError: the file is not a follower's record (naming it).
    """
    if not files.exists(path):
      return cls(path, {})
    try:
      done = json.loads(files.read_bytes(path))["evaluated"]
      done = {str(k): [int(s) for s in v] for k, v in done.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise EvalError(f"{path} is not the record of eval.py --follow ({e}): "
                      "delete it to evaluate every checkpoint again.") from None
    return cls(path, done)

  def has(self, name: str, step: int) -> bool:
    return step in self.done.get(name, ())

  def add(self, name: str, step: int) -> None:
    """Adds a step and rewrites the file (whole: an atomic replace)."""
    self.done.setdefault(name, []).append(int(step))
    self.done[name].sort()
    files.write_bytes_atomic(self.path, (json.dumps(
        {"evaluated": self.done}, indent=1, sort_keys=True) + "\n").encode())


def names(config: Any, split: str | None, average_last: int | None,
          **given: Any) -> tuple[str, str | None]:
  """(name of each checkpoint's scores, name of the averages' or None).

  `given`: the search settings given (`SearchSettings` fields; None = the
  config's). The first name is the split's file name followed by the
  settings that differ from the config's (`SearchSettings.suffix`):
  `test`, `test_beam8_alpha1.0`; the second puts `_avg<N>` after the
  split's name. It also names the follower's record and lock.
  """
  split_name = files.safe_name(split or config.test_split).strip("_")
  split_name = split_name or "split"
  defaults = SearchSettings.of_config(config)
  suffix = defaults.given(**given).suffix(defaults)
  average = (f"{split_name}_avg{average_last}{suffix}"
             if average_last and average_last > 1 else None)
  return split_name + suffix, average


def _readable(workdir: str, step: int, count: int) -> bool:
  """Whether `step` and `count - 1` earlier checkpoints are there now."""
  try:
    checkpoints.resolve_steps(workdir, step, count)
  except CheckpointError:
    return False
  return True


def _present(workdir: str) -> list[int]:
  """The checkpoint steps there now, ascending ([] before the first)."""
  try:
    return sorted(checkpoints.all_steps(workdir))
  except FileNotFoundError:
    return []


@dataclasses.dataclass
class _Follower:
  """One follower's state: what it evaluates and where it writes."""
  workdir: str
  options: dict[str, Any]  # evaluator.evaluate's keyword arguments
  evaluations: list[tuple[str, int | None]]  # (name, average_last)
  record: Record
  report: Callable[[dict[str, Any]], None] | None
  writer: metrics_lib.MetricsWriter | None = None
  # (step, name) found damaged once: tried again after the next poll (a
  # trainer deletes a step's files before its folders); `held`: not polled
  # since.
  retried: set[tuple[int, str]] = dataclasses.field(default_factory=set)
  held: set[tuple[int, str]] = dataclasses.field(default_factory=set)

  def pending(self, step: int) -> list[tuple[str, int | None]]:
    return [(name, n) for name, n in self.evaluations
            if not self.record.has(name, step)]

  def todo(self, steps: list[int]) -> list[tuple[int, tuple[str, int | None]]]:
    """What to evaluate now, oldest first: the pending evaluations of the
    steps present, but those held until the next poll, and of the steps
    tried again that are gone now (skipped, with their line)."""
    gone = {s for s, _ in self.retried} - set(steps)
    return [(s, e) for s in sorted(set(steps) | gone) for e in self.pending(s)
            if (s, e[0]) not in self.held
            and (s in steps or (s, e[0]) in self.retried)]

  def evaluate(self, step: int, name: str, average_last: int | None
               ) -> dict[str, Any] | None:
    """Evaluates `step` (or the average up to it) and writes its scores;
    None if its checkpoints are gone (or too few for the average)."""
    count = average_last or 1
    result = None
    if not _readable(self.workdir, step, count):
      logging.info("Step %d: %s, not evaluated (%s).", step,
                   "fewer than %d checkpoints up to it" % count
                   if count > 1 else "deleted before its turn", name)
    else:
      try:
        result = evaluator.evaluate(self.workdir, checkpoint_step=step,
                                    average_last=average_last,
                                    **self.options)
      except (CheckpointError, EvalError) as e:
        if _readable(self.workdir, step, count):
          if (not isinstance(e, DamagedCheckpointError)
              or (step, name) in self.retried):
            raise  # not a deletion: bad input or a damaged checkpoint
          self.retried.add((step, name))
          self.held.add((step, name))
          logging.info("Step %d (%s) cannot be read now: tried again after "
                       "the next poll (a trainer deletes a step's files "
                       "before its folder). (%s)", step, name, e)
          return None
        logging.warning("Step %d (%s) was deleted while it was read (the "
                        "trainer keeps the last keep_checkpoints): skipped. "
                        "(%s)", step, name, e)
    if result is not None:
      self._write(step, name, result)
    self.record.add(name, step)
    return result

  def _write(self, step: int, name: str, result: dict[str, Any]) -> None:
    if self.writer is None:
      self.writer = metrics_lib.MetricsWriter(self.workdir)
    self.writer.write(step, {
        f"{name}/{metric.name}": result[metric.name]
        for metric in metric_table.METRICS if metric.name in result})
    self.writer.flush()
    if self.report is not None:
      self.report(result)


def _finished(workdir: str, newest: int | None) -> bool:
  """Whether the run's last step has been saved (config.json read now: a
  resumed run may train further)."""
  if newest is None:
    return False
  return newest >= workdir_lib.Workdir(workdir).load_config().num_train_steps


def _lock(workdir: str, base: str) -> FollowLock:
  """The follower's lock, taken (refused: another follower, or a workdir
  that cannot be written)."""
  eval_dir = os.path.join(workdir, workdir_lib.EVAL_DIR)
  lock = FollowLock(os.path.join(eval_dir, RECORD_PREFIX + base))
  try:
    files.makedirs(eval_dir)
    lock.acquire()
  except (OSError, workdir_lib.WorkdirError) as e:  # not another follower
    raise EvalError(f"eval.py --follow writes into {eval_dir}, which cannot "
                    f"be written: {e}") from None
  return lock


def follow(workdir: str, *, split: str | None = None,
           average_last: int | None = None,
           batch_size: int | None = None, paper_bleu: bool = False,
           poll_seconds: float = 60.0, timeout_seconds: float = 3600.0,
           report: Callable[[dict[str, Any]], None] | None = None,
           clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep,
           **search: Any) -> list[dict[str, Any]]:
  """Evaluates a workdir's checkpoints as they appear (module docstring).

  Args:
    workdir: a training workdir, local or gs://, with or without a trainer
      running.
    split, average_last, batch_size, paper_bleu, search: as
      `evaluator.evaluate`'s (`search`: fields of `mha.SearchSettings`);
      `average_last=N` adds the average of the last N checkpoints up to
      each step.
    poll_seconds: the interval between two listings of the checkpoints.
    timeout_seconds: stop after this long without a new checkpoint
      (0: only when the run's last step is evaluated).
    report: called with each evaluation's result (`evaluator.evaluate`'s).
    clock, sleep: the time and the wait between polls (tests replace them).

  Returns:
    The results of the evaluations made by this call, in order.

  Raises:
    EvalError: a bad flag, another follower with the same settings, or
      (from `evaluator.evaluate`) bad input; UserError: the workdir.
  """
  if not poll_seconds > 0 or not timeout_seconds >= 0:
    raise EvalError(
        f"{validation.setting('poll_seconds', 'follow_interval')} must be > 0 "
        f"and {validation.setting('timeout_seconds', 'follow_timeout')} >= 0 "
        f"(seconds), got {poll_seconds} and {timeout_seconds}.")
  evaluator.check_flags(average_last=average_last, batch_size=batch_size,
                        **search)
  config, _ = trained.load_workdir(workdir)
  single, average = names(config, split, average_last, **search)
  lock = _lock(workdir, single)
  try:
    follower = _Follower(
        workdir, dict(split=split, batch_size=batch_size,
                      paper_bleu=paper_bleu, **search),
        [(single, None)] + ([(average, average_last)] if average else []),
        Record.load(os.path.join(workdir, workdir_lib.EVAL_DIR,
                                 f"{RECORD_PREFIX}{single}.json")), report)
    return _poll(follower, poll_seconds, timeout_seconds, clock, sleep)
  finally:
    lock.release()


def _poll(follower: _Follower, poll_seconds: float, timeout_seconds: float,
          clock: Callable[[], float], sleep: Callable[[float], None]
          ) -> list[dict[str, Any]]:
  """The loop: list, evaluate the oldest pending step, stop or wait."""
  results, seen, last_new = [], set(), clock()
  try:
    while True:
      steps = _present(follower.workdir)
      if set(steps) - seen:
        seen.update(steps)
        last_new = clock()
      todo = follower.todo(steps)
      if todo:
        (step, (name, count)) = todo[0]
        result = follower.evaluate(step, name, count)
        if result is not None:
          results.append(result)
        continue
      if not follower.held and _finished(follower.workdir,
                                         max(seen, default=None)):
        logging.info("The run's last step, %d, is evaluated: done.",
                     max(seen))
        return results
      if timeout_seconds and clock() - last_new >= timeout_seconds:
        logging.info("No new checkpoint for %s s (--follow_timeout): "
                     "stopping.", timeout_seconds)
        return results
      sleep(poll_seconds)
      follower.held.clear()
  finally:
    if follower.writer is not None:
      follower.writer.close()
