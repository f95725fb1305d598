"""The traced searches kept on disk (`mha.search.trace_cache`): a later process
gets the same outputs without tracing the search again, also for a search
sharded over several devices (one file for any devices of that number);
anything the trace depends on names another file; a bad file is replaced;
without the compilation cache there is no folder to keep them in."""
import functools
import pathlib
import shutil

import jax
import numpy as np
import pytest

from conftest import random_tiny_transformer
from mha.search import batches as batch_search
from mha.runtime import compile_time
from mha.search import decoding
from mha.search import trace_cache as search_cache

EOS = 1
SEARCH = dict(beam_size=3, alpha=0.6, max_decode_extra=6, eos_id=EOS)


@pytest.fixture(scope="module")
def model():
  model_config, params = random_tiny_transformer(32, 32, seed=5)
  rng = np.random.default_rng(1)
  inputs = np.zeros((4, 8), np.int32)
  for row, n in enumerate((3, 8, 5, 6)):
    inputs[row, :n] = list(rng.integers(3, 32, n - 1)) + [EOS]
  return model_config, params, inputs


@pytest.fixture
def folder(tmp_path, monkeypatch):
  """A fresh folder of kept searches, and a fresh process's factories."""
  monkeypatch.setattr(search_cache, "folder", lambda: str(tmp_path))
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access
  yield tmp_path
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access


def _search(model, **changes):
  model_config, params, inputs = model
  return np.asarray(batch_search.translate_batch(
      model_config, params, inputs, devices=(), **dict(SEARCH, **changes)))


def test_a_later_process_loads_the_search_instead_of_tracing_it(
    model, folder, monkeypatch):
  with compile_time.CompileTime() as traced_here:
    first = _search(model)
  assert len(list(folder.glob("*.bin"))) == 1
  # A new process (new factories): the search must come from the file, so
  # tracing it is an error.
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access

  def traced(*args, **kwargs):
    raise AssertionError("the search was traced again")

  with monkeypatch.context() as patch, compile_time.CompileTime() as loaded:
    patch.setattr(decoding, "beam_search", traced)
    again = _search(model)
  np.testing.assert_array_equal(again, first)
  # Reading the file counts with the time of compilations (eval.py's
  # compile_seconds); tracing the search, without a file, did not read one.
  events = lambda block: {event for event, _, _ in block.spans}
  assert compile_time.SEARCH_LOAD_EVENT in events(loaded)
  assert compile_time.SEARCH_LOAD_EVENT not in events(traced_here)
  # The same outputs as the search traced and run without the file.
  monkeypatch.setattr(search_cache, "folder", lambda: None)
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access
  np.testing.assert_array_equal(_search(model), first)
  assert len({tuple(row) for row in first}) == 4  # four different outputs


def test_what_the_trace_depends_on_names_another_file(model, folder,
                                                      monkeypatch):
  _search(model)
  _search(model, alpha=0.7)  # the search's settings
  _search(model, beam_stop="early")
  _search(model, max_decode_extra=9)  # a static argument (its length)
  model_config, params, inputs = model
  batch_search.translate_batch(model_config, params, inputs[:, :5],
                               devices=(), **SEARCH)  # a shape
  assert len(list(folder.glob("*.bin"))) == 5
  # mha's source: a changed line is a new file.
  monkeypatch.setattr(search_cache, "source_hash", lambda: "edited")
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access
  _search(model)
  assert len(list(folder.glob("*.bin"))) == 6
  key = search_cache.file_key(("k",), (np.zeros(3, np.float32),), {})
  assert key != search_cache.file_key(("k",), (np.zeros(3, np.int32),), {})
  with jax.default_matmul_precision("highest"):  # a jax option of traces
    assert key != search_cache.file_key(("k",), (np.zeros(3, np.float32),),
                                        {})


def test_a_bad_file_is_replaced(model, folder):
  first = _search(model)
  (path,) = folder.glob("*.bin")
  path.write_bytes(b"not a serialized search")
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access
  np.testing.assert_array_equal(_search(model), first)
  assert path.read_bytes() != b"not a serialized search"
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access
  np.testing.assert_array_equal(_search(model), first)


