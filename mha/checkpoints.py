"""Checkpoints: the Orbax manager, restoring for evaluation, averaging.

A workdir holds `checkpoints/<step>/` written by orbax-checkpoint's
`CheckpointManager`, each with two items:

* `state`: the training state, a pytree dict `{'params', 'opt_state', 'step',
  'rng'}` of host (NumPy) or fully addressable jax arrays (unreplicate a
  `pmap`ped state first);
* `meta`: a JSON dict (data-loader position and other metadata).

Orbax writes each step in a temporary folder and renames it when complete, so
a step folder that exists is whole; `save` waits for the write to finish.
The paper averages the last 5 (base) or 20 (big) checkpoints for evaluation:
`average_checkpoints`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import os
from typing import Any

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

PyTree = Any

CHECKPOINTS_SUBDIR = 'checkpoints'
STATE = 'state'
META = 'meta'


def checkpoint_dir(workdir: str | os.PathLike[str]) -> epath.Path:
  """`<workdir>/checkpoints`, absolute (Orbax refuses relative paths)."""
  path = epath.Path(workdir)
  if not path.is_absolute() and "://" not in os.fspath(workdir):
    path = epath.Path(os.path.abspath(os.fspath(workdir)))
  return path / CHECKPOINTS_SUBDIR


def make_manager(workdir: str | os.PathLike[str],
                 keep: int) -> ocp.CheckpointManager:
  """A manager of `<workdir>/checkpoints` that keeps the last `keep` steps.

  Args:
    workdir: the run's folder (created if needed).
    keep: number of most recent checkpoints kept (>= 1); older ones are
      deleted after each save.

  Returns:
    An `ocp.CheckpointManager` for the `state` and `meta` items; use it with
    `save` and `restore` (all processes must call them in multi-host runs)
    and `close()` it at the end.
  """
  if keep < 1:
    raise ValueError(f'keep must be >= 1, got {keep}.')
  options = ocp.CheckpointManagerOptions(
      create=True,
      # `max_to_keep` is deprecated in favour of preservation policies.
      preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
  )
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_names=(STATE, META))


def save(manager: ocp.CheckpointManager, step: int, state: PyTree,
         meta: dict[str, Any], force: bool = False) -> bool:
  """Writes `state` and `meta` as checkpoint `step` and waits until done.

  Args:
    manager: from `make_manager`.
    step: the training step.
    state: pytree of arrays (host NumPy or fully addressable jax arrays).
    meta: JSON-serialisable dict.
    force: save even if the manager's save policy would skip this step.

  Returns:
    Whether a checkpoint was written.

  Raises:
    ValueError: if checkpoint `step` already exists (Orbax never overwrites).
  """
  saved = manager.save(
      int(step),
      args=ocp.args.Composite(**{
          STATE: ocp.args.StandardSave(state),
          META: ocp.args.JsonSave(meta),
      }),
      force=force)
  # Blocks until the step folder is finalised (renamed from its temporary
  # name), so a kill afterwards cannot lose it.
  manager.wait_until_finished()
  return saved


def restore(manager: ocp.CheckpointManager, step: int | None,
            target_state: PyTree) -> tuple[PyTree, dict[str, Any]]:
  """Restores checkpoint `step` (None: the latest) into `target_state`'s form.

  Args:
    manager: from `make_manager`.
    step: the step to restore, or None for the latest.
    target_state: a pytree with the structure, shapes and dtypes to restore
      (real arrays or `jax.ShapeDtypeStruct`s); jax arrays come back with the
      target's sharding, NumPy arrays as NumPy.

  Returns:
    `(state, meta)`.

  Raises:
    FileNotFoundError: no checkpoint, or no checkpoint `step`.
  """
  steps = sorted(manager.all_steps())
  step = _check_step(manager.directory, steps, step)
  restored = manager.restore(
      step,
      args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(target_state),
          META: ocp.args.JsonRestore(),
      }))
  return restored[STATE], restored[META]


def all_steps(workdir: str | os.PathLike[str]) -> list[int]:
  """The finalised checkpoint steps in `<workdir>/checkpoints`, ascending."""
  return sorted(ocp.utils.checkpoint_steps(checkpoint_dir(workdir)))


def latest_step(workdir: str | os.PathLike[str]) -> int | None:
  """The latest finalised checkpoint step, or None if there is none."""
  steps = all_steps(workdir)
  return steps[-1] if steps else None


def _check_step(directory: epath.Path, steps: Sequence[int],
                step: int | None) -> int:
  if not steps:
    raise FileNotFoundError(
        f'No checkpoint in {directory}: expected step folders '
        f'{directory}/<step>/ written by training.')
  if step is None:
    return steps[-1]
  if int(step) not in steps:
    raise FileNotFoundError(
        f'No checkpoint for step {step} in {directory}; available steps: '
        f'{list(steps)}.')
  return int(step)


def _reader(workdir: str | os.PathLike[str]) -> ocp.CheckpointManager:
  """A manager that reads items without knowing their targets in advance."""
  return ocp.CheckpointManager(
      checkpoint_dir(workdir),
      options=ocp.CheckpointManagerOptions(create=False),
      item_handlers={
          STATE: ocp.PyTreeCheckpointHandler(),
          META: ocp.JsonCheckpointHandler(),
      })


def _read_params(reader: ocp.CheckpointManager, step: int) -> PyTree:
  """Reads only `state['params']` of `step`, as NumPy arrays."""
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


def restore_params(workdir: str | os.PathLike[str],
                   step: int | None = None) -> tuple[PyTree, int]:
  """The parameters of one checkpoint, for evaluation.

  Only `params` are read (Orbax partial restore), not the optimizer state.

  Args:
    workdir: the run's folder.
    step: the checkpoint step; None = the latest.

  Returns:
    `(params, step)`, params as NumPy arrays with their saved dtypes.

  Raises:
    FileNotFoundError: no checkpoint in the workdir (names the folder), or no
      checkpoint `step` (lists the available steps).
  """
  step = _check_step(checkpoint_dir(workdir), all_steps(workdir), step)
  with _reader(workdir) as reader:
    return _read_params(reader, step), step


def read_meta(workdir: str | os.PathLike[str],
              step: int | None = None) -> dict[str, Any]:
  """The JSON saved beside checkpoint `step` (None: the latest): `step`,
  `data_position` (micro-batches read), `grad_accum_steps`."""
  step = _check_step(checkpoint_dir(workdir), all_steps(workdir), step)
  with _reader(workdir) as reader:
    restored = reader.restore(
        step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
  return dict(restored[META])


def _is_float(dtype: np.dtype) -> bool:
  # jnp counts bfloat16 (ml_dtypes) as floating, NumPy's issubdtype does not.
  return bool(jnp.issubdtype(dtype, jnp.inexact))


def _float_accumulator(dtype: np.dtype) -> type:
  return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def average_params(trees: Iterable[PyTree]) -> PyTree:
  """The element-wise mean of parameter trees of identical structure.

  Floating leaves are summed in float32 (float64 for float64 leaves), divided,
  and cast back to their dtype; other leaves (e.g. integer counters) must be
  equal in every tree. Trees are consumed one at a time, so an iterator of
  restored checkpoints needs memory for two trees only.

  Args:
    trees: parameter pytrees (NumPy or jax arrays).

  Returns:
    The mean tree, NumPy arrays.
  """
  total, dtypes, treedef, count = None, None, None, 0
  for tree in trees:
    leaves, this_treedef = jax.tree.flatten(tree)
    leaves = [np.asarray(x) for x in leaves]
    if total is None:
      treedef, dtypes = this_treedef, [x.dtype for x in leaves]
      total = [
          x.astype(_float_accumulator(x.dtype))
          if _is_float(x.dtype) else x for x in leaves
      ]
    else:
      if this_treedef != treedef:
        raise ValueError(f'Parameter tree {count} has structure '
                         f'{this_treedef}, tree 0 has {treedef}.')
      for i, (acc, x) in enumerate(zip(total, leaves)):
        if acc.shape != x.shape:
          raise ValueError(f'Leaf {i} of tree {count} has shape {x.shape}, '
                           f'tree 0 has {acc.shape}.')
        if _is_float(dtypes[i]):
          total[i] = acc + x.astype(acc.dtype)
        elif not np.array_equal(acc, x):
          raise ValueError(f'Non-float leaf {i} differs between tree 0 and '
                           f'tree {count}; it cannot be averaged.')
    count += 1
  if total is None:
    raise ValueError('average_params needs at least one tree.')
  mean = [(acc / count).astype(dtype)
          if _is_float(dtype) else acc
          for acc, dtype in zip(total, dtypes)]
  return jax.tree.unflatten(treedef, mean)


def average_checkpoints(
    workdir: str | os.PathLike[str],
    num_last: int | None = None,
    steps: Sequence[int] | None = None) -> tuple[PyTree, list[int]]:
  """The mean parameters of several checkpoints (the paper's averaging).

  Args:
    workdir: the run's folder.
    num_last: average the last `num_last` checkpoints.
    steps: or average these steps. With neither, every checkpoint.

  Returns:
    `(params, steps_used)`: NumPy arrays in the saved dtypes (accumulated in
    float32), and the steps averaged, ascending.

  Raises:
    FileNotFoundError: no checkpoint, or a requested step is missing.
    ValueError: fewer checkpoints than `num_last`, or both arguments given.
  """
  directory = checkpoint_dir(workdir)
  available = all_steps(workdir)
  if num_last is not None and steps is not None:
    raise ValueError('Give num_last or steps, not both.')
  _check_step(directory, available, None)  # raises if there is none
  if steps is not None:
    steps_used = sorted({int(s) for s in steps})
    if not steps_used:
      raise ValueError('steps is empty.')
    for step in steps_used:
      _check_step(directory, available, step)
  elif num_last is not None:
    if num_last < 1:
      raise ValueError(f'num_last must be >= 1, got {num_last}.')
    if len(available) < num_last:
      raise ValueError(
          f'Cannot average the last {num_last} checkpoints: {directory} holds '
          f'{len(available)} (steps {available}).')
    steps_used = available[-num_last:]
  else:
    steps_used = available
  with _reader(workdir) as reader:
    params = average_params(_read_params(reader, s) for s in steps_used)
  return params, steps_used
