"""Greedy and beam search with refilled rows: a speed-up of
`mha.search.decoding`'s searches, which changes none of their outputs.

Refilled rows: `greedy_refill` and `beam_refill` search more sentences than
they have rows; a row (a beam's slot of rows) whose sentence is done takes
the next sentence, its position back to 0 (the step function keeps a
position per row), so that no row waits for the batch's longest output.
Each sentence's output is the plain search's, given a step function whose
results for a row depend on that row alone. Their stages are a ladder the
rows go up and down: each step runs in the shortest stage length that holds
every busy row's position (`_refill_stages`).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from mha.data.token_ids import PAD_ID
from mha.search.cache_rows import _first_rows, _row_kinds
from mha.search.common import (NEG_INF, PyTree, TokensToLogits, _pad_axis,
                               _step_logits)
from mha.search.decoding import (StepHook, _BeamState, _beam_done,
                                 _beam_step, _fresh_beams, _greedy_step,
                                 check_beam_stop, length_penalty)
from mha.search.stages import _check_grow_cache, all_stage_lengths


# ---------------------------------------------------- greedy, rows refilled

StartRows = Callable[[PyTree, jax.Array, jax.Array], PyTree]


class _RefillState(NamedTuple):
  sentence: jax.Array  # [rows] the sentence each row searches for
  pos: jax.Array  # [rows] tokens of its output so far
  seqs: jax.Array  # [rows, stage length] its output so far
  last: jax.Array  # [rows] token fed at the next step
  logprob: jax.Array  # [rows] log P(Y | X) of its tokens so far
  live: jax.Array  # [rows] bool: the row's sentence is not done
  next: jax.Array  # [] the first sentence no row has taken yet
  out_seqs: jax.Array  # [sentences, max_decode_len] outputs of done ones
  out_logprob: jax.Array  # [sentences]
  out_length: jax.Array  # [sentences] |Y|
  cache: PyTree


def _refill_step(state: _RefillState, logits: jax.Array, cache: PyTree,
                 limits: jax.Array, eos_id: int, start_rows: StartRows,
                 step_hook: StepHook | None) -> _RefillState:
  """One greedy step of every row (`logits` `[rows, V]`), the outputs of
  the sentences that end kept, and their rows given the next sentences."""
  num_rows, room = state.seqs.shape
  num_sentences = state.out_seqs.shape[0]
  token, token_logprob = _greedy_step(logits, step_hook, state.seqs,
                                      state.pos)  # [rows] each
  token = jnp.where(state.live, token, PAD_ID)
  rows = jnp.arange(num_rows)
  seqs = state.seqs.at[rows, jnp.where(state.live, state.pos, room)].set(
      token, mode='drop')
  logprob = state.logprob + jnp.where(state.live, token_logprob, 0.0)
  length = state.pos + state.live
  limit = jnp.take(limits, state.sentence, mode='clip')
  ends = state.live & ((token == eos_id) | (length >= limit))
  done = jnp.where(ends, state.sentence, num_sentences)  # past the end: none
  live = state.live & ~ends
  start, sentence, next_sentence = _take_next(~live, state.next,
                                              state.sentence, num_sentences)
  return _RefillState(
      sentence=sentence,
      pos=jnp.where(start, 0, length),
      seqs=jnp.where(start[:, None], 0, seqs),
      last=jnp.where(start, PAD_ID, token),
      logprob=jnp.where(start, 0.0, logprob),
      live=live | start,
      next=next_sentence,
      out_seqs=state.out_seqs.at[done, :room].set(seqs, mode='drop'),
      out_logprob=state.out_logprob.at[done].set(logprob, mode='drop'),
      out_length=state.out_length.at[done].set(length, mode='drop'),
      cache=start_rows(cache, start, sentence))


def _take_next(free: jax.Array, next_sentence: jax.Array,
               sentence: jax.Array, num_sentences: int
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Free rows (or slots) take the next sentences, in order: `(start
  [rows] bool: the row begins a sentence, the sentence of each row, the
  first sentence not taken yet)`; a free row left without one keeps its
  done sentence and does not start."""
  taken = next_sentence + jnp.cumsum(free) - 1
  start = free & (taken < num_sentences)
  return (start, jnp.where(start, taken, sentence),
          jnp.minimum(next_sentence + jnp.sum(free), num_sentences))


