"""Warm start: a new run's parameters from another workdir's checkpoint.

`--config.init_from=WORKDIR` (its latest checkpoint) or `WORKDIR:STEP` loads
the parameters of that checkpoint into a new run, as big_vision's
`config.model_init` does: not its optimizer state, step or RNG (the new run
starts at step 0 with fresh Adam moments and its own schedule; t5x's
`INITIAL_CHECKPOINT_PATH` keeps the checkpoint's step). Every parameter of
the new model must exist in the checkpoint with the same shape; the first
that does not is named. A run that resumes from its own checkpoint ignores
`init_from`.
"""
import os
import re
from typing import Any

import jax
import numpy as np

from mha.store import checkpoints
from mha.runtime import files
from mha.data import tokenizer
from mha.errors import CheckpointError
from mha.errors import ConfigError
from mha.errors import DataError

PyTree = Any


def parse(spec: str) -> tuple[str, int | None]:
  """'WORKDIR' -> (WORKDIR, None); 'WORKDIR:STEP' -> (WORKDIR, STEP)."""
  match = re.fullmatch(r"(.+):(\d+)", spec)
  if match:
    return match.group(1), int(match.group(2))
  return spec, None


def vocabulary(spec: str, workdir: str) -> dict[str, bytes]:
  """The vocabulary of `spec`'s workdir, which the new run shares: {file
  name: bytes} of its spm.model, or of its separate vocabulary's
  source.spm, target.spm and vocab.json (`tokenizer.from_files`).

  Ids mean nothing without the vocabulary that made them, so a warm-started
  run reads its text with the vocabulary of the run it starts from: it is
  copied into the new workdir, and a new workdir that already holds another
  one is refused.

  Raises:
    ConfigError: the source has no readable vocabulary (or files that are
      not one), or `workdir` holds a different one.
  """
  source, _ = parse(spec)
  separate = tokenizer.has_separate(source)
  names = (tokenizer.SEPARATE_FILENAMES if separate
           else (tokenizer.MODEL_FILENAME,))
  contents = {}
  for name in names:
    path = os.path.join(source, name)
    try:
      contents[name] = files.read_bytes(path)
    except OSError as e:
      raise ConfigError(f"config.init_from={spec!r}: {path} cannot be read "
                        f"({e.strerror or e}); warm start needs the "
                        "vocabulary of the run it starts from.") from None
  try:
    tokenizer.from_files(contents, source)  # parsed: the error names it
  except DataError as e:  # its first sentence: what is wrong with it
    raise ConfigError(
        f"config.init_from={spec!r}: {str(e).split('. ')[0]}; warm start "
        "needs the vocabulary of the run it starts from.") from None
  for name in (tokenizer.MODEL_FILENAME, *tokenizer.SEPARATE_FILENAMES):
    mine = os.path.join(workdir, name)
    if files.exists(mine) and (name not in contents
                               or files.read_bytes(mine) != contents[name]):
      raise ConfigError(
          f"config.init_from={spec!r}: {mine} differs from "
          f"{os.path.join(source, name)}; a warm start shares the "
          "vocabulary of the run it starts from. Use a new --workdir.")
  return contents


def load(spec: str, target_params: PyTree) -> tuple[PyTree, int]:
  """Parameters of checkpoint `spec`, in the form of `target_params`.

  Args:
    spec: `WORKDIR` or `WORKDIR:STEP` (config.init_from).
    target_params: the new model's parameters (arrays or ShapeDtypeStructs):
      the structure, shapes and dtypes the result takes.

  Returns:
    (parameters as NumPy arrays of the target's dtypes, the step read).

  Raises:
    ConfigError: no such checkpoint, or a parameter missing or of another
      shape (named).
  """
  workdir, step = parse(spec)
  try:
    params, step = checkpoints.restore_params(workdir, step)
  except (FileNotFoundError, CheckpointError) as e:
    raise ConfigError(f"config.init_from={spec!r}: {e}") from None
  mismatch = checkpoints.first_mismatch(params, target_params)
  if mismatch:
    raise ConfigError(
        f"config.init_from={spec!r}: {mismatch}; warm start needs the same "
        "model shape (d_model, d_ff, heads, d_k, d_v, layers, vocabulary).")
  flat = {checkpoints.param_path_name(p): x for p, x in
          jax.tree_util.tree_flatten_with_path(params)[0]}
  result = jax.tree_util.tree_map_with_path(
      lambda p, t: np.asarray(flat[checkpoints.param_path_name(p)],
                              dtype=t.dtype),
      target_params)
  return result, step
