"""XLA's persistent compilation cache, for every command (mha/cli/).

Compiling the train step or a beam search takes seconds to tens of seconds
per input shape, and a research loop recompiles the same shapes over and
over: every resume, every evaluation of a new checkpoint. With the cache on,
jax stores each compiled executable under a key of the program, the jax
version and the devices, and a later process with the same shapes loads it
instead of compiling (what it saves: bench/README.md).

train.py and eval.py turn it on by default (`--compilation_cache_dir`):
$MHA_COMPILATION_CACHE_DIR, else jax's own $JAX_COMPILATION_CACHE_DIR, else
$XDG_CACHE_HOME/mha/jax (~/.cache/mha/jax); '' turns it off. Any path jax
accepts works, e.g. a gs:// bucket shared by the hosts of a TPU pod slice.
Only programs that took at least
`jax_persistent_cache_min_compile_time_secs` (1 s by default) to compile
are stored.
"""
import os

from absl import flags
from absl import logging

from mha.runtime import files

ENV = "MHA_COMPILATION_CACHE_DIR"


def default_dir() -> str:
  """$MHA_COMPILATION_CACHE_DIR, else $JAX_COMPILATION_CACHE_DIR, else
  $XDG_CACHE_HOME/mha/jax."""
  for name in (ENV, "JAX_COMPILATION_CACHE_DIR"):
    if os.environ.get(name) is not None:
      return os.environ[name]
  cache_home = (os.environ.get("XDG_CACHE_HOME") or
                os.path.join(os.path.expanduser("~"), ".cache"))
  return os.path.join(cache_home, "mha", "jax")


def enable(path: str | None = None) -> str | None:
  """Turns on jax's persistent compilation cache in `path`.

  Call before anything is compiled. A local directory that cannot be
  created only logs a warning: the cache saves time, the run does not need
  it.

  Args:
    path: the cache directory (`~` expanded); None = `default_dir()`; ''
      = off.

  Returns:
    The directory in use, or None when off.
  """
  import jax  # pylint: disable=g-import-not-at-top  (defining the flag needs none)
  if path is None:
    path = default_dir()
  if not path:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  if not files.has_scheme(path):
    path = os.path.expanduser(path)
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      logging.warning("No compilation cache: cannot create %s (%s).", path, e)
      jax.config.update("jax_enable_compilation_cache", False)
      return None
  jax.config.update("jax_compilation_cache_dir", path)
  logging.info("XLA compilation cache: %s", path)
  return path


def define_flag() -> None:
  """The `--compilation_cache_dir` flag of train.py and eval.py."""
  flags.DEFINE_string(
      "compilation_cache_dir", None,
      "XLA's persistent compilation cache: later runs load what earlier "
      "ones compiled (default $MHA_COMPILATION_CACHE_DIR, else "
      "$JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/mha/jax or "
      "~/.cache/mha/jax; '' = off).")
