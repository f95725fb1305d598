"""Checkpoints: the Orbax manager, saving and restoring.

A workdir holds `checkpoints/<step>/` (`Workdir.checkpoints_path`) written
by orbax-checkpoint's `CheckpointManager`, each with two items:

* `state`: the training state, a pytree dict `{'params', 'opt_state', 'step',
  'rng'}` of host (NumPy) or jax arrays (the trainer hands over device arrays
  with one copy on the first local device of each process,
  `devices.checkpoint_arrays`; Orbax copies it to the host, once per
  process);
* `meta`: a JSON dict (data-loader position and other metadata).

Orbax writes each step in a temporary folder and renames it when complete, so
a step folder that exists was whole when written. Saves are asynchronous:
`save` returns once Orbax holds a host copy of the arrays (`wait=False`) and
the files are written by a background thread; the manager's next `save`, and
`wait_until_finished()` or `close()`, wait for that write first. `save` with
`wait=True` (the default) returns only once the step folder is final. A save
the machine refuses is cleaned up after by mha/store/failed_saves.py.

The trainer resumes with `restore`; evaluation reads the parameters only
(`restore_params`) of the steps `resolve_steps` chooses (the paper's last 5
or 20: mha/store/averaging.py averages them). Every read checks the step
first (mha/store/checkpoint_checks.py): a damaged step raises
`DamagedCheckpointError` naming the fix, a step deleted while it is read
`CheckpointNotFound` (mha/errors.py defines both).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import contextlib
import json
import os
from typing import Any

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from mha.errors import CheckpointNotFound
from mha.errors import ConfigError
from mha.errors import TooFewCheckpoints
from mha.store import workdir as workdir_lib
from mha.store.checkpoint_checks import META
from mha.store.checkpoint_checks import Purpose
from mha.store.checkpoint_checks import read_errors
from mha.store.checkpoint_checks import REQUIRED_FILES
from mha.store.checkpoint_checks import STATE
from mha.store.checkpoint_checks import verify

PyTree = Any
SCHEDULED = 'scheduled'  # the meta key: saved on the run's schedule


class LatestScheduled:
  """Orbax's preservation policy of the trainer's manager: the last `n`
  checkpoints saved on the run's schedule, and the latest checkpoint
  whatever it is.

  A checkpoint's meta says whether it was scheduled (`SCHEDULED`: every
  `checkpoint_every_steps` and the run's last step) or saved because the
  run was stopped (a preemption's SIGTERM, a Ctrl-C); one without the key
  (saved by other code, or before the key existed) counts as scheduled. A
  stop's checkpoint is kept while it is the latest, for the run to resume
  from, and deleted at the next save; it never displaces a scheduled one,
  so the last N averaged (`resolve_steps`) are the schedule's, as the
  paper's (written at fixed intervals), preempted or not.

  This run's saves tell the policy through Orbax's in-memory checkpoint
  metrics (`save`: the newest step's files are still being written when
  Orbax asks); earlier runs' checkpoints, through their meta files, read
  once each.
  """

  def __init__(self, n: int, directory: epath.Path):
    self.n = n
    self.directory = directory
    self._read: dict[int, bool] = {}

  def scheduled(self, info: Any) -> bool:
    """Whether checkpoint `info` (an Orbax `PolicyCheckpointInfo`) was
    saved on the schedule."""
    if info.metrics and SCHEDULED in info.metrics:
      return bool(info.metrics[SCHEDULED])
    if info.step not in self._read:
      self._read[info.step] = _meta_says_scheduled(self.directory, info.step)
    return self._read[info.step]

  def should_preserve(self, checkpoints: Sequence[Any], *,
                      context: Any = None) -> list[bool]:
    del context  # Orbax's PreservationContext: nothing this policy needs
    latest = max((c.step for c in checkpoints), default=None)
    kept = {latest, *sorted(c.step for c in checkpoints
                            if self.scheduled(c))[-self.n:]}
    return [c.step in kept for c in checkpoints]


def _meta_says_scheduled(directory: epath.Path, step: int) -> bool:
  """A finished checkpoint's meta `SCHEDULED` (True where absent or
  unreadable: a checkpoint is deleted early only when it says so)."""
  try:
    meta = json.loads(
        (directory / str(step) / REQUIRED_FILES[META][0]).read_text())
  except (OSError, ValueError):
    return True
  return bool(meta.get(SCHEDULED, True)) if isinstance(meta, dict) else True


def make_manager(workdir: str | os.PathLike[str],
                 keep: int) -> ocp.CheckpointManager:
  """A manager of `<workdir>/checkpoints` that keeps the last `keep` steps
  (of those saved on the run's schedule, and the latest: `LatestScheduled`).

  Args:
    workdir: the run's folder (created if needed).
    keep: the scheduled checkpoints kept (>= 1), besides the latest; older
      ones are deleted after each save (`LatestScheduled`).

  Returns:
    An `ocp.CheckpointManager` for the `state` and `meta` items; use it with
    `save` and `restore` (all processes must call them in multi-host runs)
    and `close()` it at the end.
  """
  if keep < 1:
    raise ValueError(f'keep must be >= 1, got {keep}.')
  directory = epath.Path(workdir_lib.Workdir(workdir).checkpoints_path)
  options = ocp.CheckpointManagerOptions(
      create=True,
      # `max_to_keep` is deprecated in favour of preservation policies.
      preservation_policy=LatestScheduled(keep, directory),
  )
  return ocp.CheckpointManager(directory, options=options,
                               item_names=(STATE, META))


def save(manager: ocp.CheckpointManager, step: int, state: PyTree,
         meta: dict[str, Any], force: bool = False, wait: bool = True) -> bool:
  """Writes `state` and `meta` as checkpoint `step`.

  Waits first for the manager's previous save to be written (Orbax does).

  Args:
    manager: from `make_manager`.
    step: the training step.
    state: pytree of arrays (host NumPy, or jax arrays: Orbax copies them to
      the host before `save` returns, so they may be changed or deleted
      afterwards).
    meta: JSON-serialisable dict; `SCHEDULED: False` marks a save off the
      run's schedule, kept only while it is the latest (`LatestScheduled`).
    force: save even if the manager's save policy would skip this step.
    wait: return only once the step folder is final (renamed from its
      temporary name); False returns once the arrays are copied and leaves
      the write to a background thread: call `manager.wait_until_finished()`
      (or `close()`) before the process exits or reads the step.

  Returns:
    Whether a checkpoint was written (or, with `wait=False`, started).

  Raises:
    ValueError: if checkpoint `step` already exists (Orbax never overwrites).
  """
  saved = manager.save(
      int(step),
      args=ocp.args.Composite(**{
          STATE: ocp.args.StandardSave(state),
          META: ocp.args.JsonSave(meta),
      }),
      # Not written (no best_fn): what `LatestScheduled` reads of this save.
      metrics={SCHEDULED: float(meta.get(SCHEDULED, True))},
      force=force)
  if wait:
    # Blocks until the step folder is finalised (renamed from its temporary
    # name), so a kill afterwards cannot lose it.
    manager.wait_until_finished()
  return saved


def restore(manager: ocp.CheckpointManager, step: int | None,
            target_state: PyTree, purpose: Purpose = 'train'
            ) -> tuple[PyTree, dict[str, Any]]:
  """Restores checkpoint `step` (None: the latest) into `target_state`'s form.

  Args:
    manager: from `make_manager`.
    step: the step to restore, or None for the latest.
    target_state: a pytree with the structure, shapes and dtypes to restore
      (real arrays or `jax.ShapeDtypeStruct`s); jax arrays come back with the
      target's sharding, NumPy arrays as NumPy.
    purpose: the fix a damaged step's message gives ('train': move the step
      aside and resume from the newest intact one).

  Returns:
    `(state, meta)`.

  Raises:
    CheckpointNotFound: no checkpoint, or no checkpoint `step`.
    DamagedCheckpointError: the step's files are missing or unreadable.
  """
  directory = manager.directory
  steps = sorted(manager.all_steps())
  step = find_step(directory, steps, step)
  verify(directory, step, (STATE, META), purpose)
  with read_errors(directory, [step], (STATE, META), purpose):
    restored = manager.restore(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.StandardRestore(target_state),
            META: ocp.args.JsonRestore(),
        }))
  mismatch = first_mismatch(restored[STATE], target_state)
  if mismatch:
    raise ConfigError(
        f"Checkpoint {step} in {directory} does not fit the config's model: "
        f"{mismatch}. Give the config the checkpoint was trained with.")
  return restored[STATE], restored[META]


def param_path_name(path) -> str:
  """'params/encoder/.../kernel': a pytree path's keys joined by '/'."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def first_mismatch(loaded: PyTree, target: PyTree) -> str | None:
  """A sentence naming the first array of `loaded` (a checkpoint's) whose
  path or shape is not `target`'s (the model's), parameters first; None
  if they fit."""
  have = {param_path_name(p): np.shape(x) for p, x in
          jax.tree_util.tree_flatten_with_path(loaded)[0]}
  want = {param_path_name(p): np.shape(x) for p, x in
          jax.tree_util.tree_flatten_with_path(target)[0]}
  for name in sorted(want, key=lambda n: not n.startswith("params/")):
    if name not in have:
      return (f"the model's parameter {name} {want[name]} is not in the "
              "checkpoint")
    if have[name] != want[name]:
      return (f"parameter {name} has shape {have[name]} in the checkpoint "
              f"but {want[name]} in the model")
  extra = sorted(set(have) - set(want))
  if extra:
    return f"the checkpoint's parameter {extra[0]} is not in the model"
  return None


