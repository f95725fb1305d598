"""Checkpoint averaging: the mean parameters of several checkpoints.

The paper averages the last 5 (base) or 20 (big) checkpoints for
evaluation: `checkpoints.resolve_steps` chooses them, `average_checkpoints`
reads (`checkpoints.read_params`, each step checked first) and averages
them (`average_params`), one tree at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mha.store import checkpoints
from mha.store import workdir as workdir_lib
from mha.store.checkpoint_checks import Purpose
from mha.store.checkpoint_checks import STATE

PyTree = Any


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
    steps: Sequence[int] | None = None,
    purpose: Purpose = 'eval') -> tuple[PyTree, list[int]]:
  """The mean parameters of several checkpoints (the paper's averaging).

  Args:
    workdir: the run's folder.
    num_last: average the last `num_last` checkpoints
      (`checkpoints.resolve_steps(workdir, None, num_last)`).
    steps: or average these steps. With neither, every checkpoint.
    purpose: as in `checkpoints.restore_params`.

  Returns:
    `(params, steps_used)`: NumPy arrays in the saved dtypes (accumulated in
    float32, float64 for float64 leaves), and the steps averaged, ascending.

  Raises:
    CheckpointNotFound: no checkpoint, a requested step is missing, or a step
      was deleted while it was read (the caller may choose steps again).
    DamagedCheckpointError: a step's state cannot be read.
    TooFewCheckpoints: fewer checkpoints than `num_last` (a ValueError).
    ValueError: both arguments given, or `num_last` < 1.
  """
  if num_last is not None and steps is not None:
    raise ValueError('Give num_last or steps, not both.')
  directory = workdir_lib.Workdir(workdir).checkpoints_path
  if steps is not None:
    available = checkpoints.all_steps(workdir)
    checkpoints.find_step(directory, available, None)  # none: raises
    steps_used = sorted({int(s) for s in steps})
    if not steps_used:
      raise ValueError('steps is empty.')
    for step in steps_used:
      checkpoints.find_step(directory, available, step)
  elif num_last is not None:
    steps_used = checkpoints.resolve_steps(workdir, None, num_last)
  else:  # every checkpoint
    steps_used = checkpoints.all_steps(workdir)
    checkpoints.find_step(directory, steps_used, None)  # none: raises
  with checkpoints.open_reader(workdir, steps_used, (STATE,),
                               purpose) as reader:
    params = average_params(checkpoints.read_params(reader, s, purpose)
                            for s in steps_used)
  return params, steps_used
