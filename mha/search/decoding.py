"""Greedy and beam search over a KV cache (the paper's §6.1), ancestral
sampling (`sample`) and forced decoding (`forced_log_probs`). Their
speed-ups, none of which changes an output, are modules of their own:
`mha.search.cache_rows` (rows in place: only copies move cache rows),
`mha.search.fast_top_k` (the best tokens of the raw logits),
`mha.search.stages` (outputs and cache grown in stages, a batch shrunk to
its sentences not done) and `mha.search.refill` (`greedy_refill`,
`beam_refill`: a row whose sentence is done takes the next sentence).

This module imports no model: `mha.search.texts` builds the Transformer's step
function and cache and hands them to `beam_search`.

The searches are generic over a step function

  tokens_to_logits(tokens, cache) -> (logits, new_cache)

with `tokens` int32 `[n, 1]` (the last token of every hypothesis), `logits`
`[n, V]` (raw logits or log-probabilities: they are normalised here with
`log_softmax`) and `cache` any pytree. The step function keeps track of the
position itself (flax's attention cache holds a `cache_index`). Decoding starts
from token 0 (the pad id, the shift-right convention of the decoder).

The caller says what the rows of each cache leaf are, with `cache_rows`, a
pytree of the cache's structure whose leaves are `CacheRows`
(`mha.search.cache_rows`; without it, 0-d leaves are shared by every row
and the others hold a row per hypothesis). Rows are ordered `[batch,
beam]`: sentence b's hypotheses are in rows `b * beam_size` to `(b + 1) *
beam_size - 1`, in an order of the search's own (rows in place,
`mha.search.cache_rows`): the step function's results for a row must
depend on that row (and its sentence) alone.

Scores follow Wu et al. (2016) as the paper uses them:
`score(Y) = log P(Y | X) / lp(Y)`, `lp(Y) = ((5 + |Y|) / 6) ** alpha`, where
`|Y|` counts the tokens of Y including its EOS.

Maximum lengths: `max_decode_len` is the static length of the outputs (and of
the cache); `max_lengths[b]` (default `max_decode_len`) is sentence b's limit
on |Y| (the paper: input length + 50). A hypothesis that reaches its limit
without emitting EOS is *forced to end*: it is finished there, without an EOS
token, and scored like any finished hypothesis of that length,
`log P(Y | X) / lp(|Y|)` with the probability of the tokens it has. (Forcing an
EOS token instead would add the EOS probability and distort the score of the
sentence that simply ran out of room.)

Outputs hold the generated tokens only (not the start token), EOS included,
padded with 0 after the end.

Step hooks: what changes a step's scores (a ban, a penalty, a
constraint) is a `StepHook`,

  step_hook(log_probs, tokens, length) -> log_probs

with `log_probs` float32 `[rows, V]` (the step's log-softmax), `tokens`
int32 `[rows, room]` each row's output so far (0 from `length` on) and
`length` int32 `[rows]` its number of tokens: rows in the step function's
order, whatever the search. Every search (greedy, beam, their refilled
forms, sampling) ranks and scores the hooked log-probabilities, in one
place per step (`_hooked_log_probs`), so a hook's token choices and
scores are the same in each. A hook may lower a log-probability (a ban:
-inf; a penalty), never raise one above 0: the exact stopping rule
bounds what a live hypothesis can still reach by its log P so far. The
searches' fast paths (the best tokens of the raw logits, without a
`[rows, V]` log-softmax: `mha.search.fast_top_k`) are taken only without
a hook. Hooks are built from the search's settings (`mha.search.hooks`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
from jax import lax
import jax.numpy as jnp

from mha.data.token_ids import PAD_ID
from mha import validation
from mha.search.cache_rows import (CacheRows, _expand_cache, _first_rows,
                                   _move_rows, _row_kinds, _row_tokens)
from mha.search.common import (NEG_INF, PyTree, TokensToLogits,
                               _max_lengths, _pad_axis, _step_logits,
                               _step_logprobs, _take)
from mha.search.fast_top_k import (_argmax_choice, _candidates,
                                   _greedy_choice)
from mha.search.stages import (_checked_shrink_sizes, _run_stages,
                               _take_sentences, all_stage_lengths)

# (log_probs [rows, V], tokens [rows, room], length [rows]) -> log_probs
StepHook = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6) ** alpha."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0)**alpha


def check_beam_stop(stop: str) -> str:
  """`stop`, if it is one of the stopping rules (validation's rule for the
  `beam_stop` field); else a ValueError naming them."""
  problem = validation.FIELDS['beam_stop'](stop)
  if problem:
    raise ValueError(f'stop must be {problem}, got {stop!r}.')
  return stop


def _best_reachable(best_live: jax.Array, step: jax.Array, alpha: float,
                    lp_limit: jax.Array, stop: str) -> jax.Array:
  """The best score a live prefix of log-probability `best_live` could end
  with, `step` tokens in: over any length up to the limit (`'exact'`), or
  if it ended at the next step (`'early'`)."""
  lp_next = length_penalty(step + 1, alpha)
  if stop == 'early':
    return best_live / lp_next
  return best_live / jnp.maximum(lp_next, lp_limit)


def _hooked_log_probs(logits: jax.Array, hook: StepHook | None,
                      tokens: jax.Array, length: jax.Array) -> jax.Array:
  """What every search ranks and scores at a step: the log-softmax of
  `logits` `[rows, V]`, changed by `hook` (module docstring, "Step hooks")
  given each row's `tokens` so far `[rows, room]` and their `length`
  `[rows]`."""
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  if hook is None:
    return log_probs
  return jnp.asarray(hook(log_probs, tokens, length), jnp.float32)


def _greedy_step(logits: jax.Array, hook: StepHook | None, tokens: jax.Array,
                 length: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Greedy search's choice at a step and its log-probability, `[rows]`
  each: without a hook `_greedy_choice`'s fast path, else the argmax of
  the hooked log-probabilities."""
  if hook is None:
    return _greedy_choice(logits)
  return _argmax_choice(_hooked_log_probs(logits, hook, tokens, length))


