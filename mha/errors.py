"""The project's error types: bad input that the entry points print as one line.

Every error a user can cause (a config field, a workdir, a data file, a
checkpoint, an evaluation flag) or the machine can cause (a full disk, a
read-only folder) is raised as a subclass of `UserError`, with a message
that names the file, field or line at fault and what to do. `train.py` and
`eval.py` catch `UserError` only, print its message and exit with status
`exit_code` (1, or 130 for a Ctrl-C); any other exception is a bug and keeps
its stack.

This module imports nothing of the project, so every layer may raise these.
"""
import errno
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


class CheckpointError(UserError):
  """A checkpoint that is missing or cannot be restored."""


class TrainingDiverged(UserError, FloatingPointError):
  """A non-finite loss: the run stops before saving anything of that step."""


class DiskError(UserError):
  """A file or folder the run must write that the machine refuses: a full
  disk, a read-only folder, no permission. The message names it, what was
  lost (nothing) and where to resume from."""


class Interrupted(UserError):
  """The user's Ctrl-C (SIGINT): the run stopped where it was asked to.

  Exit status 130 (128 + SIGINT), as a shell reports a process stopped by
  Ctrl-C.
  """
  exit_code = 130


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