def all_steps(workdir: str | os.PathLike[str]) -> list[int]:
  """The finalised checkpoint steps in `Workdir.checkpoints_path`,
  ascending."""
  return sorted(ocp.utils.checkpoint_steps(
      workdir_lib.Workdir(workdir).checkpoints_path))


def check_step(workdir: str | os.PathLike[str], step: int | None = None,
               purpose: Purpose = 'train') -> int:
  """Checks that checkpoint `step` (None: the latest) can be restored whole,
  without restoring it: for a caller that must refuse before writing.

  Returns:
    The step.

  Raises:
    CheckpointNotFound: no checkpoint, or no checkpoint `step`.
    DamagedCheckpointError: as `restore`.
  """
  directory = workdir_lib.Workdir(workdir).checkpoints_path
  step = find_step(directory, all_steps(workdir), step)
  verify(directory, step, (STATE, META), purpose)
  return step


def resolve_steps(workdir: str | os.PathLike[str], step: int | None = None,
                  num_last: int = 1) -> list[int]:
  """The steps one evaluation reads: the last `num_last` checkpoints up to
  `step` (None: the latest), ascending, chosen without reading them.

  `num_last=1` is the one checkpoint `step`; more is the paper's average of
  the last N checkpoints (5 for the base model, 20 for the big one).

  Raises:
    ValueError: `num_last` < 1.
    CheckpointNotFound: no checkpoint, or no checkpoint `step` (the message
      names the folder and lists the available steps).
    TooFewCheckpoints: fewer than `num_last` checkpoints up to `step`.
  """
  if num_last < 1:
    raise ValueError(f'num_last must be >= 1, got {num_last}.')
  directory = workdir_lib.Workdir(workdir).checkpoints_path
  available = all_steps(workdir)
  step = find_step(directory, available, step)
  upto = [s for s in available if s <= step]
  if len(upto) < num_last:
    raise TooFewCheckpoints(directory, step, upto, num_last)
  return upto[-num_last:]


