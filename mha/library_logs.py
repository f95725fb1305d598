"""The libraries' own log lines, hidden by default in train.py and eval.py.

TensorFlow prints native INFO lines when it loads (oneDNN, and absl's
"All log messages before absl::InitializeLog()" notice), JAX logs the
backends it could not start (INFO), and Orbax logs about 40 INFO lines per
checkpoint. The entry points hide these and keep the project's own lines,
warnings and errors of every library; `--verbose_libraries` shows them:

    from mha import library_logs
    library_logs.quiet_native(sys.argv)   # TensorFlow, once imported: quiet
    library_logs.define_flag()
    ...
    library_logs.configure(FLAGS.verbose_libraries)   # in main()

TensorFlow is imported only where it is used, through `import_tensorflow`
(the data of a TFDS dataset by name; a local parallel_text folder or the
synthetic pair never import it). Calling the library
(`trainer.train_and_evaluate`) directly changes nothing.
"""
import importlib.util
import logging
import os
import re
import sys
import tempfile
from typing import Sequence

from absl import flags

from mha.errors import ConfigError

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


# TensorFlow's native start-up lines: absl INFO lines ("I0000 00:00:...
# port.cc:153] oneDNN custom operations are on...") and absl's notice that
# precedes them. TensorFlow 2.21 writes them before its log threshold
# (TF_CPP_MIN_LOG_LEVEL) applies.
_NATIVE_INFO = re.compile(
    r"^(I\d{4} [\d:. ]+\d+ \S+:\d+\] |WARNING: All log messages before "
    r"absl::InitializeLog\(\) is called are written to STDERR$)")


def is_native_info(line: str) -> bool:
  """Whether `line` is one of TensorFlow's native INFO start-up lines."""
  return bool(_NATIVE_INFO.match(line))


def _import_tensorflow() -> None:
  import tensorflow  # pylint: disable=import-outside-toplevel,unused-import  # noqa: F401


# Whether `import_tensorflow` hides TensorFlow's start-up lines: asked by the
# entry points (`quiet_native`), not by library use.
_hide_native = False


def quiet_native(argv: Sequence[str]) -> None:
  """Asks `import_tensorflow` to hide TensorFlow's native INFO start-up lines,
  unless `argv` holds --verbose_libraries; TF_CPP_MIN_LOG_LEVEL=1 is set too
  (unless set already) for TensorFlow's later native INFO lines. Imports
  nothing."""
  global _hide_native
  _hide_native = not _asks_verbose(argv)
  if _hide_native:
    os.environ.setdefault(NATIVE_LEVEL_ENV, "1")


# How to install TensorFlow: the optional part of the install (pyproject's
# [tfds] extra, locked in requirements-tfds.txt).
INSTALL_TENSORFLOW = ("pip install -r requirements-tfds.txt (or pip install "
                      "'mha[tfds]')")


def import_tensorflow(needed_for: str = "This") -> int:
  """Imports TensorFlow: code about to use it (directly or through
  tensorflow_datasets) calls this first. Its native INFO start-up lines are
  hidden if `quiet_native` asked; its other native output (warnings, errors)
  is printed once the import is done. Once imported, TensorFlow prints
  nothing more when it loads.

  Args:
    needed_for: what needs it, for the message when it is not installed
      (e.g. "config.dataset_name='wmt14_translate/de-en' (a TFDS dataset by
      name)").

  Returns:
    The number of lines hidden.

  Raises:
    ConfigError: TensorFlow is not installed (the core install leaves it
      out); the message names the install command.
  """
  if (sys.modules.get("tensorflow") is None
      and importlib.util.find_spec("tensorflow") is None):
    raise ConfigError(f"{needed_for} needs TensorFlow, which the core "
                      f"install leaves out: {INSTALL_TENSORFLOW}.")
  if not _hide_native or "tensorflow" in sys.modules:
    _import_tensorflow()
    return 0
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      _import_tensorflow()
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      lines = captured.read().decode("utf-8", "replace").splitlines(True)
  kept = [line for line in lines if not is_native_info(line)]
  if kept:
    sys.stderr.write("".join(kept))
  return len(lines) - len(kept)


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
