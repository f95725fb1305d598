"""Greedy search with refilled rows (`refill.greedy_refill`): a row whose
sentence is done takes the next one. Each sentence's output must be the
one greedy search gives it alone, and the Transformer's refilled search
must give every row of every batch what the batch's own search gives."""
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_tiny_transformer
from mha.search import decoding
from mha.search import batches as batch_search
from mha.search import refill
from mha.search.cache_rows import CacheRows
from mha.search.settings import SearchSettings
from mha.search import texts as translate

EOS = 1
VOCAB = 6


class ToyModel:
  """Logits of a row from its sentence, its position, its last token and
  the tokens it has written (`history`, one column per output position of
  the stage, read only below the row's position): the cache of a step
  function that keeps one position per row."""

  def __init__(self, num_sentences, max_len, seed=0):
    rng = np.random.default_rng(seed)
    self.w = rng.normal(0, 1.5, (num_sentences, max_len, VOCAB)).astype(
        np.float32)
    self.u = rng.normal(0, 1.0, (VOCAB, VOCAB)).astype(np.float32)

  def init_cache(self, rows, length):
    return {'pos': jnp.zeros((rows,), jnp.int32),
            'src': jnp.arange(rows, dtype=jnp.int32),
            'history': jnp.zeros((rows, length), jnp.int32)}

  def step(self, tokens, cache):
    pos, history = cache['pos'], cache['history']
    rows = jnp.arange(history.shape[0])
    # The token fed now is the output at position pos - 1.
    history = history.at[rows, jnp.where(pos > 0, pos - 1, 1 << 20)].set(
        tokens[:, 0], mode='drop')
    written = jnp.arange(history.shape[1])[None] < pos[:, None]
    counts = jnp.sum((history[:, :, None] == jnp.arange(VOCAB))
                     & written[:, :, None], axis=1)  # [rows, V]
    w = jnp.asarray(self.w)[cache['src'], jnp.minimum(
        pos, self.w.shape[1] - 1)]
    logits = w + jnp.asarray(self.u)[tokens[:, 0]] - 0.7 * counts
    return logits, dict(cache, pos=pos + 1, history=history)

  def start_rows(self, cache, start, sentence):
    return dict(cache, pos=jnp.where(start, 0, cache['pos']),
                src=jnp.where(start, sentence, cache['src']))

  def grow_cache(self, cache, length):
    history = cache['history']
    return dict(cache, history=jnp.pad(
        history, ((0, 0), (0, length - history.shape[1]))))

  def greedy(self, sentence, limit):
    """The sentence's greedy output and log P(Y | X), in NumPy."""
    tokens, logprob, last = [], 0.0, 0
    for pos in range(limit):
      logits = self.w[sentence, pos] + self.u[last] - 0.7 * np.bincount(
          tokens, minlength=VOCAB)
      log_probs = logits - np.log(np.sum(np.exp(logits - logits.max()))) \
          - logits.max()
      last = int(np.argmax(logits))
      tokens.append(last)
      logprob += float(log_probs[last])
      if last == EOS:
        break
    return tokens, logprob


def test_refilled_greedy_equals_each_sentences_greedy_search():
  num_sentences, rows, max_len = 13, 4, 9
  model = ToyModel(num_sentences, max_len, seed=3)
  limits = np.random.default_rng(1).integers(1, max_len + 1, num_sentences)
  steps = []  # the room of each step run
  step = recording_rooms(model.step, steps)

  for stages in [(), (4,), (2, 3, 4)]:
    steps.clear()
    tokens, scores, log_probs = jax.jit(
        lambda cache, limits, stages=stages: refill.greedy_refill(
            step, cache, model.start_rows, rows, max_len, EOS, limits,
            alpha=0.6, stage_lengths=stages, grow_cache=model.grow_cache))(
                model.init_cache(rows, (stages or (max_len,))[0]),
                jnp.asarray(limits, jnp.int32))
    jax.effects_barrier()
    found = []
    for i in range(num_sentences):
      want, want_logprob = model.greedy(i, int(limits[i]))
      found.append(len(want))
      np.testing.assert_array_equal(
          np.asarray(tokens[i]), want + [0] * (max_len - len(want)))
      np.testing.assert_allclose(float(log_probs[i]), want_logprob,
                                 rtol=1e-5)
      np.testing.assert_allclose(
          float(scores[i]),
          want_logprob / decoding.length_penalty(len(want), 0.6), rtol=1e-5)
    # Outputs of many lengths, some past the first stage; and fewer steps
    # than batches of `rows` sentences that each wait for their longest.
    assert len(set(found)) > 4 and max(found) > 4
    batched = sum(max(found[i:i + rows])
                  for i in range(0, num_sentences, rows))
    assert len(steps) < batched, (len(steps), batched)
    if len(stages) > 1:
      assert_climbs_and_comes_down(steps, list(stages) + [max_len])


