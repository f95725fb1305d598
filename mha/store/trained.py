"""A trained workdir, read for use and never written: its config, its
vocabulary and the parameters of a checkpoint or of the mean of the last N.

    from mha.store import trained
    config, tokenizer = trained.load_workdir("/tmp/run")
    params, step, steps = trained.load_params("/tmp/run", average_last=5)
    trained.check_fit(config, params, "/tmp/run", step)

What `mha.load`, eval.py, `mha-export` and the tools read a trained model
with. A running trainer may delete checkpoints meanwhile: `load_params`
chooses its steps again when one vanishes.
"""
from typing import Any

from absl import logging

from mha import data
from mha import validation
from mha.errors import DamagedCheckpointError
from mha.errors import EvalError
from mha.errors import UserError
from mha.model.transformer import TransformerConfig
from mha.runtime import files
from mha.store import averaging
from mha.store import checkpoints
from mha.store import workdir as workdir_lib

# How often load_params chooses its steps again when one is deleted meanwhile.
READ_ATTEMPTS = 3


def choose_steps(workdir: str, checkpoint_step: int | None = None,
                 average_last: int | None = None) -> list[int]:
  """The checkpoint steps an evaluation reads (ascending), without reading
  them: `checkpoints.resolve_steps`, its shortfall named by the flag.

  Raises:
    CheckpointNotFound: no checkpoint, or no checkpoint `checkpoint_step`
      (the message lists the available ones).
    EvalError: fewer than `average_last` checkpoints up to the step.
  """
  try:
    return checkpoints.resolve_steps(workdir, checkpoint_step,
                                     average_last or 1)
  except checkpoints.TooFewCheckpoints as e:
    raise EvalError(
        f"{validation.setting('average_last')}={e.needed} but {e.directory} "
        f"holds {len(e.steps)} checkpoint(s) up to step {e.step}: "
        f"{e.steps}.") from None


def load_params(workdir: str, checkpoint_step: int | None = None,
                average_last: int | None = None) -> tuple[Any, int, list[int]]:
  """The parameters to evaluate: one checkpoint or the mean of the last N.

  A running trainer deletes its oldest checkpoint after each save
  (`keep_checkpoints`), possibly while they are read here. The steps are
  chosen from those present; if one of them is deleted before or while it is
  read, or found damaged while the steps present have changed (a trainer
  deletes a step's files before its folder), they are chosen again from
  those present then (at most `READ_ATTEMPTS` times), and the steps
  returned are those actually read.

  Args:
    workdir: the training workdir.
    checkpoint_step: None = the latest.
    average_last: average the last N checkpoints up to `checkpoint_step`
      (`averaging.average_checkpoints`: the element-wise mean).

  Returns:
    `(params, checkpoint step, averaged steps)`; params as NumPy arrays.

  Raises:
    CheckpointNotFound, EvalError: as `choose_steps`; EvalError: the steps
      kept vanishing.
    checkpoints.DamagedCheckpointError: a chosen step cannot be read (the
      message names it and the newest intact step).
  """
  for attempt in range(READ_ATTEMPTS):
    steps = choose_steps(workdir, checkpoint_step, average_last)
    try:
      if len(steps) > 1:
        params, steps = averaging.average_checkpoints(workdir, steps=steps)
      else:
        params, _ = checkpoints.restore_params(workdir, steps[0])
      return params, steps[-1], list(steps)
    except checkpoints.CheckpointNotFound as e:
      logging.warning("Attempt %d of %d: %s Choosing the steps again.",
                      attempt + 1, READ_ATTEMPTS, e)
    except DamagedCheckpointError as e:
      # Files missing from a step whose folder is still there: a damaged
      # step, or one a trainer is deleting (its files first, then its
      # folders) after saving a newer one; then the steps chosen now differ.
      if choose_steps(workdir, checkpoint_step, average_last) == steps:
        raise
      logging.warning("Attempt %d of %d: %s The checkpoints changed "
                      "meanwhile (a trainer saving and deleting): choosing "
                      "the steps again.", attempt + 1, READ_ATTEMPTS, e)
  raise EvalError(
      f"Checkpoints of {workdir_lib.Workdir(workdir).checkpoints_path} were "
      f"deleted while they were read, {READ_ATTEMPTS} times: the trainer "
      "deletes them faster than they can be read. Evaluate again with a "
      "larger keep_checkpoints, or after training.")


def check_fit(config: Any, params: Any, workdir: str, step: int) -> None:
  """Refuses parameters that are not of the model `config` describes (a
  config.json edited, or without a shape field, would otherwise give other
  translations or a stack of Flax's): the model's parameter shapes,
  traced without computing, against the checkpoint's.

  Raises:
    EvalError: naming config.json, the step and the first misfit array.
  """
  # pylint: disable=import-outside-toplevel  (JAX: after the command starts)
  import jax
  import numpy as np
  from mha.model.transformer import Transformer
  # pylint: enable=import-outside-toplevel
  dummy = np.ones((1, 1), np.int32)
  target = jax.eval_shape(
      Transformer(TransformerConfig.from_config(config, deterministic=True)
                  ).init, jax.random.PRNGKey(0), dummy, dummy)["params"]
  mismatch = checkpoints.first_mismatch(params, target)
  if mismatch:
    raise EvalError(
        f"{workdir_lib.Workdir(workdir).config_path} does not describe "
        f"checkpoint {step}: {mismatch}. Was config.json edited?")


def load_workdir(workdir: str) -> tuple[Any, data.Tokenizer]:
  """(config, tokenizer) stored in a workdir, read without modifying it.

  Never trains a vocabulary (`Workdir.load_tokenizer`): a workdir without
  `spm.model` is refused.

  Raises:
    EvalError: the workdir or its config.json is missing, or a gs://
      workdir cannot be read (credentials, bucket).
    UserError: a URL of another scheme than gs://, or config.json or
      spm.model missing or unreadable (the message names the file).
  """
  try:
    present = files.exists(workdir)
    folder = present and files.isdir(workdir)
  except OSError as e:  # Cloud Storage: no credentials, access denied
    raise EvalError(f"{validation.setting('workdir')}={workdir}: {e}"
                    ) from None
  if not present:
    raise EvalError(f"Workdir {workdir} does not exist.")
  if not folder:
    raise EvalError(f"{validation.setting('workdir')}={workdir} is a file, "
                    "not a workdir folder.")
  workdir_lib.check_path_characters(workdir)
  layout = workdir_lib.Workdir(workdir)
  layout.check_not_export()
  try:
    config = layout.load_config()
  except UserError:
    raise
  except (OSError, ValueError) as e:  # before workdir.load_config names it
    raise EvalError(f"Workdir {workdir}: {e}") from None
  # The model's fields by their rules (config.json edited: `num_heads:
  # "four"` would be a TypeError in the model).
  workdir_lib.check_saved_fields(config, layout.config_path, EvalError)
  return config, layout.load_tokenizer(config)
