"""Beam search's shrink_sizes: once only a few sentences are left, the search
goes on with those alone. It must return, sentence by sentence, what the
search of the whole batch returns (the step functions here compute each row
on its own, so the bits too), through the length stages as well, and the
step function must really see the smaller batches."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha.search import decoding
from mha.search import batches as batch_search
from mha.search.cache_rows import CacheRows

from test_decoding import EOS, GrowingHistoryModel, hypothesis


class PerSentenceModel(GrowingHistoryModel):
  """GrowingHistoryModel whose sentence bias is stored once per sentence
  (`CacheRows.ONE_PER_SENTENCE`) and read by each sentence's rows."""

  def cache_rows(self):
    return dict(super().cache_rows(), src=CacheRows.ONE_PER_SENTENCE)

  def step(self, tokens, cache, record=False):
    sentences = cache['src'].shape[0]
    per_row = jnp.repeat(cache['src'], tokens.shape[0] // sentences, axis=0)
    logits, new = super().step(tokens, dict(cache, src=per_row), record)
    return logits, dict(new, src=cache['src'])


@pytest.mark.parametrize('beam, num_best', [(3, None), (2, 1)])
def test_shrinking_returns_the_whole_batchs_search(beam, num_best):
  model = PerSentenceModel(seed=12, batch_size=8, max_len=10)
  limits = jnp.asarray([10, 3, 7, 5, 9, 2, 6, 4], jnp.int32)
  rows_seen = []

  def step(tokens, cache):
    jax.debug.callback(lambda _: rows_seen.append(tokens.shape[0]),
                       cache['cache_index'])
    return model.step(tokens, cache)

  def search(shrink_sizes, stages):
    return jax.jit(lambda cache, limits: decoding.beam_search(
        step, cache, 8, beam, 0.6, 10, EOS, limits, stage_lengths=stages,
        grow_cache=model.grow_cache, cache_rows=model.cache_rows(),
        num_best=num_best, shrink_sizes=shrink_sizes))

  whole = [np.asarray(x) for x in search((), ())(
      model.init_cache(length=10), limits)]
  jax.effects_barrier()
  assert set(rows_seen) == {8 * beam}
  assert len({len(hypothesis(t)) for t in whole[0][:, 0]}) > 3
  # With a first stage of 6 positions: 4 sentences are left after step 5,
  # then the cache grows for them; no shrinking after a growth.
  for stages, sizes in [((), {8, 4, 2}), ((6,), {8, 4})]:
    rows_seen.clear()
    shrunk = [np.asarray(x) for x in jax.block_until_ready(
        search((4, 2), stages)(model.init_cache(length=(stages or (10,))[0]),
                               limits))]
    jax.effects_barrier()
    keep = beam if num_best is None else num_best
    np.testing.assert_array_equal(shrunk[0][:, :keep], whole[0][:, :keep])
    np.testing.assert_array_equal(shrunk[1][:, :keep], whole[1][:, :keep])
    # The whole batch, then 4 sentences, then 2.
    assert set(rows_seen) == {n * beam for n in sizes}, rows_seen
    assert rows_seen == sorted(rows_seen, reverse=True)


def test_shrink_sizes_must_decrease():
  model = PerSentenceModel(seed=12, batch_size=4, max_len=5)
  for sizes in [(4,), (2, 2), (0,)]:
    with pytest.raises(ValueError, match='shrink_sizes'):
      decoding.beam_search(model.step, model.init_cache(length=5), 4, 2, 0.6,
                           5, EOS, cache_rows=model.cache_rows(),
                           shrink_sizes=sizes)


def test_translate_shrinks_to_no_fewer_than_min_search_rows():
  assert batch_search.MIN_SEARCH_ROWS == 64
  assert batch_search.shrink_sizes(64, 4) == (32, 16)
  assert batch_search.shrink_sizes(40, 4) == (20,)
  assert batch_search.shrink_sizes(16, 4) == ()
  assert batch_search.shrink_sizes(256, 1) == (128, 64)
