"""Decoding on every local device (issue 18): the sentences of a batch are
split over the 4 fake CPU devices of tests/conftest.py, and the
translations equal those of one device."""
import jax
import numpy as np
import pytest

from conftest import random_tiny_transformer
from mha.search import batches as batch_search
from mha.search import texts as translate

EOS = 1


@pytest.fixture(scope="module")
def model():
  # paper_reference's random parameters (nothing to compile). The outputs
  # differ from sentence to sentence at least in length (each runs to its
  # source length + 6), so a sentence given another's row would show.
  model_config, params = random_tiny_transformer(32, 32, seed=3)
  rng = np.random.default_rng(0)
  encoded = [list(rng.integers(3, 32, n - 1)) + [EOS]
             for n in rng.integers(2, 12, 11)]
  return model_config, params, encoded


def test_four_devices_equal_one_device(model):
  model_config, params, encoded = model
  devices = jax.local_devices()
  assert len(devices) == 4  # tests/conftest.py
  # 11 sentences in batches of 8: 8 and 3, each in 8 rows split 4 ways.
  batches = translate.make_batches(encoded, batch_size=8, max_len=32,
                                   max_decode_extra=6)
  assert [(b.inputs.shape[0], len(b.indices)) for b in batches] == [
      (8, 8), (8, 3)]
  kwargs = dict(beam_size=3, alpha=0.6, max_decode_extra=6, eos_id=EOS)
  four = translate.decode_batches(model_config, params, batches,
                                  devices=devices, **kwargs)
  one = translate.decode_batches(model_config, params, batches,
                                 devices=devices[:1], **kwargs)
  for a, b in zip(four, one):
    np.testing.assert_array_equal(a, b)
  outputs = {tuple(row) for o, b in zip(one, batches)
             for row in o[:len(b.indices)]}
  assert len(outputs) > 5  # not one output for all
  # The 4-device search ran on all four, each holding its own rows.
  sharded = batch_search.translate_batch(
      model_config, batch_search.replicate(params, tuple(devices)),
      batches[0].inputs, max_decode_len=batches[0].max_decode_len,
      devices=devices, **kwargs)
  assert sharded.sharding.device_set == set(devices)
  assert {s.data.shape for s in sharded.addressable_shards} == {
      (2, batches[0].max_decode_len)}
  np.testing.assert_array_equal(np.asarray(sharded), one[0])


def test_rows_and_devices_of_a_batch():
  assert [translate.search_rows(n) for n in (1, 2, 3, 5, 8, 9, 17)] == [
      1, 2, 4, 8, 8, 16, 24]
  # One sentence (standard input) is one search row, not eight.
  (lone,) = translate.make_batches([[5, 6, EOS]], batch_size=64, max_len=32,
                                   max_decode_extra=4)
  assert lone.inputs.shape == (1, 8)
  # A job of one batch has the rows its sentences need; of several, each
  # batch has a full one's (the last one's spare rows empty): the same
  # search program serves them all.
  assert [b.inputs.shape[0] for b in translate.make_batches(
      [[5, EOS]] * 3, batch_size=64, max_len=32, max_decode_extra=4)] == [4]
  several = translate.make_batches([[5, 6, EOS]] * 20, batch_size=16,
                                   max_len=32, max_decode_extra=4)
  assert [(b.inputs.shape, len(b.indices)) for b in several] == [
      ((16, 8), 16), ((16, 8), 4)]
  assert not several[1].inputs[4:].any()
  devices = tuple(jax.local_devices())
  assert batch_search.search_devices(8, devices) == devices
  assert batch_search.search_devices(4, devices) == devices
  assert batch_search.search_devices(2, devices) == ()  # the default device
  assert batch_search.search_devices(8, devices[:1]) == ()