def recording_rooms(step_fn, rooms):
  """`step_fn` appending the room of its cache (`history`'s length) to
  `rooms` at every step it runs."""
  def step(tokens, cache):
    room = cache['history'].shape[1]
    jax.debug.callback(lambda: rooms.append(room))
    return step_fn(tokens, cache)
  return step


def assert_climbs_and_comes_down(rooms, ladder):
  """The rooms of a refilled search's steps: every room of the ladder
  used, and back down after a climb (a step in a smaller room after one in
  a larger), as the rows' positions fall when they take new sentences."""
  assert set(rooms) == set(ladder), (rooms, ladder)
  assert any(b < a for a, b in zip(rooms, rooms[1:])), rooms
  assert rooms[0] == ladder[0]


def test_a_refilled_searchs_rooms_are_its_batches_first_stages():
  # Batches of sources padded to 24, 24 and 16: rooms of 16 + 3 and 24 + 3,
  # then the output length; one batch: its own first stage alone.
  static = batch_search._static  # pylint: disable=protected-access
  assert static([24, 24, 16], 32, 3) == dict(max_decode_len=32,
                                             stage_lengths=(19, 27))
  assert static([30, 16], 32, 3) == dict(max_decode_len=32,
                                         stage_lengths=(19,))
  assert static([16], 32, 3) == dict(max_decode_len=32, stage_lengths=(19,))
  assert static([24, 16], 32, None) == dict(max_decode_len=32,
                                            stage_lengths=())


@pytest.mark.parametrize("beam_size,rungs", [(4, (11, 19)), (1, (19,))])
def test_greedy_search_climbs_from_its_longest_batch_alone(
    monkeypatch, beam_size, rungs):
  # Sources padded to 8, 16 and 8: beam search's ladder has a rung of
  # 8 + 3 and 16 + 3 below the output length; greedy search's only the
  # longest batch's (fewer compiled copies of its step, the same outputs).
  static = []

  def search(params, sources, max_lengths, **kwargs):
    del params, sources, max_lengths
    static.append(kwargs)

  monkeypatch.setattr(batch_search, "refill_fn", lambda *args: search)
  model_config, _ = random_tiny_transformer(vocab_size=16, max_len=64,
                                            seed=0)
  inputs = [np.full((64, n), 5, np.int32) for n in (8, 16, 8)]
  batch_search.refill_batches(
      model_config, None, inputs, [24, 24, 24], beam_size=beam_size,
      eos_id=EOS, first_stage_extra=3)
  assert [(s["stage_lengths"], s["max_decode_len"]) for s in static] == [
      (rungs, 24)]


def _rows_as_alone(model_config, params, batches, refilled, device, kwargs
                   ) -> list[np.ndarray]:
  """The output rows of the refilled search, each batch's asserted equal to
  that batch searched alone (`translate_batch`, the same settings)."""
  rows = []
  for batch, tokens in zip(batches, refilled):
    alone = batch_search.translate_batch(
        model_config, params, batch.inputs, max_decode_len=batch.max_decode_len,
        devices=device, **kwargs)
    np.testing.assert_array_equal(tokens, np.asarray(alone))
    rows += list(tokens)
  return rows


