"""The libraries' own log lines, hidden by default in train.py and eval.py.

TensorFlow prints native INFO lines when it loads (oneDNN, and absl's
"All log messages before absl::InitializeLog()" notice), JAX logs the
backends it could not start (INFO), and Orbax logs about 40 INFO lines per
checkpoint. The entry points hide these and keep the project's own lines,
warnings and errors of every library; `--verbose_libraries` shows them:

    from mha.runtime import library_logs
    library_logs.quiet_native(sys.argv)   # TensorFlow, once imported: quiet
    library_logs.define_flag()
    ...
    library_logs.configure(FLAGS.verbose_libraries)   # in main()

TensorFlow is imported only where it is used, through
`tensorflow_loader.import_tensorflow` (the data of a TFDS dataset by name; a
local parallel_text folder or the synthetic pair never import it), which
hides its start-up lines once `quiet_native` asked. Calling the library
(`trainer.train_and_evaluate`) directly changes nothing.
"""
import importlib.util
import logging
import os
from typing import Sequence

from absl import flags

from mha.runtime import tensorflow_loader

FLAG = "verbose_libraries"
# TensorFlow's native (C++) log threshold: 1 hides INFO, keeps warnings.
NATIVE_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
# Python loggers whose INFO lines are start-up noise (JAX's backend probe).
_QUIET_LOGGERS = ("jax._src.xla_bridge",)
# Packages whose INFO lines through absl's logger are hidden.
_LIBRARIES = ("orbax",)


def define_flag() -> None:
  """Defines --verbose_libraries (False)."""
  flags.DEFINE_bool(
      FLAG, False, "Show the INFO log lines of Orbax (per checkpoint), "
      "TensorFlow (native, at start-up) and JAX's backend start-up, hidden "
      "by default.")


def _asks_verbose(argv: Sequence[str]) -> bool:
  return any(a in (f"--{FLAG}", f"--{FLAG}=true", f"--{FLAG}=True",
                   f"--{FLAG}=1") for a in argv)


def quiet_native(argv: Sequence[str]) -> None:
  """Asks `tensorflow_loader.import_tensorflow` to hide TensorFlow's native
  INFO start-up lines, unless `argv` holds --verbose_libraries;
  TF_CPP_MIN_LOG_LEVEL=1 is set too (unless set already) for TensorFlow's
  later native INFO lines. Imports nothing."""
  hide = not _asks_verbose(argv)
  tensorflow_loader.hide_start_up_lines(hide)
  if hide:
    os.environ.setdefault(NATIVE_LEVEL_ENV, "1")


def _package_dirs(names: Sequence[str]) -> tuple[str, ...]:
  """The folders of the installed packages `names` (not imported here)."""
  dirs = []
  for name in names:
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
      dirs.extend(os.path.join(os.path.realpath(p), "")
                  for p in spec.submodule_search_locations)
  return tuple(dirs)


class _HideLibraryInfo(logging.Filter):
  """Drops records below WARNING logged from the libraries' files."""

  def __init__(self):
    super().__init__()
    self._dirs = None  # found at the first record

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno >= logging.WARNING:
      return True
    if self._dirs is None:
      self._dirs = _package_dirs(_LIBRARIES)
    return not os.path.realpath(record.pathname).startswith(self._dirs)


_FILTER = _HideLibraryInfo()


def configure(verbose: bool) -> None:
  """Hides (verbose=False) or shows the libraries' INFO lines.

  Orbax logs through absl's logger: a filter on that logger drops its
  records below WARNING (for every handler, before they are formatted);
  JAX's backend probe logger is set to WARNING. Calling it again undoes or
  redoes this.
  """
  absl_logger = logging.getLogger("absl")
  absl_logger.removeFilter(_FILTER)
  for name in _QUIET_LOGGERS:
    logging.getLogger(name).setLevel(logging.NOTSET if verbose
                                     else logging.WARNING)
  if not verbose:
    absl_logger.addFilter(_FILTER)