def _sharded(model, devices):
  model_config, params, inputs = model
  out = batch_search.translate_batch(model_config, params, inputs,
                                     devices=devices, **SEARCH)
  assert out.sharding.device_set == set(devices)  # the rows stay split
  return np.asarray(out)


def test_a_sharded_search_is_kept_for_any_devices_of_its_number(
    model, folder, monkeypatch):
  devices = jax.local_devices()
  assert len(devices) == 4  # tests/conftest.py: the 4 rows split 2 or 4 ways
  first = _sharded(model, devices[:2])
  (path,) = folder.glob("*.bin")
  # A new process (new factories) on two other devices: the one file
  # serves them (a jax.export names the number of devices, not which),
  # so tracing the search is an error.
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access

  def traced(*args, **kwargs):
    raise AssertionError("the search was traced again")

  with monkeypatch.context() as patch:
    patch.setattr(decoding, "beam_search", traced)
    other = _sharded(model, devices[2:])
  assert list(folder.glob("*.bin")) == [path]
  # The outputs of the search traced and run on those devices without the
  # file, and of the default device's search.
  with monkeypatch.context() as patch:
    patch.setattr(search_cache, "folder", lambda: None)
    batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access
    untraced = _sharded(model, devices[2:])
    np.testing.assert_array_equal(_search(model), untraced)
  np.testing.assert_array_equal(other, untraced)
  np.testing.assert_array_equal(first, untraced)
  assert len({tuple(row) for row in first}) == 4  # four different outputs
  # Four devices: another file, read back as well.
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access
  np.testing.assert_array_equal(_sharded(model, devices), first)
  assert len(list(folder.glob("*.bin"))) == 2
  batch_search._translate_fn.cache_clear()  # pylint: disable=protected-access
  with monkeypatch.context() as patch:
    patch.setattr(decoding, "beam_search", traced)
    np.testing.assert_array_equal(_sharded(model, devices), first)
  assert len(list(folder.glob("*.bin"))) == 2


def _on(devices, spec=jax.sharding.PartitionSpec("rows")):
  return jax.sharding.NamedSharding(
      jax.sharding.Mesh(np.asarray(devices), ("rows",)), spec)


def test_a_sharded_files_name_has_the_devices_number_not_which():
  # The devices (a static argument) and the arrays' placement on them name
  # the file by number, platform and kind: devices 0, 1 share it with 2, 3
  # and 1, 0, not with 0, 1, 2, 3 or the default device.
  devices = jax.local_devices()
  x = np.zeros(4, np.float32)

  def key(placed, spec=jax.sharding.PartitionSpec("rows")):
    return search_cache.file_key(
        ("k",), (jax.device_put(x, _on(placed, spec)),),
        {"devices": tuple(placed)})

  two = key(devices[:2])
  assert two == key(devices[2:]) == key(devices[1::-1])
  assert two != key(devices)
  assert two != key(devices[:2], jax.sharding.PartitionSpec())  # replicated
  assert two != search_cache.file_key(("k",), (x,), {"devices": ()})
  # The devices alone, on an array that names no mesh.
  assert (search_cache.file_key(("k",), (x,), {"devices": tuple(devices[:2])})
          != search_cache.file_key(("k",), (x,), {"devices": tuple(devices)}))


def _doubling(callback=False):
  """A sharded search of the tests' kind: each device doubles its rows (by
  a host callback, which jax cannot export: `callback`)."""
  def local(y):
    if callback:
      return jax.pure_callback(lambda a: 2 * a,
                               jax.ShapeDtypeStruct(y.shape, y.dtype), y)
    return 2 * y

  @functools.partial(jax.jit, static_argnames=("devices",))
  def double(x, *, devices):
    rows = jax.sharding.PartitionSpec("rows")
    return jax.shard_map(local, mesh=_on(devices).mesh, in_specs=rows,
                         out_specs=rows)(x)

  return search_cache.cached(double, ("double", callback))