def test_translate_refills_rows_with_the_next_batches_sentences():
  model_config, params = random_tiny_transformer(16, 64, seed=5)
  rng = np.random.default_rng(0)
  # 3 batches of 64 rows, of sources padded to 24 and 16 ids (the shorter
  # ones padded to 24 in the search): one refilled search.
  encoded = [list(rng.integers(3, 16, n - 1)) + [EOS]
             for n in rng.integers(11, 21, 3 * 64 - 5)]
  batches = translate.make_batches(encoded, batch_size=64, max_len=64,
                                   max_decode_extra=8)
  assert [b.inputs.shape for b in batches] == [(64, 24), (64, 24), (64, 16)]
  device = jax.local_devices()[:1]
  assert translate._refill_groups(batches, tuple(device)) == [[0, 1, 2]]  # pylint: disable=protected-access
  kwargs = dict(beam_size=1, alpha=0.6, max_decode_extra=8, eos_id=EOS)
  compiled = []  # the programs XLA compiled
  search = batch_search.refill_fn(model_config, SearchSettings(beam_size=1),
                                  EOS)
  # This model's greedy search may have been compiled for other batches by
  # another test in this process (test_decoding_hooks.py's).
  before = search._cache_size()  # pylint: disable=protected-access

  def listener(event, start, end, **kw):
    del start, end
    if event == "/jax/core/compile/backend_compile_duration":
      compiled.append(kw.get("fun_name"))

  jax.monitoring.register_event_time_span_listener(listener)
  try:
    refilled = translate.decode_batches(model_config, params, batches,
                                        devices=device, **kwargs)
  finally:
    jax.monitoring.unregister_event_time_span_listener(listener)
  assert search._cache_size() == before + 1  # pylint: disable=protected-access
  # The search is the one program compiled: its inputs are stacked and its
  # outputs cut on the host, with no small operation compiled around it
  # (which every new process would compile again).
  assert compiled == ["jit(call)"] or compiled == ["jit(search)"], compiled
  lengths = [int(np.flatnonzero(t).max()) + 1 for t in _rows_as_alone(
      model_config, params, batches, refilled, device, kwargs)]
  # Outputs that end early and outputs past the first stage (24 + 3).
  assert min(lengths) < 10 and max(lengths) > 27


class ToyBeamModel(ToyModel):
  """ToyModel for beam search: its sentence stored once per slot
  (`CacheRows.ONE_PER_SENTENCE`), its history per hypothesis (reordered
  with the beam), its positions per row (the same for a slot's rows)."""

  beam_size = 3

  def init_cache(self, rows, length):
    slots = rows // self.beam_size
    return dict(super().init_cache(rows, length),
                src=jnp.arange(slots, dtype=jnp.int32))

  def cache_rows(self):
    return {'pos': CacheRows.SHARED,
            'src': CacheRows.ONE_PER_SENTENCE,
            'history': CacheRows.HYPOTHESIS}

  def step(self, tokens, cache):
    per_row = jnp.repeat(cache['src'], self.beam_size)
    logits, new = super().step(tokens, dict(cache, src=per_row))
    return logits, dict(new, src=cache['src'])

  def start_rows(self, cache, start, sentence):
    rows = jnp.repeat(start, self.beam_size)
    return dict(cache, pos=jnp.where(rows, 0, cache['pos']),
                src=jnp.where(start, sentence, cache['src']))


def test_refilled_beam_search_equals_the_whole_batchs_search():
  num_sentences, slots, max_len = 11, 3, 9
  model = ToyBeamModel(num_sentences, max_len, seed=4)
  beam = model.beam_size
  limits = jnp.asarray(np.random.default_rng(2).integers(
      2, max_len + 1, num_sentences), jnp.int32)
  whole = jax.jit(lambda cache: decoding.beam_search(
      model.step, cache, num_sentences, beam, 0.6, max_len, EOS, limits,
      cache_rows=model.cache_rows(), num_best=1, with_log_probs=True))(
          model.init_cache(num_sentences * beam, max_len))
  lengths = [int(np.count_nonzero(t)) for t in np.asarray(whole[0][:, 0])]
  assert len(set(lengths)) > 3
  rooms = []
  step = recording_rooms(model.step, rooms)

  for stages in [(), (4,), (2, 4, 6)]:
    rooms.clear()
    found = jax.jit(lambda cache, stages=stages: refill.beam_refill(
        step, cache, model.start_rows, slots, beam, 0.6, max_len, EOS,
        limits, model.cache_rows(), stage_lengths=stages,
        grow_cache=model.grow_cache))(
            model.init_cache(slots * beam, (stages or (max_len,))[0]))
    for ours, theirs in zip(found, whole):
      np.testing.assert_array_equal(np.asarray(ours),
                                    np.asarray(theirs[:, 0]))
    jax.effects_barrier()
    if len(stages) > 1:
      assert_climbs_and_comes_down(rooms, list(stages) + [max_len])