# ---------------------------------------------------------------------- greedy


class _GreedyState(NamedTuple):
  step: jax.Array  # [] tokens generated so far
  seqs: jax.Array  # [batch, max_decode_len]
  last: jax.Array  # [batch] token fed at the next step
  logprob: jax.Array  # [batch] log P(Y | X) of the tokens so far
  length: jax.Array  # [batch] |Y|
  finished: jax.Array  # [batch] bool
  cache: PyTree


def _argmax(log_probs: jax.Array, step: jax.Array) -> jax.Array:
  """Greedy search's choice: the most probable token of each row."""
  del step
  return jnp.argmax(log_probs, axis=-1).astype(jnp.int32)


def _greedy(tokens_to_logits: TokensToLogits, cache: PyTree, batch_size: int,
            max_decode_len: int, eos_id: int, max_lengths: jax.Array | None,
            alpha: float, stage_lengths=(), grow_cache=None,
            cache_rows: PyTree | None = None,
            choose: Callable[[jax.Array, jax.Array], jax.Array] = _argmax,
            step_hook: StepHook | None = None
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One token a step, `choose(log_probs [batch, V], step) -> [batch]`
  (greedy: the argmax) of the log-probabilities `step_hook` changed;
  returns (tokens [batch, len], scores [batch], log P(Y | X) [batch])."""
  limits = _max_lengths(max_lengths, batch_size, max_decode_len)  # [batch]
  lengths = all_stage_lengths(stage_lengths, max_decode_len)
  init = _GreedyState(
      step=jnp.array(0, jnp.int32),
      seqs=jnp.zeros((batch_size, lengths[0]), jnp.int32),
      last=jnp.full((batch_size,), PAD_ID, jnp.int32),
      logprob=jnp.zeros((batch_size,), jnp.float32),
      length=jnp.zeros((batch_size,), jnp.int32),
      finished=jnp.zeros((batch_size,), jnp.bool_),
      cache=_expand_cache(cache, _row_kinds(cache, cache_rows), batch_size,
                          1),
  )

  def body(state: _GreedyState) -> _GreedyState:
    logits, cache = _step_logits(tokens_to_logits, state.last[:, None],
                                 state.cache)  # [batch, V]
    length = jnp.full((batch_size,), state.step)
    if choose is _argmax:
      token, token_logprob = _greedy_step(logits, step_hook, state.seqs,
                                          length)  # [batch] each
    else:
      log_probs = _hooked_log_probs(logits, step_hook, state.seqs, length)
      token = choose(log_probs, state.step)  # [batch]
      token_logprob = jnp.take_along_axis(log_probs, token[:, None],
                                          axis=-1)[:, 0]  # [batch]
    alive = ~state.finished
    token = jnp.where(alive, token, PAD_ID)
    length = state.step + 1
    return _GreedyState(
        step=length,
        seqs=state.seqs.at[:, state.step].set(token),
        last=token,
        logprob=state.logprob + jnp.where(alive, token_logprob, 0.0),
        length=jnp.where(alive, length, state.length),
        finished=state.finished | (token == eos_id) | (length >= limits),
        cache=cache,
    )

  return _run_stages(
      init, lengths, body, lambda state: state.finished,
      lambda state, n: state._replace(seqs=_pad_axis(state.seqs, 1, n)),
      grow_cache,
      lambda state: (state.seqs,
                     state.logprob / length_penalty(state.length, alpha),
                     state.logprob))


def greedy_search(tokens_to_logits: TokensToLogits,
                  cache: PyTree,
                  batch_size: int,
                  max_decode_len: int,
                  eos_id: int,
                  max_lengths: jax.Array | None = None,
                  stage_lengths: tuple[int, ...] = (),
                  grow_cache: Callable[[PyTree, int], PyTree] | None = None,
                  cache_rows: PyTree | None = None,
                  step_hook: StepHook | None = None) -> jax.Array:
  """Greedy decoding: the most probable next token at every step.

  Args:
    tokens_to_logits: step function `(tokens [batch, 1], cache) -> (logits
      [batch, V], new_cache)`.
    cache: initial cache of the step function (see the module docstring).
    batch_size: number of sentences.
    max_decode_len: static output length; the step function is called at most
      this many times.
    eos_id: end-of-sentence token id.
    max_lengths: optional int32 `[batch]` per-sentence limit on |Y|; a
      sentence that reaches it without EOS ends there.
    stage_lengths: shorter output lengths to try first
      (`mha.search.stages`); `cache` is then sized for the first of them.
    grow_cache: `(cache, length) -> cache` padded for `length` outputs;
      needed with `stage_lengths`.
    cache_rows: the `CacheRows` of each cache leaf (`mha.search.cache_rows`).
    step_hook: changes each step's log-probabilities (module docstring).

  Returns:
    int32 `[batch, max_decode_len]` tokens, EOS included, 0 after the end.
  """
  tokens, _, _ = _greedy(tokens_to_logits, cache, batch_size, max_decode_len,
                         eos_id, max_lengths, alpha=0.0,
                         stage_lengths=stage_lengths, grow_cache=grow_cache,
                         cache_rows=cache_rows, step_hook=step_hook)
  return tokens


# ------------------------------------------------------------------------ beam


class _BeamState(NamedTuple):
  step: jax.Array  # [] tokens generated so far
  live_seqs: jax.Array  # [batch, beam, max_decode_len]
  live_logprobs: jax.Array  # [batch, beam] sorted, best first; -inf = empty
  last: jax.Array  # [batch, beam] token fed at the next step
  finished_seqs: jax.Array  # [batch, beam, max_decode_len]
  finished_scores: jax.Array  # [batch, beam] sorted, best first; -inf = empty
  finished_flags: jax.Array  # [batch, beam] bool: slot holds a hypothesis
  finished_logprobs: jax.Array  # [batch, beam] log P(Y | X) of each slot
  limits: jax.Array  # [batch] int32 the sentence's limit on |Y|
  lp_limit: jax.Array  # [batch] lp(limits)
  rows: jax.Array  # [batch, beam] int32 each live hypothesis's cache row
  cache: PyTree  # per-row leaves: [batch * beam, ...]


def _merge_finished(state: _BeamState, ends: jax.Array,
                    cand_logprobs: jax.Array, cand_seqs: jax.Array,
                    length: jax.Array, alpha: float,
                    beam_size: int) -> _BeamState:
  """`state` with its finished slots: the best beam of the old finished
  hypotheses and the candidates that end now (`ends` `[b, c]`)."""
  new_scores = jnp.where(ends, cand_logprobs / length_penalty(length, alpha),
                         NEG_INF)  # [b, c]
  all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)
  all_flags = jnp.concatenate([state.finished_flags, ends], axis=1)
  all_seqs = jnp.concatenate([state.finished_seqs, cand_seqs], axis=1)
  finished_scores, finished_index = lax.top_k(all_scores, beam_size)
  all_logprobs = jnp.concatenate(
      [state.finished_logprobs, jnp.where(ends, cand_logprobs, NEG_INF)],
      axis=1)
  return state._replace(
      finished_seqs=_take(all_seqs, finished_index),
      finished_scores=finished_scores,
      finished_flags=_take(all_flags, finished_index),
      finished_logprobs=_take(all_logprobs, finished_index))


def _fresh_beams(limits: jax.Array, alpha: float, beam_size: int,
                 length: int) -> dict[str, jax.Array]:
  """`_BeamState` fields of sentences (or slots) that start a search: one
  live (empty) hypothesis, no finished one; `limits` `[sentences]`."""
  n = limits.shape[0]
  return dict(
      live_seqs=jnp.zeros((n, beam_size, length), jnp.int32),
      live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam_size - 1),
                                       jnp.float32), (n, 1)),
      last=jnp.full((n, beam_size), PAD_ID, jnp.int32),
      finished_seqs=jnp.zeros((n, beam_size, length), jnp.int32),
      finished_scores=jnp.full((n, beam_size), NEG_INF, jnp.float32),
      finished_flags=jnp.zeros((n, beam_size), jnp.bool_),
      finished_logprobs=jnp.full((n, beam_size), NEG_INF, jnp.float32),
      limits=limits, lp_limit=length_penalty(limits, alpha))


def _beam_done(beams: _BeamState, step: jax.Array, alpha: float,
               num_best: int, stop: str) -> jax.Array:
  """Which sentences (or slots) are done under `beam_search`'s stopping
  rule `stop`, at `step` (`[]`, or `[slots]`: each slot at its own): the
  num_best best finished hypotheses can no longer be beaten, or the
  sentence is at its length limit (where every candidate ended; said apart
  because NaN scores, of a model with NaN parameters, settle no
  comparison, and the sentence would never be done)."""
  best_live = beams.live_logprobs[:, 0]
  best_reachable = _best_reachable(best_live, step, alpha, beams.lp_limit,
                                   stop)
  worst_finished = jnp.where(
      jnp.all(beams.finished_flags[:, :num_best], axis=1),
      beams.finished_scores[:, num_best - 1], NEG_INF)
  return ((best_live == NEG_INF) | (worst_finished > best_reachable)
          | (step >= beams.limits))


def _beam_step(tokens_to_logits: TokensToLogits, kinds: PyTree,
               eos_id: int, alpha: float, beams: _BeamState, cache: PyTree,
               step: jax.Array, active: jax.Array | None = None,
               step_hook: StepHook | None = None
               ) -> tuple[_BeamState, PyTree]:
  """One step of beam search for every sentence (or slot) of `beams`, at
  `step` (`[]`, or `[slots]`: each slot at its own); slots whose `active`
  (`[slots]` bool) is False write nothing and move no cache row. The best
  `2 * beam` extensions of the live hypotheses are scored; those ending in
  EOS (or at their sentence's length limit) compete for the finished
  slots, the others for the live ones, and the cache rows follow their
  hypotheses. Returns the new `beams` (its `step` and `cache` fields
  untouched) and the step function's new `cache`."""
  n, beam_size, room = beams.live_seqs.shape
  logits, cache = tokens_to_logits(_row_tokens(beams), cache)
  hooked = None if step_hook is None else (
      lambda x, tokens, length: _hooked_log_probs(x, step_hook, tokens,
                                                  length))
  cand_logprobs, cand_parent, cand_token = _candidates(
      jnp.asarray(logits, jnp.float32).reshape(n, beam_size, -1),
      beams.live_logprobs, beams.rows, hooked, beams.live_seqs, step)
  cand_seqs = _take(beams.live_seqs, cand_parent)  # [n, c, len]
  length = step + 1  # of the candidates: [] or [slots]
  ends = (cand_logprobs > NEG_INF) & (
      (cand_token == eos_id) | (length >= beams.limits)[:, None])
  if active is None:
    cand_seqs = cand_seqs.at[:, :, step].set(cand_token)
    moves = True
  else:
    at = jnp.where(active, step, room)  # idle slots: nowhere
    cand_seqs = cand_seqs.at[jnp.arange(n), :, at].set(cand_token,
                                                       mode='drop')
    length = length[:, None]  # [slots, 1], as the candidates' scores
    moves = active[:, None]
  # Live: the best beam candidates that did not end.
  live_logprobs, live_index = lax.top_k(
      jnp.where(ends, NEG_INF, cand_logprobs), beam_size)  # [n, beam]
  rows, cache = _move_rows(cache, kinds, beams.rows,
                           _take(cand_parent, live_index),
                           (live_logprobs > NEG_INF) & moves)
  return _merge_finished(beams, ends, cand_logprobs, cand_seqs, length,
                         alpha, beam_size)._replace(
      live_seqs=_take(cand_seqs, live_index),  # [n, beam, len]
      live_logprobs=live_logprobs,
      last=_take(cand_token, live_index),
      rows=rows), cache


def beam_search(tokens_to_logits: TokensToLogits,
                cache: PyTree,
                batch_size: int,
                beam_size: int,
                alpha: float,
                max_decode_len: int,
                eos_id: int,
                max_lengths: jax.Array | None = None,
                stage_lengths: tuple[int, ...] = (),
                grow_cache: Callable[[PyTree, int], PyTree] | None = None,
                cache_rows: PyTree | None = None,
                num_best: int | None = None,
                shrink_sizes: Sequence[int] = (),
                with_log_probs: bool = False,
                stop: str = 'exact',
                step_hook: StepHook | None = None
               ) -> tuple[jax.Array, ...]:
  """Beam search with the length penalty of Wu et al. (2016).

  The step function sees the beams flattened into the batch:
  `tokens [batch * beam_size, 1]`, rows ordered `[batch, beam]`. At each step
  the best `2 * beam_size` extensions of the live hypotheses are scored; those
  ending in EOS (or at their sentence's length limit) compete for the
  `beam_size` finished slots, the others for the `beam_size` live slots, and
  the cache rows follow their hypotheses (rows in place,
  `mha.search.cache_rows`: a step function's results for a row must depend
  on that row alone, not on its place among the sentence's rows). A
  sentence is done when it has no live hypothesis, or when its `beam_size`
  finished slots are full and no live hypothesis can beat the worst of
  them: a live prefix's log-probability only decreases, so its best
  reachable score is `logprob / max(lp(t + 1), lp(max_length))` (valid for
  any sign of alpha). The loop stops when every sentence is done.

  `stop='early'` bounds a live prefix by the score it would have if it
  ended at the next step, `logprob / lp(t + 1)` (Hugging Face's default
  stopping rule): a search that stops sooner, at the risk of missing a
  longer hypothesis that the growing lp(|Y|) would have lifted above the
  finished ones (tests/test_beam_stopping.py builds one). With alpha <= 0
  the two bounds are the same.

  `beam_size == 1` is greedy search (as in Tensor2Tensor and Hugging Face): a
  one-wide beam that also remembered hypotheses ending in a runner-up EOS would
  be neither greedy nor a real beam.

  `num_best=n` (< beam_size) is for a caller that reads only the best n
  finished hypotheses of each sentence (a translation reads the best one):
  a sentence is then done once no live hypothesis can beat its n-th best
  finished one (the same bound). Slots 0..n-1 hold exactly what the full
  search returns there (no hypothesis found later could enter them: it
  scores at most the bound, below them, and ties keep the earlier one);
  slots n.. may hold fewer or worse hypotheses than the full search's. The
  search stops sooner: the best finished hypothesis is usually found well
  before the beam_size-th.

  `shrink_sizes=(n1, n2, ...)`: once at most n1 sentences are not done, the
  search goes on with n1 of them alone, then n2, and so on: the same
  search, sentence by sentence (shrinks, `mha.search.stages`).

  Args:
    tokens_to_logits: step function `(tokens [batch * beam_size, 1], cache) ->
      (logits [batch * beam_size, V], new_cache)`.
    cache: initial cache of the step function, per-row leaves with a leading
      axis of `batch_size * beam_size` or `batch_size` (module docstring).
    beam_size: number of hypotheses kept per sentence.
    alpha: length-penalty exponent (the paper: 0.6).
    batch_size, max_decode_len, eos_id, stage_lengths, grow_cache,
      cache_rows: as in `greedy_search`.
    max_lengths: optional int32 `[batch]` per-sentence limit on |Y|
      (<= max_decode_len); hypotheses reaching it without EOS are finished
      there (forced end, module docstring).
    num_best: how many of the best finished hypotheses per sentence must be
      exact (above); None: all beam_size.
    shrink_sizes: decreasing numbers of sentences (< batch_size) to go on
      with when only that many are not done yet (shrinks); the step function
      must then take any number of sentences, every per-sentence input in
      its cache.
    with_log_probs: also return each hypothesis's log P(Y | X) (its score
      without the length penalty: the sum of its tokens' log-probabilities).
    stop: the stopping rule, `'exact'` (default) or `'early'` (above).
    step_hook: changes each step's log-probabilities (module docstring);
      the scores and log-probabilities are then the hooked ones.

  Returns:
    `(tokens, scores)`: int32 `[batch, beam_size, max_decode_len]` and float32
    `[batch, beam_size]`, best first. Slots left without a hypothesis (only
    when fewer than beam_size hypotheses exist) have score -inf and tokens 0.
    With `with_log_probs`, `(tokens, scores, log_probs)`, log_probs float32
    `[batch, beam_size]` (-inf in empty slots).
  """
  if beam_size == 1:
    found = _greedy(tokens_to_logits, cache, batch_size, max_decode_len,
                    eos_id, max_lengths, alpha, stage_lengths, grow_cache,
                    cache_rows, step_hook=step_hook)
    found = tuple(x[:, None] for x in found)
    return found if with_log_probs else found[:2]

  check_beam_stop(stop)
  num_best = beam_size if num_best is None else int(num_best)
  if not 1 <= num_best <= beam_size:
    raise ValueError(f'num_best must be in 1..beam_size = {beam_size}, got '
                     f'{num_best}.')
  limits = _max_lengths(max_lengths, batch_size, max_decode_len)  # [batch]
  kinds = _row_kinds(cache, cache_rows)
  lengths = all_stage_lengths(stage_lengths, max_decode_len)
  shrink_sizes = _checked_shrink_sizes(shrink_sizes, batch_size)

  init = _BeamState(
      step=jnp.array(0, jnp.int32),
      rows=_first_rows(batch_size, beam_size),
      cache=_expand_cache(cache, kinds, batch_size, beam_size),
      **_fresh_beams(limits, alpha, beam_size, lengths[0]))

  def sentence_done(state: _BeamState) -> jax.Array:
    return _beam_done(state, state.step, alpha, num_best, stop)  # [batch]

  def body(state: _BeamState) -> _BeamState:
    if stop == 'early':
      # Under the early rule a done sentence's finished hypotheses could
      # still change at a later step (its bound is no bound), and its result
      # would depend on how long the other sentences of its batch run: its
      # search ends where it is done, its live hypotheses dropped (no
      # candidate, no row copy from now on; done for good). Under the exact
      # rule nothing it returns can change.
      state = state._replace(live_logprobs=jnp.where(
          sentence_done(state)[:, None], NEG_INF, state.live_logprobs))
    state, cache = _beam_step(tokens_to_logits, kinds, eos_id, alpha,
                              state, state.cache, state.step,
                              step_hook=step_hook)
    return state._replace(step=state.step + 1, cache=cache)

  def grow(state: _BeamState, length: int) -> _BeamState:
    return state._replace(live_seqs=_pad_axis(state.live_seqs, 2, length),
                          finished_seqs=_pad_axis(state.finished_seqs, 2,
                                                  length))

  def gather_sentences(state: _BeamState, index: jax.Array) -> _BeamState:
    return _take_sentences(state, index, kinds, state.live_logprobs.shape[0])

  # Every sentence has a finished hypothesis: at the latest, its live ones are
  # forced to end at its max_length.
  found = _run_stages(
      init, lengths, body, sentence_done, grow, grow_cache,
      lambda state: (state.finished_seqs, state.finished_scores,
                     state.finished_logprobs), shrink_sizes, gather_sentences)
  return found if with_log_probs else found[:2]


# -------------------------------------------------------------------- sampling


def _sampler(keys: jax.Array, temperature: float | jax.Array,
             top_k: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """`_greedy`'s `choose` for ancestral sampling (`sample`)."""

  def choose(log_probs: jax.Array, step: jax.Array) -> jax.Array:
    # [rows, V]; softmax(log_probs / T) = softmax(logits / T).
    log_probs = log_probs.at[:, PAD_ID].set(NEG_INF)
    vocab_size = log_probs.shape[-1]
    if 0 < top_k < vocab_size:
      values, tokens = lax.top_k(log_probs, top_k)  # [rows, k]
    else:
      values, tokens = log_probs, None
    step_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, step)
    pick = jax.vmap(jax.random.categorical)(step_keys, values / temperature)
    if tokens is None:
      return pick.astype(jnp.int32)
    return jnp.take_along_axis(tokens, pick[:, None], axis=-1)[:, 0].astype(
        jnp.int32)  # [rows]

  return choose


def sample(tokens_to_logits: TokensToLogits,
           cache: PyTree,
           batch_size: int,
           max_decode_len: int,
           eos_id: int,
           keys: jax.Array,
           temperature: float | jax.Array = 1.0,
           top_k: int = 0,
           max_lengths: jax.Array | None = None,
           stage_lengths: tuple[int, ...] = (),
           grow_cache: Callable[[PyTree, int], PyTree] | None = None,
           cache_rows: PyTree | None = None,
           step_hook: StepHook | None = None) -> tuple[jax.Array, jax.Array]:
  """Ancestral sampling: each token drawn from the model's next-token
  distribution given the tokens drawn before.

  At step t, sentence b's token is drawn from softmax(logits / temperature)
  restricted to the `top_k` most probable tokens (0: the whole vocabulary),
  with the key `fold_in(keys[b], t)`: a sentence's sample depends on its
  key alone, not on the other sentences of the batch. The pad id 0 is never
  drawn (it marks the end of an output). `temperature=0` is greedy search.
  A sentence ends at EOS or at its length limit, as in greedy search.

  Args:
    tokens_to_logits, cache, batch_size, max_decode_len, eos_id,
      max_lengths, stage_lengths, grow_cache, cache_rows: as in
      `greedy_search`.
    keys: `[batch]` PRNG keys (`jax.random.key`) or `[batch, 2]` raw ones
      (`jax.random.PRNGKey`), one per sentence.
    temperature: >= 0; below 1 sharpens the distribution, above 1 flattens.
      A traced value (one compilation for every temperature) must be > 0.
    top_k: draw from the k most probable tokens only; 0 = all.
    step_hook: changes each step's log-probabilities before the draw
      (module docstring).

  Returns:
    `(tokens, log_probs)`: int32 `[batch, max_decode_len]` (EOS included, 0
    after the end) and float32 `[batch]`, the model's log P(Y | X) of each
    sample (at temperature 1 over the whole vocabulary, as `forced_log_probs`
    gives it).
  """
  greedy = False
  if isinstance(temperature, (int, float)):
    if temperature < 0:
      raise ValueError(f'temperature must be >= 0, got {temperature}.')
    greedy = temperature == 0
  if top_k < 0:
    raise ValueError(f'top_k must be >= 0, got {top_k}.')
  choose = _argmax if greedy else _sampler(keys, temperature, int(top_k))
  tokens, _, log_probs = _greedy(tokens_to_logits, cache, batch_size,
                                 max_decode_len, eos_id, max_lengths, 0.0,
                                 stage_lengths, grow_cache, cache_rows,
                                 choose, step_hook)
  return tokens, log_probs


# ------------------------------------------------------------ forced decoding


def forced_log_probs(tokens_to_logits: TokensToLogits, cache: PyTree,
                     targets: jax.Array,
                     cache_rows: PyTree | None = None) -> jax.Array:
  """The log-probability of each token of given outputs (teacher forcing).

  The step function reads the start token 0, then each target token in
  turn (the search's own steps, one row per sentence), and the
  log-probability of the next target token is read from its output.

  Args:
    tokens_to_logits: the step function (module docstring).
    cache: its initial cache, with room for `targets.shape[1]` positions.
    targets: int32 `[batch, T]` outputs, EOS included if they end with one,
      0 after the end (a 0 inside an output ends it).
    cache_rows: the `CacheRows` of each cache leaf (`mha.search.cache_rows`).

  Returns:
    float32 `[batch, T]`: log P(y_t | X, y_<t) at each target token, 0 after
    the end; its sum over t is log P(Y | X).
  """
  targets = jnp.asarray(targets, jnp.int32)
  batch_size, length = targets.shape
  cache = _expand_cache(cache, _row_kinds(cache, cache_rows), batch_size, 1)
  inputs = jnp.concatenate(  # shifted right behind the start token
      [jnp.full((batch_size, 1), PAD_ID, jnp.int32), targets[:, :-1]], axis=1)

  def body(cache, step_tokens):
    last, target = step_tokens  # [batch] each
    log_probs, cache = _step_logprobs(tokens_to_logits, last[:, None], cache)
    return cache, jnp.take_along_axis(log_probs, target[:, None],
                                      axis=-1)[:, 0]

  _, per_token = lax.scan(body, cache, (inputs.T, targets.T))  # [T, batch]
  real = jnp.cumprod(targets != PAD_ID, axis=1).astype(bool)  # [batch, T]
  return jnp.where(real, per_token.T, 0.0)


__all__ = ['CacheRows', 'StepHook', 'TokensToLogits', 'beam_search',
           'check_beam_stop', 'forced_log_probs', 'greedy_search',
           'length_penalty', 'sample']