def test_a_sharded_search_of_unplaced_arrays_is_traced(folder):
  # An export of two devices is called on arrays on two devices: arrays
  # not all placed on the search's devices run the search itself.
  devices = tuple(jax.local_devices()[:2])
  search = _doubling()
  x = np.arange(4, dtype=np.float32)
  np.testing.assert_array_equal(search(x, devices=devices), 2 * x)
  assert not list(folder.glob("*"))
  placed = jax.device_put(x, _on(devices))
  np.testing.assert_array_equal(search(placed, devices=devices), 2 * x)
  assert len(list(folder.glob("*.bin"))) == 1
  # Arrays on two other devices than the search's: refused, as by the
  # search itself (the kept file would run them where they are).
  other = jax.device_put(x, _on(jax.local_devices()[2:]))
  with pytest.raises(ValueError, match="incompatible devices"):
    search(other, devices=devices)


def test_a_sharded_search_jax_cannot_export_runs_on_its_own_devices(folder):
  # Devices 0, 1 and 2, 3 share the file's name; the search that could not
  # be kept runs on each call's devices, not on the first call's.
  search = _doubling(callback=True)
  x = np.arange(4, dtype=np.float32)
  for devices in (jax.local_devices()[:2], jax.local_devices()[2:]):
    out = search(jax.device_put(x, _on(devices)), devices=tuple(devices))
    np.testing.assert_array_equal(out, 2 * x)
    assert out.sharding.device_set == set(devices)
  assert not list(folder.glob("*"))


def test_a_search_jax_cannot_serialize_runs_and_is_not_kept(folder,
                                                           monkeypatch):
  # jax.export's serializer imports flatbuffers when called; without it
  # (an install that lacks it) the search runs as traced, with a warning,
  # and nothing is written.
  def no_flatbuffers(self, *args, **kwargs):
    raise ImportError("Please install 'flatbuffers' in order to use "
                      "Exported serialization")

  monkeypatch.setattr(jax.export.Exported, "serialize", no_flatbuffers)
  warnings = []
  monkeypatch.setattr(search_cache.logging, "warning",
                      lambda *args: warnings.append(args[0] % args[1:]))
  devices = tuple(jax.local_devices()[:2])
  x = jax.device_put(np.arange(4, dtype=np.float32), _on(devices))
  for _ in range(2):
    np.testing.assert_array_equal(_doubling()(x, devices=devices),
                                  2 * np.arange(4))
  assert not list(folder.glob("*"))
  assert len(warnings) == 2 and "flatbuffers" in warnings[0], warnings


def test_folder_follows_the_compilation_cache(tmp_path):
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_enable_compilation_cache)
  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    assert search_cache.folder() == str(tmp_path / search_cache.FOLDER)
    jax.config.update("jax_enable_compilation_cache", False)
    assert search_cache.folder() is None
  finally:
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_enable_compilation_cache", before[1])


def test_source_hash_covers_every_module_of_the_package(tmp_path,
                                                        monkeypatch):
  """A changed line in any module of mha, in a subpackage too (mha/data,
  mha/cli), changes the hash that names the files."""
  root = pathlib.Path(search_cache.__file__).resolve().parents[1]
  copy = tmp_path / "mha"
  for path in root.rglob("*.py"):
    (copy / path.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, copy / path.relative_to(root))
  monkeypatch.setattr(search_cache, "__file__",
                      str(copy / "search" / "trace_cache.py"))
  source_hash = search_cache.source_hash.__wrapped__
  hashes = [source_hash()]
  for edited in ("search/decoding.py", "data/pipeline.py", "cli/eval.py",
                 "errors.py"):
    with open(copy / edited, "a") as f:
      f.write("# edited\n")
    hashes.append(source_hash())
  assert len(set(hashes)) == 5


def test_file_key_names_the_tree_the_x64_option_and_the_backend(
    monkeypatch):
  """The same leaves in another tree, 64-bit types on, or another backend:
  another file."""
  x = np.zeros(3, np.float32)
  key = search_cache.file_key(("k",), ({"a": x},), {})
  assert key != search_cache.file_key(("k",), ((x,),), {})
  with jax.enable_x64(True):
    assert key != search_cache.file_key(("k",), ({"a": x},), {})
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert key != search_cache.file_key(("k",), ({"a": x},), {})