def nan_logits_search_ends_as_the_whole_batchs():
  """(Run by the test below in a subprocess.) NaN scores settle no
  comparison of the stopping rule: each slot must still end at its length
  limit (it ran forever), with what the whole batch's search (its loop
  bounded by the output length) gives."""
  num_sentences, slots, max_len = 5, 2, 6
  model = ToyBeamModel(num_sentences, max_len, seed=4)
  model.w[:] = np.nan
  beam = model.beam_size
  limits = jnp.asarray([3, 6, 2, 5, 4], jnp.int32)
  whole = jax.jit(lambda cache: decoding.beam_search(
      model.step, cache, num_sentences, beam, 0.6, max_len, EOS, limits,
      cache_rows=model.cache_rows(), num_best=1, with_log_probs=True))(
          model.init_cache(num_sentences * beam, max_len))
  found = jax.jit(lambda cache: refill.beam_refill(
      model.step, cache, model.start_rows, slots, beam, 0.6, max_len, EOS,
      limits, model.cache_rows()))(model.init_cache(slots * beam, max_len))
  for ours, theirs in zip(found, whole):
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs[:, 0]))


def test_refilled_beam_search_of_nan_logits_ends_as_the_whole_batchs():
  # A subprocess: a search that never ends fails the test at the timeout
  # instead of hanging the suite.
  tests = os.path.dirname(os.path.abspath(__file__))
  subprocess.run(
      [sys.executable, "-c", "import test_translate_refill as t; "
       "t.nan_logits_search_ends_as_the_whole_batchs()"],
      cwd=tests, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
          [tests, os.path.dirname(tests)])),
      check=True, timeout=120, capture_output=True)


def test_translate_refills_beam_slots_with_the_next_batches_sentences():
  model_config, params = random_tiny_transformer(16, 64, seed=6)
  rng = np.random.default_rng(1)
  # 4 batches of 16 sentences (64 rows with 4 hypotheses each), the last
  # of 12 and of another source length: one refilled search of 16 slots.
  encoded = [list(rng.integers(3, 16, n - 1)) + [EOS]
             for n in rng.integers(5, 17, 3 * 16 + 12)]
  batches = translate.make_batches(encoded, batch_size=16, max_len=64,
                                   max_decode_extra=8)
  assert [b.inputs.shape for b in batches] == [(16, 16)] * 3 + [(16, 8)]
  device = jax.local_devices()[:1]
  assert translate._refill_groups(batches, tuple(device), 4) == [  # pylint: disable=protected-access
      [0, 1, 2, 3]]
  kwargs = dict(beam_size=4, alpha=0.6, max_decode_extra=8, eos_id=EOS)
  refilled = translate.decode_batches(model_config, params, batches,
                                      devices=device, **kwargs)
  assert batch_search.refill_fn(model_config, SearchSettings(beam_size=4),
                                EOS)._cache_size() == 1  # pylint: disable=protected-access
  lengths = [int(np.count_nonzero(t)) for t in _rows_as_alone(
      model_config, params, batches, refilled, device, kwargs)]
  assert min(lengths) < 10 and max(lengths) > 19


def test_a_sharded_refilled_search_orders_each_devices_share_of_every_batch():
  # Batches of 4 and 2 rows on 2 devices: device 0 takes rows 0, 1 of the
  # first and row 4 (the second's first), device 1 the rest.
  order = batch_search._device_major([4, 2], 2)  # pylint: disable=protected-access
  np.testing.assert_array_equal(order, [0, 1, 4, 2, 3, 5])
  outputs = np.arange(6)[order, None] * np.ones((1, 3), int)
  back = batch_search.refilled_outputs(outputs, [4, 2], [3, 2], 2)
  np.testing.assert_array_equal(back[0][:, 0], [0, 1, 2, 3])
  np.testing.assert_array_equal(back[1], [[4, 4], [5, 5]])


