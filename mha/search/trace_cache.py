"""The traced searches kept on disk beside XLA's compilation cache.

XLA's persistent cache (mha/runtime/compilation_cache.py) keeps a compiled
search across processes, but jax must trace the search (Python running the
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
module of the mha package (a changed line of mha is a new file).

A search sharded over several devices (`devices`, a static argument of
mha/search/batches.py's search: `jax.shard_map` over a mesh of them) is
kept too. A `jax.export` names no physical device: its shardings are over a
mesh of logical devices (the mesh's shape and axis names), and a file of
N devices serves any N devices of the platform, the arrays given placed on
them (jax's "device-polymorphic export"). So the file's name has the
devices' number, platform and kind in place of the devices themselves
(whose ids would name another file for devices 2, 3 than for devices 0,
1), and the arguments' placement: each array's mesh (shape, axis names,
platform, device kind) and partition spec. Such a search is kept when each
of its arrays is placed on exactly those devices (`jax.device_put` with a
`NamedSharding`, as mha/search/batches.py puts them); any other sharded call is
traced as before, and so is any search while the compilation cache is off.
A file that cannot be read or deserialized is replaced.
"""
import functools
import hashlib
import os
import pathlib
import threading
import time
from typing import Any, Callable

from absl import logging
import flax
import jax
from jax import export as jax_export
import jaxlib

from mha.runtime import compile_time
from mha.runtime import files

FOLDER = "mha_searches"
# jax options read while tracing (dtypes, precision, promotion).
_TRACE_OPTIONS = ("jax_enable_x64", "jax_default_matmul_precision",
                  "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion",
                  "jax_default_prng_impl")


@functools.cache
def source_hash() -> str:
  """sha256 of the mha package's Python sources (paths and contents)."""
  root = pathlib.Path(__file__).resolve().parents[1]  # mha/
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
  """A leaf's type, and its placement if it is spread over a mesh."""
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    sharding = getattr(x, "sharding", None)
    if (isinstance(sharding, jax.sharding.NamedSharding)
        and len(sharding.device_set) > 1):
      # The abstract mesh: axis names and sizes, axis types, platform and
      # device kind; no device ids.
      return (f"{x.dtype}{list(x.shape)}@{sharding.mesh.abstract_mesh!r}"
              f"{sharding.spec!r}{sharding.memory_kind}")
    return f"{x.dtype}{list(x.shape)}"
  return repr(x)


def _is_devices(value: Any) -> bool:
  return (isinstance(value, (tuple, list)) and bool(value)
          and all(isinstance(d, jax.Device) for d in value))


def _static(value: Any) -> Any:
  """A static argument as it goes into the file's name: a tuple of devices
  as their number, platform and kind (the same for any devices of that
  number and kind, in any process), anything else as itself."""
  if _is_devices(value):
    return ("devices", len(value),
            tuple(f"{d.platform}:{d.device_kind}" for d in value))
  return value


def file_key(key: Any, args: tuple, static: dict) -> str:
  """The hash naming the file of one call's traced search."""
  leaves, tree = jax.tree.flatten(args)
  parts = [repr(key),
           repr(sorted((name, _static(value))
                       for name, value in static.items())),
           str(tree), ",".join(_aval(x) for x in leaves), jax.__version__,
           jaxlib.__version__, flax.__version__, jax.default_backend(),
           repr([getattr(jax.config, name) for name in _TRACE_OPTIONS]),
           source_hash()]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _keepable(args: tuple, devices: Any) -> bool:
  """Whether a call's search can be kept. Its file's name describes an
  array spread over several devices by its `NamedSharding` (`_aval`), so
  any other such array is not kept. With `devices`: all of the default
  platform, and every array argument placed on exactly them (committed,
  a `NamedSharding`), as an export of N devices is called on arguments on
  N devices (else jax would put the call on one device and refuse it)."""
  named = jax.sharding.NamedSharding
  if devices and (not _is_devices(devices) or any(
      d.platform != jax.default_backend() for d in devices)):
    return False
  for x in jax.tree.leaves(args):
    sharding = getattr(x, "sharding", None)
    if devices:
      if not (isinstance(x, jax.Array) and x.committed
              and isinstance(sharding, named)
              and sharding.device_set == set(devices)):
        return False
    elif (sharding is not None and len(sharding.device_set) > 1
          and not isinstance(sharding, named)):
      return False
  return True


class Cached:
  """`search(*args, **static)`, traced at most once per machine for each
  shape (see the module docstring)."""

  def __init__(self, search: Callable[..., Any], key: Any):
    self._search = search
    self._key = key
    self._loaded: dict[str, Callable[..., Any] | None] = {}
    self._lock = threading.Lock()

  def __call__(self, *args, **static) -> Any:
    where = folder()
    if where is None or not _keepable(args, static.get("devices", ())):
      return self._search(*args, **static)
    name = file_key(self._key, args, static)
    with self._lock:
      if name not in self._loaded:
        self._loaded[name] = self._load(os.path.join(where, f"{name}.bin"),
                                        args, static)
      loaded = self._loaded[name]
    if loaded is None:  # not exportable: the search, with these devices
      return self._search(*args, **static)
    return loaded(*args)

  def lower(self, *args, **static) -> Any:
    """The traced search's `lower` (jit's; the file is not read)."""
    return self._search.lower(*args, **static)

  def _cache_size(self) -> int:
    """Programs compiled for this search in this process (a jitted
    function's `_cache_size`): the traced search's and the loaded ones'."""
    # pylint: disable=protected-access
    loaded = [f._cache_size() for f in self._loaded.values()
              if f is not None]
    return self._search._cache_size() + sum(loaded)

  def _load(self, path: str, args: tuple,
            static: dict) -> Callable[..., Any] | None:
    """The search for these shapes, a function of `args`: its export read
    from `path`, else traced and written there; else (a program jax cannot
    export) None, the search itself (called with each call's own static
    arguments: sharded calls of one file's name differ in their devices)."""
    try:
      if files.exists(path):
        start = time.time()
        loaded = jax.jit(
            jax_export.deserialize(bytearray(files.read_bytes(path))).call)
        # Counted with the time of compilations (`mha.runtime.compile_time`).
        jax.monitoring.record_event_time_span(
            compile_time.SEARCH_LOAD_EVENT, start, time.time())
        return loaded
    except Exception as e:  # pylint: disable=broad-except  (a bad file)
      logging.warning("Tracing the search again: cannot read %s (%s).",
                      path, e)
    try:
      exported = jax_export.export(self._search)(*args, **static)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("Search not kept: jax cannot export it (%s).", e)
      return None
    try:
      serialized = exported.serialize()
    except ImportError as e:  # jax's serializer needs flatbuffers
      logging.warning("Search not kept: jax cannot serialize it (%s).", e)
      return jax.jit(exported.call)
    try:
      files.write_bytes_atomic(path, serialized)
    except OSError as e:
      logging.warning("Search not kept: cannot write %s (%s).", path, e)
    return jax.jit(exported.call)


def cached(search: Callable[..., Any], key: Any) -> Cached:
  """`search` (a jitted function) with its traces kept on disk under
  `key` (hashable, its repr naming everything its trace depends on besides
  the arguments)."""
  return Cached(search, key)
