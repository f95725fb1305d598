"""The project's error types: bad input that the entry points print as one line.

Every error a user can cause (a config field, a workdir, a data file, a
checkpoint, an evaluation flag) or the machine can cause (a full disk, a
read-only folder) is raised as a subclass of `UserError`, with a message
that names the file, field or line at fault and what to do. `train.py` and
`eval.py` catch `UserError` only, print its message and exit with status
`exit_code` (1, or 130 for a Ctrl-C); any other exception is a bug and keeps
its stack.

Every error class of the project is defined here (the modules that raise
them import them from here; `checkpoints.CheckpointNotFound`,
`evaluator.EvalError` and the like are the same classes). This module
imports nothing of the project, so every layer may raise these.
"""
import errno
import os
import re


class UserError(Exception):
  """Bad input: the message names the problem and the fix.

  Attributes:
    exit_code: the process's exit status when an entry point stops on it.
  """
  exit_code = 1


class ConfigError(UserError, ValueError):
  """A config field (or flag) whose value cannot be right."""


class WorkdirError(UserError):
  """A workdir that cannot be used: locked by another run, not a folder,
  written for another model, or holding an unreadable file."""


class DataError(UserError, ValueError):
  """Bad input data or a data config that cannot be served.

  The message names the file, split, line or config field at fault, so that a
  user can fix the input without reading the code.
  """


class DatasetNotFound(DataError):
  """`config.dataset_name` names no dataset: the message names that field,
  so the split being opened is not put in front of it."""


class LanguageNotFound(DataError):
  """A language with no file in a folder of parallel text: named by its
  config field (`source_lang`, `target_lang`), not by the split being
  opened.

  Attributes:
    language: the language asked for.
  """

  def __init__(self, message: str, language: str):
    super().__init__(message)
    self.language = language


class CheckpointError(UserError):
  """A checkpoint that is missing or cannot be restored."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
  """No checkpoint, no checkpoint of the step asked for, or a step deleted
  while it was read."""


class TooFewCheckpoints(CheckpointError, ValueError):
  """Fewer checkpoints up to a step than the number to average.

  Attributes:
    directory: the checkpoints folder.
    step: the last step asked for.
    steps: the steps up to it.
    needed: the number to average.
  """

  def __init__(self, directory: str | os.PathLike[str], step: int,
               steps: list[int], needed: int):
    super().__init__(
        f"{directory} holds {len(steps)} checkpoint(s) up to step {step}: "
        f"{steps}, fewer than the {needed} to average.")
    self.directory, self.step, self.steps, self.needed = (directory, step,
                                                          steps, needed)


class DamagedCheckpointError(CheckpointError):
  """A step folder whose files are missing or cannot be read.

  Attributes:
    path: the step folder.
    step: its step.
    intact_step: the newest earlier step that can be read, or None.
  """

  def __init__(self, message: str, path: str | os.PathLike[str], step: int,
               intact_step: int | None):
    super().__init__(message)
    self.path, self.step, self.intact_step = path, step, intact_step


class EvalError(UserError, ValueError):
  """Bad input to an evaluation: the message names the workdir, file or step."""


class ExportError(UserError, ValueError):
  """A model, flag or output folder the export cannot use."""


class ModelImportError(UserError, ValueError):
  """A model folder the import cannot read or mha's model cannot compute,
  or a target workdir it may not write: the message names the file, the
  field or the flag."""


class TrainingDiverged(UserError, FloatingPointError):
  """A non-finite loss: the run stops before saving anything of that step."""


class DiskError(UserError):
  """A file or folder the run must write that the machine refuses: a full
  disk, a read-only folder, no permission. The message names it, what was
  lost (nothing) and where to resume from."""


class CheckpointSaveError(CheckpointError, DiskError):
  """A checkpoint the machine would not let Orbax write (a full disk, a
  read-only folder); earlier checkpoints are intact.

  Attributes:
    step: the step that could not be saved.
    last_step: the newest finalised checkpoint, or None.
  """

  def __init__(self, message: str, step: int, last_step: int | None):
    super().__init__(message)
    self.step, self.last_step = step, last_step


class Interrupted(UserError):
  """The user's Ctrl-C (SIGINT): the run stopped where it was asked to.

  Exit status 130 (128 + SIGINT), as a shell reports a process stopped by
  Ctrl-C.
  """
  exit_code = 130


class Terminated(UserError):
  """A SIGTERM (a preemption, `kill`): the command stopped, leaving no
  partial file or lock of its own. Exit status 143 (128 + SIGTERM), as a
  shell reports a process stopped by it."""
  exit_code = 143


class UnsupportedVersions(UserError, ImportError):
  """A Python, JAX or flax outside the versions mha runs on
  (`mha.runtime.versions`): `import mha` raises it, and uncaught it is
  printed as one line, its message, without the stack of the import."""


class SigTerm(BaseException):
  """A SIGTERM, raised in the main thread of a command that stops on it
  (`cli.startup.stops_on_sigterm`; the command then ends as `Terminated`).
  A BaseException, as a Ctrl-C's KeyboardInterrupt: the command's `finally`
  blocks run (locks released, temporary files removed), and no `except
  Exception` on the way (a library's fall-back) takes it for a failure of
  its own and goes on."""


# The errno of a TensorStore error (Orbax writes arrays through TensorStore,
# which raises ValueError('RESOURCE_EXHAUSTED: ... [os_error_code=28]')).
_TENSORSTORE_ERRNO = re.compile(r"os_error_code='?(\d+)")
_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def os_errno(error: BaseException) -> int | None:
  """The errno behind `error`: an OSError's own, or the `os_error_code` of
  a TensorStore error's message; None for other errors."""
  if isinstance(error, OSError) and error.errno:
    return error.errno
  match = _TENSORSTORE_ERRNO.search(str(error))
  return int(match[1]) if match else None


def os_reason(error: BaseException) -> str:
  """What the machine refused, in words: 'the disk is full' for ENOSPC,
  'the file system is read-only' for EROFS, else the error's strerror."""
  code = os_errno(error)
  if code in _REASONS:
    return _REASONS[code]
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  return " ".join(str(error).split())[:200]