@pytest.mark.parametrize("beam_size,batch_size", [(4, 32), (1, 128)])
def test_a_refilled_search_over_two_devices_gives_each_batchs_outputs(
    beam_size, batch_size):
  # Each device searches its half of every batch with refilled slots (64
  # rows each); every batch gets the outputs one device gives it.
  model_config, params = random_tiny_transformer(16, 64, seed=7)
  rng = np.random.default_rng(2)
  encoded = [list(rng.integers(3, 16, n - 1)) + [EOS]
             for n in rng.integers(3, 17, 3 * batch_size)]
  batches = translate.make_batches(encoded, batch_size=batch_size,
                                   max_len=64, max_decode_extra=8)
  assert len({b.inputs.shape[1] for b in batches}) == 2
  two, one = tuple(jax.local_devices()[:2]), tuple(jax.local_devices()[:1])
  assert translate._refill_groups(batches, two, beam_size) == [[0, 1, 2]]  # pylint: disable=protected-access
  kwargs = dict(beam_size=beam_size, alpha=0.6, max_decode_extra=8,
                eos_id=EOS)
  search = batch_search.refill_fn(
      model_config, SearchSettings(beam_size=beam_size), EOS)
  compiled = search._cache_size()  # pylint: disable=protected-access
  refilled = translate.decode_batches(model_config, params, batches,
                                      devices=two, **kwargs)
  assert search._cache_size() == compiled + 1  # pylint: disable=protected-access
  # The one search ran on both devices, its outputs in their order.
  outputs = batch_search.refill_batches(
      model_config, batch_search.replicate(params, two),
      [b.inputs for b in batches], [b.max_decode_len for b in batches],
      first_stage_extra=batch_search.FIRST_STAGE_EXTRA, beam_stop="exact",
      devices=two, **kwargs)
  assert search._cache_size() == compiled + 1  # pylint: disable=protected-access
  assert outputs.sharding.device_set == set(two)
  # The same search on one device gives each batch's own search's outputs
  # (the tests above).
  for tokens, expected in zip(refilled, translate.decode_batches(
      model_config, params, batches, devices=one, **kwargs)):
    np.testing.assert_array_equal(tokens, expected)


def test_the_default_batch_is_refilled_on_any_number_of_devices():
  # CPU devices (the cores of one host) share 64 sentences, split evenly,
  # or take more where a device would have fewer than 64 search rows;
  # accelerators take 64 sentences each. Either way every device has
  # enough rows for a refilled search; a batch size given is kept.
  expected = {(1, 1): 64, (1, 4): 64, (2, 1): 128, (2, 4): 64,
              (3, 1): 192, (3, 4): 66, (4, 1): 256, (4, 4): 64}
  for (n, beam), size in expected.items():
    devices = tuple(jax.local_devices()[:n])
    assert translate.batch_size_for(None, devices, beam) == size, (n, beam)
    assert size % n == 0
    assert batch_search.device_rows(size, beam, n) >= (
        batch_search.MIN_SEARCH_ROWS)
    assert translate.batch_size_for(16, devices, beam) == 16
  assert translate.batch_size_for(None, beam_size=4) == 64  # 4 CPU devices
  tpus = tuple(types.SimpleNamespace(platform="tpu") for _ in range(8))
  for beam in (1, 4):
    assert translate.batch_size_for(None, tpus, beam) == 512


def test_refill_groups_count_the_rows_each_device_searches():
  def batches(*rows):
    return [translate.DecodeBatch(np.arange(n), np.ones((n, 8), np.int32), 16)
            for n in rows]

  one, two, three = (tuple(jax.local_devices()[:n]) for n in (1, 2, 3))
  groups = translate._refill_groups  # pylint: disable=protected-access
  # Beam 4: 16 sentences are 64 rows on one device, 32 on each of two.
  assert groups(batches(16, 16, 16), one, 4) == [[0, 1, 2]]
  assert groups(batches(16, 16, 16), two, 4) == [[0], [1], [2]]
  assert groups(batches(32, 32, 16), two, 4) == [[0, 1], [2]]
  # 32 rows do not split over 3 devices (searched on the default device),
  # 48 do: a group's batches share their devices.
  assert groups(batches(32, 32, 48, 48), three, 4) == [[0, 1], [2, 3]]
