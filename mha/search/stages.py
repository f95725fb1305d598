"""Outputs and cache grown in stages, and a batch shrunk to its sentences
not done: speed-ups of `mha.search.decoding`'s searches, which change none
of their outputs.

Stages: every step attends over the whole self-attention cache and copies
rows of it, so a step costs in proportion to the cache length, `max_decode_len`
(input + 50 for the paper's limit), although nearly every search is over
long before that. With `stage_lengths=(n, ...)` the search first runs with
outputs and cache of `n` positions; only if some sentence is not done after
`n` steps are the state and the cache padded (`grow_cache`) to the next
length and the same loop continues. Every stage runs inside the one jitted
search (the later loops take no step when the search is over), and the
result is the single-stage result: the limits `max_lengths` and the
stopping rule are the same, only the room in the arrays grows.

Shrinks: with `shrink_sizes=(n1, n2, ...)` (`beam_search`'s), once at most
n1 sentences are not done, the search goes on with n1 sentences (those,
and done ones to fill up): their state and cache rows are gathered
(`_take_sentences`: `CacheRows.HYPOTHESIS` and `SENTENCE` leaves by their
rows, `ONE_PER_SENTENCE` leaves by sentence) and the loop, traced again
for the smaller batch, runs on them alone; then n2, and so on. The results
are put back in their sentences' places. The search is the same, sentence
by sentence; the steps of the finished sentences cost nothing more. (Their
rows' arithmetic is the same only if the step function's results for a
row do not depend on the number of rows, which matrix products on some
backends do not promise for small batches: `mha.search.texts` shrinks no
further than `MIN_SEARCH_ROWS`.)
"""

from __future__ import annotations

from typing import Sequence

import jax
from jax import lax
import jax.numpy as jnp

from mha.search.cache_rows import CacheRows, _by_sentence
from mha.search.common import PyTree


def all_stage_lengths(stage_lengths: Sequence[int],
                      max_decode_len: int) -> list[int]:
  """The increasing lengths of the stages, ending with max_decode_len."""
  lengths = sorted({int(n) for n in stage_lengths if 0 < n < max_decode_len})
  return lengths + [max_decode_len]


def _check_grow_cache(lengths: list[int], grow_cache) -> None:
  """Several length stages need `grow_cache` to pad the cache between them."""
  if len(lengths) > 1 and grow_cache is None:
    raise ValueError('stage_lengths needs grow_cache, the function that pads '
                     'the step function\'s cache to a longer output.')


def _run_stages(state, lengths: list[int], body, done, grow, grow_cache,
                result, shrink_sizes: Sequence[int] = (), gather=None):
  """The search loop of `greedy_search` and `beam_search` from `state` to
  its end, through its length stages and shrinks; returns `result(state)`
  of the final state, its outputs padded to the last length.

  The loop runs `body` while the room of the stage (`lengths`) lasts and
  some sentence is not `done` (`[batch]` bool). Out of room, the state's
  outputs are padded (`grow(state, length)`) and so is the step function's
  cache (`grow_cache(cache, length)`), and the loop goes on in the next
  stage; `lax.switch` skips that when every sentence is done (the usual
  case), so that the cache, by far the largest array, is neither padded nor
  copied.

  `shrink_sizes=(n1, n2, ...)` (beam_search's, which gives `gather(state,
  index)`: the state of sentences `index` alone): once at most n1
  sentences are not done, the loop goes on with n1 of them, those first,
  traced again for the smaller batch; then n2, and so on; their results
  are put back in their places. No shrinking after a (rarely reached)
  growth: every path of stages and shrinks is traced and compiled on its
  own.
  """
  _check_grow_cache(lengths, grow_cache)

  def finish(state):
    return result(grow(state, lengths[-1]))

  def run(state, stage: int, level: int):
    smaller = shrink_sizes[level] if level < len(shrink_sizes) else 0

    def cond(state):
      return (state.step < lengths[stage]) & (jnp.sum(~done(state)) > smaller)

    state = lax.while_loop(cond, body, state)
    branches = [finish]  # every sentence done
    if smaller:  # at most `smaller` sentences left
      def shrink(state):
        # The sentences not done first (a stable sort keeps their order).
        index = jnp.argsort(done(state), stable=True)[:smaller]
        part = run(gather(state, index), stage, level + 1)
        return jax.tree.map(lambda whole, x: whole.at[index].set(x),
                            finish(state), part)
      branches.append(shrink)
    if stage + 1 < len(lengths):  # out of room: the next length stage
      def longer(state):
        state = grow(state, lengths[stage + 1])
        return run(state._replace(
            cache=grow_cache(state.cache, lengths[stage + 1])), stage + 1,
                   len(shrink_sizes))
      branches.append(longer)
    if len(branches) == 1:
      return finish(state)
    left = jnp.sum(~done(state))
    branch = jnp.where(left == 0, 0, len(branches) - 1)
    if smaller:
      branch = jnp.where((left > 0) & (left <= smaller), 1, branch)
    return lax.switch(branch, branches, state)

  return run(state, 0, 0)


def _checked_shrink_sizes(shrink_sizes: Sequence[int],
                          batch_size: int) -> tuple[int, ...]:
  """`shrink_sizes` as ints, checked: decreasing, from below `batch_size`,
  positive."""
  shrink_sizes = tuple(int(n) for n in shrink_sizes)
  if any(not 0 < n < m for n, m in zip(shrink_sizes,
                                        (batch_size,) + shrink_sizes)):
    raise ValueError(f'shrink_sizes must decrease from below batch_size = '
                     f'{batch_size} and stay positive, got {shrink_sizes}.')
  return shrink_sizes


def _take_sentences(state, index: jax.Array, kinds: PyTree,
                    batch_size: int):
  """The state (a NamedTuple of `batch_size` sentences) of sentences
  `index` (`[n]`) alone: its fields but `step` and `cache` by their
  leading axis of sentences, its cache's leaves by their rows (`kinds`,
  the `CacheRows` of each)."""

  def leaf(kind: CacheRows, x):
    if kind is CacheRows.SHARED:
      return x
    if kind is CacheRows.ONE_PER_SENTENCE:
      return jnp.take(x, index, axis=0, mode='clip')  # in range
    # A sentence's beam_size rows as one slice, in their order (`rows`).
    return jnp.take(_by_sentence(x, batch_size), index, axis=0,
                    mode='clip').reshape((-1,) + x.shape[1:])

  per_sentence = {
      name: jnp.take(getattr(state, name), index, axis=0, mode='clip')
      for name in state._fields if name not in ('step', 'cache')}
  return state._replace(cache=jax.tree.map(leaf, kinds, state.cache),
                        **per_sentence)
