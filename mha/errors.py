"""The project's error types: bad input that the entry points print as one line.

Every error a user can cause (a config field, a workdir, a data file, a
checkpoint, an evaluation flag) is raised as a subclass of `UserError`, with a
message that names the file, field or line at fault and what to do. `train.py`
and `eval.py` catch `UserError` only, print its message and exit with status
1; any other exception is a bug and keeps its stack.

This module imports nothing of the project, so every layer may raise these.
"""


class UserError(Exception):
  """Bad input: the message names the problem and the fix."""


class ConfigError(UserError, ValueError):
  """A config field (or flag) whose value cannot be right."""


class WorkdirError(UserError):
  """A workdir that cannot be used: locked by another run, not a folder,
  written for another model, or holding an unreadable file."""


class CheckpointError(UserError):
  """A checkpoint that is missing or cannot be restored."""


class TrainingDiverged(UserError, FloatingPointError):
  """A non-finite loss: the run stops before saving anything of that step."""
