"""The traced searches kept on disk beside XLA's compilation cache.

XLA's persistent cache (mha/compilation_cache.py) keeps a compiled search
across processes, but jax must trace the search (Python running the
model's code for every loop of the search) and lower it to find the cache
entry: on a 2-core CPU over a third of a warm eval.py's first call
(bench/README.md). `cached(search, key)` keeps the lowered program of each
call's shapes as a `jax.export` serialization in
`<compilation cache dir>/mha_searches/`, so that a later process
deserializes it instead of tracing, and XLA's cache has its compiled form.

A file's name is a hash of everything the trace depends on: the search's
own key (model config, search settings), the static arguments, the
arguments' tree and shapes, the versions of jax, jaxlib and flax, the
platform, the jax options that change a trace, and the source of every
module of the mha package (a changed line of mha is a new file). Only
searches on the default device are kept (`devices=()`); a sharded search,
or any search while the compilation cache is off, is traced as before.
A file that cannot be read or deserialized is replaced.
"""
import functools
import hashlib
import os
import pathlib
import threading
from typing import Any, Callable

from absl import logging
import flax
import jax
from jax import export as jax_export
import jaxlib

from mha import files

FOLDER = "mha_searches"
# jax options read while tracing (dtypes, precision, promotion).
_TRACE_OPTIONS = ("jax_enable_x64", "jax_default_matmul_precision",
                  "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion",
                  "jax_default_prng_impl")


@functools.cache
def source_hash() -> str:
  """sha256 of the mha package's Python sources (paths and contents)."""
  root = pathlib.Path(__file__).resolve().parent
  digest = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    digest.update(str(path.relative_to(root)).encode())
    digest.update(path.read_bytes())
  return digest.hexdigest()


def folder() -> str | None:
  """`<compilation cache dir>/mha_searches`, or None when the persistent
  compilation cache is off."""
  base = jax.config.jax_compilation_cache_dir
  if not base or not jax.config.jax_enable_compilation_cache:
    return None
  return os.path.join(str(base), FOLDER)


def _aval(x: Any) -> str:
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return f"{x.dtype}{list(x.shape)}"
  return repr(x)


def file_key(key: Any, args: tuple, static: dict) -> str:
  """The hash naming the file of one call's traced search."""
  leaves, tree = jax.tree.flatten(args)
  parts = [repr(key), repr(sorted(static.items())), str(tree),
           ",".join(_aval(x) for x in leaves), jax.__version__,
           jaxlib.__version__, flax.__version__, jax.default_backend(),
           repr([getattr(jax.config, name) for name in _TRACE_OPTIONS]),
           source_hash()]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class Cached:
  """`search(*args, **static)`, traced at most once per machine for each
  shape (see the module docstring)."""

  def __init__(self, search: Callable[..., Any], key: Any):
    self._search = search
    self._key = key
    self._loaded: dict[str, Callable[..., Any]] = {}
    self._lock = threading.Lock()

  def __call__(self, *args, **static) -> Any:
    where = folder()
    if where is None or static.get("devices", ()):
      return self._search(*args, **static)
    name = file_key(self._key, args, static)
    with self._lock:
      if name not in self._loaded:
        self._loaded[name] = self._load(os.path.join(where, f"{name}.bin"),
                                        args, static)
    return self._loaded[name](*args)

  def lower(self, *args, **static) -> Any:
    """The traced search's `lower` (jit's; the file is not read)."""
    return self._search.lower(*args, **static)

  def _cache_size(self) -> int:
    """Programs compiled for this search in this process (a jitted
    function's `_cache_size`): the traced search's and the loaded ones'."""
    # pylint: disable=protected-access
    loaded = [getattr(f, "_cache_size", lambda: 0)()
              for f in self._loaded.values()]
    return self._search._cache_size() + sum(loaded)

  def _load(self, path: str, args: tuple,
            static: dict) -> Callable[..., Any]:
    """The search for these shapes, a function of `args`: its export read
    from `path`, else traced and written there; else (a program jax cannot
    export) the search itself."""
    try:
      if files.exists(path):
        return jax.jit(
            jax_export.deserialize(bytearray(files.read_bytes(path))).call)
    except Exception as e:  # pylint: disable=broad-except  (a bad file)
      logging.warning("Tracing the search again: cannot read %s (%s).",
                      path, e)
    try:
      exported = jax_export.export(self._search)(*args, **static)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("Search not kept: jax cannot export it (%s).", e)
      return functools.partial(self._search, **static)
    try:
      files.write_bytes_atomic(path, exported.serialize())
    except OSError as e:
      logging.warning("Search not kept: cannot write %s (%s).", path, e)
    return jax.jit(exported.call)


def cached(search: Callable[..., Any], key: Any) -> Cached:
  """`search` (a jitted function) with its traces kept on disk under
  `key` (hashable, its repr naming everything its trace depends on besides
  the arguments)."""
  return Cached(search, key)