def latest_step(workdir: str | os.PathLike[str]) -> int | None:
  """The latest finalised checkpoint step, or None if there is none."""
  steps = all_steps(workdir)
  return steps[-1] if steps else None


def find_step(directory: str | os.PathLike[str], steps: Sequence[int],
              step: int | None) -> int:
  """Checkpoint `step` among the finalised `steps` of the checkpoints
  folder `directory` (None: the latest).

  Raises:
    CheckpointNotFound: no checkpoint (names the folder), or no checkpoint
      `step` (lists the available steps).
  """
  if not steps:
    raise CheckpointNotFound(
        f'No checkpoint in {directory}: expected step folders '
        f'{directory}/<step>/ written by training.')
  if step is None:
    return steps[-1]
  if int(step) not in steps:
    raise CheckpointNotFound(
        f'No checkpoint for step {step} in {directory}; available steps: '
        f'{list(steps)}.')
  return int(step)


@contextlib.contextmanager
def open_reader(workdir: str | os.PathLike[str], steps: Sequence[int],
                items: Sequence[str], purpose: Purpose
                ) -> Iterator[ocp.CheckpointManager]:
  """A manager that reads items without knowing their targets in advance.

  Orbax lists the step folders when it is made (`lightweight_initialize`:
  without reading each one's commit time, which the reads do not use); a
  step deleted meanwhile raises `CheckpointNotFound` (`read_errors`).
  """
  directory = workdir_lib.Workdir(workdir).checkpoints_path
  with read_errors(directory, steps, items, purpose, verified=False):
    reader = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(create=False,
                                             lightweight_initialize=True),
        item_handlers={
            STATE: ocp.PyTreeCheckpointHandler(),
            META: ocp.JsonCheckpointHandler(),
        })
  with reader:
    yield reader


