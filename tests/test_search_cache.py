"""The traced searches kept on disk (`mha.search_cache`): a later process
gets the same outputs without tracing the search again; anything the trace
depends on names another file; a bad file is replaced; a sharded search is
not kept; without the compilation cache there is no folder to keep them
in."""
import jax
import numpy as np
import pytest

from conftest import random_tiny_transformer
from mha import decoding
from mha import search_cache
from mha import translate

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
  translate._translate_fn.cache_clear()  # pylint: disable=protected-access
  yield tmp_path
  translate._translate_fn.cache_clear()  # pylint: disable=protected-access


def _search(model, **changes):
  model_config, params, inputs = model
  return np.asarray(translate.translate_batch(
      model_config, params, inputs, devices=(), **dict(SEARCH, **changes)))


def test_a_later_process_loads_the_search_instead_of_tracing_it(
    model, folder, monkeypatch):
  first = _search(model)
  assert len(list(folder.glob("*.bin"))) == 1
  # A new process (new factories): the search must come from the file, so
  # tracing it is an error.
  translate._translate_fn.cache_clear()  # pylint: disable=protected-access

  def traced(*args, **kwargs):
    raise AssertionError("the search was traced again")

  with monkeypatch.context() as patch:
    patch.setattr(decoding, "beam_search", traced)
    again = _search(model)
  np.testing.assert_array_equal(again, first)
  # The same outputs as the search traced and run without the file.
  monkeypatch.setattr(search_cache, "folder", lambda: None)
  translate._translate_fn.cache_clear()  # pylint: disable=protected-access
  np.testing.assert_array_equal(_search(model), first)
  assert len({tuple(row) for row in first}) == 4  # four different outputs


def test_what_the_trace_depends_on_names_another_file(model, folder,
                                                      monkeypatch):
  _search(model)
  _search(model, alpha=0.7)  # the search's settings
  _search(model, beam_stop="early")
  _search(model, max_decode_extra=9)  # a static argument (its length)
  model_config, params, inputs = model
  translate.translate_batch(model_config, params, inputs[:, :5], devices=(),
                            **SEARCH)  # a shape
  assert len(list(folder.glob("*.bin"))) == 5
  # mha's source: a changed line is a new file.
  monkeypatch.setattr(search_cache, "source_hash", lambda: "edited")
  translate._translate_fn.cache_clear()  # pylint: disable=protected-access
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
  translate._translate_fn.cache_clear()  # pylint: disable=protected-access
  np.testing.assert_array_equal(_search(model), first)
  assert path.read_bytes() != b"not a serialized search"
  translate._translate_fn.cache_clear()  # pylint: disable=protected-access
  np.testing.assert_array_equal(_search(model), first)


def test_a_sharded_search_is_not_kept(model, folder):
  model_config, params, inputs = model
  devices = jax.local_devices()
  assert len(devices) == 4  # tests/conftest.py: the 4 rows split 4 ways
  translate.translate_batch(model_config, params, inputs, devices=devices,
                            **SEARCH)
  assert not list(folder.glob("*"))


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