def _refill_inputs(num_rows: int, rows: str,
                   max_lengths: jax.Array, max_decode_len: int,
                   stage_lengths: tuple[int, ...]
                   ) -> tuple[int, jax.Array, tuple[int, ...]]:
  """(number of sentences, their limits clipped to 1..max_decode_len, the
  stage lengths) of a refilled search, checked: at least one sentence per
  row (or slot)."""
  num_sentences = max_lengths.shape[0]
  if num_sentences < num_rows:
    raise ValueError(f'{num_sentences} sentences for {num_rows} {rows}: '
                     f'expected at least one per {rows[:-1]}.')
  limits = jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, max_decode_len)
  lengths = all_stage_lengths(stage_lengths, max_decode_len)
  return num_sentences, limits, lengths


def greedy_refill(tokens_to_logits: TokensToLogits, cache: PyTree,
                  start_rows: StartRows, num_rows: int, max_decode_len: int,
                  eos_id: int, max_lengths: jax.Array, alpha: float = 0.0,
                  stage_lengths: tuple[int, ...] = (),
                  grow_cache: Callable[[PyTree, int], PyTree] | None = None,
                  step_hook: StepHook | None = None
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Greedy search of more sentences than rows: a row whose sentence is
  done takes the next one (continuous batching), so the step function
  runs `num_rows` rows of live sentences until the last sentences drain.

  Sentence i's output is greedy search's, given a step function whose
  results for a row depend on that row alone (the Transformer's, at a
  fixed number of rows: `mha.search.texts`), each row at its own position.
  Rows 0..num_rows-1 start on sentences 0..num_rows-1; then a freed row
  takes the first sentence not yet taken.

  Args:
    tokens_to_logits: the step function `(tokens [num_rows, 1], cache) ->
      (logits [num_rows, V], cache)`; each row at its own position.
    cache: its cache for sentences 0..num_rows-1, sized for the first
      stage (`stage_lengths`), else for `max_decode_len`.
    start_rows: `(cache, start [num_rows] bool, sentence [num_rows]) ->
      cache` in which every row with `start` begins sentence
      `sentence[row]` afresh (position 0, that sentence's source); other
      rows unchanged.
    num_rows: rows of the step function.
    max_decode_len: the outputs' static length.
    eos_id: end-of-sentence token id.
    max_lengths: int32 `[sentences]`, each sentence's limit on |Y| (<=
      max_decode_len); the number of sentences is its length.
    alpha: length-penalty exponent of the scores.
    stage_lengths, grow_cache: as in `greedy_search`, but a ladder the
      rows go up and down: each step runs in the shortest of the stage
      lengths and `max_decode_len` that has room for every live row's
      position (`_refill_stages`): the rows, at their own positions, climb
      to the next room when a live row reaches its room and come back
      down once no live row is past the room below.
    step_hook: as in `greedy_search`.

  Returns:
    `(tokens [sentences, max_decode_len], scores [sentences], log P(Y | X)
    [sentences])`, as `greedy_search` gives them sentence by sentence.
  """
  num_sentences, limits, lengths = _refill_inputs(
      num_rows, 'rows', max_lengths, max_decode_len, stage_lengths)
  init = _RefillState(
      sentence=jnp.arange(num_rows, dtype=jnp.int32),
      pos=jnp.zeros((num_rows,), jnp.int32),
      seqs=jnp.zeros((num_rows, lengths[0]), jnp.int32),
      last=jnp.full((num_rows,), PAD_ID, jnp.int32),
      logprob=jnp.zeros((num_rows,), jnp.float32),
      live=jnp.ones((num_rows,), jnp.bool_),
      next=jnp.array(num_rows, jnp.int32),
      out_seqs=jnp.zeros((num_sentences, max_decode_len), jnp.int32),
      out_logprob=jnp.zeros((num_sentences,), jnp.float32),
      out_length=jnp.zeros((num_sentences,), jnp.int32),
      cache=cache)

  def cond(state: _RefillState) -> jax.Array:
    room = state.pos < state.seqs.shape[1]
    return jnp.any(state.live) & jnp.all(room | ~state.live)

  def body(state: _RefillState) -> _RefillState:
    logits, cache = _step_logits(tokens_to_logits, state.last[:, None],
                                 state.cache)
    return _refill_step(state, logits, cache, limits, eos_id, start_rows,
                        step_hook)

  _check_grow_cache(lengths, grow_cache)
  stages = functools.partial(
      _refill_stages, cond, body, lambda s: s.live, lambda s: s.pos,
      lambda s, n: s._replace(seqs=_resize_axis(s.seqs, 1, n)), grow_cache,
      lengths)
  state = lax.while_loop(lambda state: jnp.any(state.live), stages, init)
  return (state.out_seqs,
          state.out_logprob / length_penalty(state.out_length, alpha),
          state.out_logprob)


def _resize_axis(x: jax.Array, axis: int, length: int) -> jax.Array:
  """x padded with zeros or cut along `axis` to `length`."""
  if x.shape[axis] >= length:
    return lax.slice_in_dim(x, 0, length, axis=axis)
  return _pad_axis(x, axis, length)


def _refill_stages(cond, body, busy, position, resize, grow_cache,
                   lengths: list[int], state, level: int = 0):
  """A refilled search's steps (`greedy_refill`, `beam_refill`) on a
  ladder of rooms, `lengths` (increasing; the last, the output length).

  Level 0 steps in the first room until a busy slot (`busy(state)`,
  `[slots]`) needs more (its `position` reaches the room). Then level 1
  steps in the next room while some busy slot is past the room below, and
  climbs again in turn if a slot reaches its own room; once no busy slot is
  past the room below, the state (`resize(state, n)`: its outputs' room)
  and the cache are cut back to it (what is cut off no busy slot has
  written) and the level below goes on. So every step runs in the smallest
  room of the ladder that holds every busy slot's position, its cache
  reads, writes and row copies costing in proportion to that room."""
  def needed(s):  # at this level: some busy slot is past the room below
    if not level:
      return jnp.ones((), jnp.bool_)
    return jnp.any(busy(s) & (position(s) >= lengths[level - 1]))

  def at_level(s):
    s = lax.while_loop(lambda s: cond(s) & needed(s), body, s)
    if level + 1 == len(lengths):
      return s

    def climb(s):
      grown = resize(s, lengths[level + 1])._replace(
          cache=grow_cache(s.cache, lengths[level + 1]))
      grown = _refill_stages(cond, body, busy, position, resize, grow_cache,
                             lengths, grown, level + 1)
      cut = lambda x, before: x[tuple(slice(0, n) for n in before.shape)]
      return resize(grown, lengths[level])._replace(
          cache=jax.tree.map(cut, grown.cache, s.cache))

    return lax.cond(jnp.any(busy(s) & (position(s) >= lengths[level])),
                    climb, lambda s: s, s)

  if not level:  # the caller's loop runs level 0 until no slot is busy
    return at_level(state)
  return lax.while_loop(needed, at_level, state)


# ------------------------------------------------------ beam, slots refilled


class _BeamRefillState(NamedTuple):
  sentence: jax.Array  # [slots] the sentence each slot searches for
  step: jax.Array  # [slots] its tokens so far
  active: jax.Array  # [slots] bool: the slot's sentence is not done
  beam: _BeamState  # the slots' search (its step unused: `step` above)
  next: jax.Array  # [] the first sentence no slot has taken yet
  out_seqs: jax.Array  # [sentences, max_decode_len] best of done ones
  out_scores: jax.Array  # [sentences]
  out_logprobs: jax.Array  # [sentences]
  cache: PyTree  # the step function's (the beam's own `cache`: None)


def _beam_refill_step(tokens_to_logits, kinds, eos_id: int, alpha: float,
                      state: _BeamRefillState,
                      step_hook: StepHook | None) -> _BeamRefillState:
  """`beam_search`'s step for every slot, each at its own step."""
  beams, cache = _beam_step(tokens_to_logits, kinds, eos_id, alpha,
                            state.beam, state.cache, state.step, state.active,
                            step_hook)
  return state._replace(
      step=jnp.where(state.active, state.step + 1, state.step),
      beam=beams, cache=cache)


def _beam_refill_next(state: _BeamRefillState, max_lengths: jax.Array,
                      alpha: float, num_best: int, stop: str,
                      start_rows: StartRows) -> _BeamRefillState:
  """The best hypothesis of every slot whose sentence is done kept, and
  the free slots given the next sentences, in slot order."""
  beams = state.beam
  slots, _, room = beams.live_seqs.shape
  num_sentences = state.out_seqs.shape[0]
  done = state.active & _beam_done(beams, state.step, alpha, num_best, stop)
  to = jnp.where(done, state.sentence, num_sentences)  # past the end: none
  start, sentence, next_sentence = _take_next(
      ~state.active | done, state.next, state.sentence, num_sentences)
  fresh = _fresh_beams(jnp.take(max_lengths, sentence, mode='clip'), alpha,
                       beams.live_seqs.shape[1], room)
  beams = beams._replace(**{
      name: jnp.where(start.reshape((slots,) + (1,) * (x.ndim - 1)), x,
                      getattr(beams, name)) for name, x in fresh.items()})
  return state._replace(
      sentence=sentence, step=jnp.where(start, 0, state.step),
      active=(state.active & ~done) | start, beam=beams,
      cache=start_rows(state.cache, start, sentence), next=next_sentence,
      out_seqs=state.out_seqs.at[to, :room].set(
          state.beam.finished_seqs[:, 0], mode='drop'),
      out_scores=state.out_scores.at[to].set(
          state.beam.finished_scores[:, 0], mode='drop'),
      out_logprobs=state.out_logprobs.at[to].set(
          state.beam.finished_logprobs[:, 0], mode='drop'))


def beam_refill(tokens_to_logits: TokensToLogits, cache: PyTree,
                start_rows: StartRows, num_slots: int, beam_size: int,
                alpha: float, max_decode_len: int, eos_id: int,
                max_lengths: jax.Array, cache_rows: PyTree,
                num_best: int = 1, stage_lengths: tuple[int, ...] = (),
                grow_cache: Callable[[PyTree, int], PyTree] | None = None,
                stop: str = 'exact', step_hook: StepHook | None = None
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Beam search of more sentences than slots: `num_slots` sentences are
  searched at a time (`num_slots * beam_size` rows), and a slot whose
  sentence is done (`beam_search`'s stopping rule for `num_best`) takes
  the next one, so that the rows stay busy until the last sentences drain.

  Each sentence's best hypothesis is `beam_search`'s (with `num_best`: slot
  0 is exact once the sentence is done, and it is read then), given a step
  function whose results for a row depend on that row alone, each slot's
  rows at their own position. Slots 0..num_slots-1 start on sentences
  0..num_slots-1; then a freed slot takes the first sentence not yet taken.

  Args:
    tokens_to_logits: the step function on `num_slots * beam_size` rows,
      ordered `[slot, beam]`.
    cache: its cache for sentences 0..num_slots-1, sized for the first
      stage (`stage_lengths`), else for `max_decode_len`; its HYPOTHESIS
      leaves (`cache_rows`) with `num_slots * beam_size` rows.
    start_rows: `(cache, start [num_slots] bool, sentence [num_slots]) ->
      cache` in which the rows of every slot with `start` begin sentence
      `sentence[slot]` afresh; other rows unchanged.
    num_slots, beam_size, alpha, max_decode_len, eos_id: as in
      `beam_search` (num_slots its batch_size).
    max_lengths: int32 `[sentences]`, each sentence's limit on |Y|.
    cache_rows: the `CacheRows` of each cache leaf (positions kept per
      row are the same for a slot's rows: `SHARED`, never reordered).
    num_best: as in `beam_search`; 1 for the best hypothesis alone.
    stage_lengths, grow_cache: as in `greedy_refill`.
    stop: the stopping rule, as in `beam_search`.
    step_hook: as in `beam_search`.

  Returns:
    `(tokens [sentences, max_decode_len], scores [sentences], log P(Y | X)
    [sentences])` of each sentence's best hypothesis.
  """
  num_sentences, limits, lengths = _refill_inputs(
      num_slots, 'slots', max_lengths, max_decode_len, stage_lengths)
  _check_grow_cache(lengths, grow_cache)
  check_beam_stop(stop)
  kinds = _row_kinds(cache, cache_rows)
  init = _BeamRefillState(
      sentence=jnp.arange(num_slots, dtype=jnp.int32),
      step=jnp.zeros((num_slots,), jnp.int32),
      active=jnp.ones((num_slots,), jnp.bool_),
      beam=_BeamState(step=jnp.array(0, jnp.int32), cache=None,
                      rows=_first_rows(num_slots, beam_size),
                      **_fresh_beams(limits[:num_slots], alpha, beam_size,
                                     lengths[0])),
      next=jnp.array(num_slots, jnp.int32),
      out_seqs=jnp.zeros((num_sentences, max_decode_len), jnp.int32),
      out_scores=jnp.full((num_sentences,), NEG_INF, jnp.float32),
      out_logprobs=jnp.full((num_sentences,), NEG_INF, jnp.float32),
      cache=cache)

  def cond(state):
    room = state.step < state.beam.live_seqs.shape[2]
    return jnp.any(state.active) & jnp.all(room | ~state.active)

  def body(state):
    state = _beam_refill_step(tokens_to_logits, kinds, eos_id, alpha, state,
                              step_hook)
    return _beam_refill_next(state, limits, alpha, num_best, stop,
                             start_rows)

  def resize(state, n):
    return state._replace(beam=state.beam._replace(
        live_seqs=_resize_axis(state.beam.live_seqs, 2, n),
        finished_seqs=_resize_axis(state.beam.finished_seqs, 2, n)))

  stages = functools.partial(
      _refill_stages, cond, body, lambda s: s.active, lambda s: s.step,
      resize, grow_cache, lengths)
  state = lax.while_loop(lambda state: jnp.any(state.active), stages, init)
  return state.out_seqs, state.out_scores, state.out_logprobs