def read_params(reader: ocp.CheckpointManager, step: int,
                purpose: Purpose) -> PyTree:
  """Reads only `state['params']` of `step`, as NumPy arrays.

  Raises:
    CheckpointNotFound: the step was deleted while it was read.
    DamagedCheckpointError: its state cannot be read.
  """
  directory = reader.directory
  verify(directory, step, (STATE,), purpose, params_only=True)
  with read_errors(directory, [step], (STATE,), purpose, params_only=True):
    metadata = reader.item_metadata(step)[STATE].tree['params']
    target = {'params': jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)}
    restore_args = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    restored = reader.restore(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.PyTreeRestore(item=target,
                                          restore_args=restore_args,
                                          partial_restore=True),
        }))
  return restored[STATE]['params']


def restore_params(workdir: str | os.PathLike[str], step: int | None = None,
                   purpose: Purpose = 'eval') -> tuple[PyTree, int]:
  """The parameters of one checkpoint, for evaluation.

  Only `params` are read (Orbax partial restore), not the optimizer state.

  Args:
    workdir: the run's folder.
    step: the checkpoint step; None = the latest.
    purpose: the fix a damaged step's message gives ('eval':
      `--checkpoint_step` of the newest intact step).

  Returns:
    `(params, step)`, params as NumPy arrays with their saved dtypes.

  Raises:
    CheckpointNotFound: no checkpoint in the workdir (names the folder), no
      checkpoint `step` (lists the available steps), or the step was deleted
      while it was read.
    DamagedCheckpointError: the step's state cannot be read.
  """
  step = find_step(workdir_lib.Workdir(workdir).checkpoints_path,
                   all_steps(workdir), step)
  with open_reader(workdir, [step], (STATE,), purpose) as reader:
    return read_params(reader, step, purpose), step


def read_meta(workdir: str | os.PathLike[str], step: int | None = None,
              purpose: Purpose = 'eval') -> dict[str, Any]:
  """The JSON saved beside checkpoint `step` (None: the latest): `step`,
  `data_position` (micro-batches read), `grad_accum_steps`, `scheduled`
  (`LatestScheduled`; absent before it existed).

  Raises:
    CheckpointNotFound, DamagedCheckpointError: as `restore_params`.
  """
  directory = workdir_lib.Workdir(workdir).checkpoints_path
  step = find_step(directory, all_steps(workdir), step)
  verify(directory, step, (META,), purpose)
  with open_reader(workdir, [step], (META,), purpose) as reader:
    with read_errors(directory, [step], (META,), purpose):
      restored = reader.restore(
          step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
  return dict(restored[META])

