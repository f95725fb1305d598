"""TensorFlow, imported only where it is used, with its start-up lines hidden.

TensorFlow prints native INFO lines when it loads (oneDNN, and absl's
"All log messages before absl::InitializeLog()" notice). Code about to use
it (the data of a TFDS dataset by name; a local parallel_text folder or the
synthetic pair never import it) calls `import_tensorflow` first; the entry
points ask for its start-up lines to be hidden (`hide_start_up_lines`,
through `mha.runtime.library_logs.quiet_native`). Calling the library directly
hides nothing.

This module imports nothing of the project but its errors, so the data
layer may use it without importing the entry points' start-up code.
"""
import importlib.util
import os
import re
import sys
import tempfile

from mha.errors import ConfigError

# TensorFlow's native start-up lines: absl INFO lines ("I0000 00:00:...
# port.cc:153] oneDNN custom operations are on...") and absl's notice that
# precedes them. TensorFlow 2.21 writes them before its log threshold
# (TF_CPP_MIN_LOG_LEVEL) applies.
_NATIVE_INFO = re.compile(
    r"^(I\d{4} [\d:. ]+\d+ \S+:\d+\] |WARNING: All log messages before "
    r"absl::InitializeLog\(\) is called are written to STDERR$)")

# How to install TensorFlow: the optional part of the install (pyproject's
# [tfds] extra, locked in requirements-tfds.txt).
INSTALL_TENSORFLOW = ("pip install -r requirements-tfds.txt (or pip install "
                      "'mha[tfds]')")

# Whether `import_tensorflow` hides TensorFlow's start-up lines: asked by the
# entry points, not by library use.
_hide_native = False


def is_native_info(line: str) -> bool:
  """Whether `line` is one of TensorFlow's native INFO start-up lines."""
  return bool(_NATIVE_INFO.match(line))


def hide_start_up_lines(hide: bool) -> None:
  """Whether later `import_tensorflow` calls hide the native INFO lines."""
  global _hide_native
  _hide_native = hide


def _import_tensorflow() -> None:
  import tensorflow  # pylint: disable=import-outside-toplevel,unused-import  # noqa: F401


def import_tensorflow(needed_for: str = "This") -> int:
  """Imports TensorFlow: code about to use it (directly or through
  tensorflow_datasets) calls this first. Its native INFO start-up lines are
  hidden if `hide_start_up_lines` asked; its other native output (warnings,
  errors) is printed once the import is done. Once imported, TensorFlow
  prints nothing more when it loads.

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
