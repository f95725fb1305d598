"""Greedy and beam search over a KV cache (the paper's §6.1), ancestral
sampling (`sample`) and forced decoding (`forced_log_probs`).

This module imports no model: `mha.search.texts` builds the Transformer's step
function and cache and hands them to `beam_search`.

The searches are generic over a step function

  tokens_to_logits(tokens, cache) -> (logits, new_cache)

with `tokens` int32 `[n, 1]` (the last token of every hypothesis), `logits`
`[n, V]` (raw logits or log-probabilities: they are normalised here with
`log_softmax`) and `cache` any pytree. The step function keeps track of the
position itself (flax's attention cache holds a `cache_index`). Decoding starts
from token 0 (the pad id, the shift-right convention of the decoder).

Cache leaves: the caller says what the rows of each leaf are, with
`cache_rows`, a pytree of the cache's structure whose leaves are `CacheRows`
(the model side knows its cache; `mha.search.batches.cache_rows` says it for the
Transformer). Rows are ordered `[batch, beam]`: sentence b's hypotheses
are in rows `b * beam_size` to `(b + 1) * beam_size - 1`, in an order of
the search's own (rows in place, below).

* `CacheRows.SHARED`: one value for all rows (a position index): never
  repeated or gathered; every hypothesis is at the same position.
* `CacheRows.HYPOTHESIS`: a leading row axis of `batch_size * beam_size`, or
  of `batch_size` (then repeated for each beam); a row holds its
  hypothesis's state, copied to the rows of its new children when the beam
  moves on.
* `CacheRows.SENTENCE`: the same leading axis, but equal across the beams of
  a sentence (computed from the source alone): repeated per beam, never
  copied, since a hypothesis never moves to another sentence.
* `CacheRows.ONE_PER_SENTENCE`: a leading axis of `batch_size`, kept so:
  never repeated nor gathered. The step function reads row b for the
  hypotheses of sentence b (rows `b * beam_size` to `(b + 1) * beam_size -
  1`): the Transformer's encoder-decoder keys and values, stored and read
  once per sentence.

Without `cache_rows`, 0-d leaves are `SHARED` and every other leaf is
`HYPOTHESIS`.

Rows in place: a beam search's hypotheses keep their cache rows. When the
beam moves on, a new hypothesis takes over its parent's row if it is the
parent's first child, and its parent's row is copied into a row left free
(a hypothesis without children) otherwise; the step function reads the
rows in that order (`_follow_parents`). Its results for a row must
therefore depend on that row (and its sentence) alone, not on where the
row is among its sentence's rows. Only the copies move cache rows, about a
third of them a step in the Transformer's search, where a reorder of every
row by its parent moved them all (bench/README.md, issue 33).

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
`[rows, V]` log-softmax: `_greedy_choice`, `_best_extensions`) are taken
only without a hook. Hooks are built from the search's settings
(`mha.search.hooks`).

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

import enum
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from mha.data.token_ids import PAD_ID
from mha import validation

PyTree = Any
TokensToLogits = Callable[[jax.Array, PyTree], tuple[jax.Array, PyTree]]
# (log_probs [rows, V], tokens [rows, room], length [rows]) -> log_probs
StepHook = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]

# Slots without a hypothesis have score -inf. Masking uses jnp.where, never
# arithmetic with the infinity, so no NaN can appear.
NEG_INF = -np.inf


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


# ------------------------------------------------------------------ cache rows


class CacheRows(enum.Enum):
  """What the rows of a cache leaf are (module docstring)."""
  SHARED = 'shared'
  HYPOTHESIS = 'hypothesis'
  SENTENCE = 'sentence'
  ONE_PER_SENTENCE = 'one_per_sentence'


def _row_kinds(cache: PyTree, cache_rows: PyTree | None) -> PyTree:
  """`cache_rows`, or the default: 0-d leaves SHARED, others HYPOTHESIS."""
  if cache_rows is not None:
    return cache_rows
  return jax.tree.map(
      lambda x: CacheRows.SHARED if jnp.ndim(x) == 0 else CacheRows.HYPOTHESIS,
      cache)


def _expand_cache(cache: PyTree, cache_rows: PyTree, batch_size: int,
                  beam_size: int) -> PyTree:
  """Brings every per-hypothesis leaf to `batch_size * beam_size` rows."""
  num_rows = batch_size * beam_size

  def expand(path, kind: CacheRows, x):
    if kind is CacheRows.SHARED:
      return x
    if kind is CacheRows.ONE_PER_SENTENCE:
      if jnp.ndim(x) and x.shape[0] == batch_size:
        return x
      raise ValueError(
          f'Cache leaf {jax.tree_util.keystr(path)} ({kind.value} rows) has '
          f'shape {jnp.shape(x)}: expected a leading axis of batch_size = '
          f'{batch_size}.')
    if jnp.ndim(x) and x.shape[0] == num_rows:
      return x
    if jnp.ndim(x) and x.shape[0] == batch_size:
      return jnp.repeat(x, beam_size, axis=0)  # [batch * beam, ...]
    raise ValueError(
        f'Cache leaf {jax.tree_util.keystr(path)} ({kind.value} rows) has '
        f'shape {jnp.shape(x)}: expected a leading axis of batch_size * '
        f'beam_size = {num_rows} or batch_size = {batch_size} (or say '
        'CacheRows.SHARED for it in cache_rows).')

  return jax.tree_util.tree_map_with_path(expand, cache_rows, cache)


def _by_sentence(x: jax.Array, batch_size: int) -> jax.Array:
  """`[batch * n, ...]` rows as `[batch, n, ...]` (a reshape, no copy)."""
  return x.reshape((batch_size, x.shape[0] // batch_size) + x.shape[1:])


# Rows in place (module docstring): `rows[b, k]` (`[batch, beam]`) is the
# row, among sentence b's beam_size rows, that holds live hypothesis k's
# cache.


def _hypothesis_of_row(rows: jax.Array) -> jax.Array:
  """The inverse of `rows` (`[batch, beam]`, a permutation per sentence):
  the hypothesis whose cache row r holds."""
  beam = jnp.arange(rows.shape[1])
  return jnp.sum(jnp.where(rows[:, None, :] == beam[None, :, None],
                           beam[None, None, :], 0), axis=2)


def _row_tokens(beams) -> jax.Array:
  """The tokens fed to the step function, `[batch * beam, 1]`: each row's
  hypothesis's last token."""
  return _take(beams.last, _hypothesis_of_row(beams.rows)).reshape(-1, 1)


def _follow_parents(rows: jax.Array, parent: jax.Array, needed: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The rows of the new hypotheses (`[batch, beam]`), whose parents are
  `parent`, and the copies that give them their parents' caches.

  A parent's first child that needs its cache (`needed`: alive) takes over
  the parent's row; every other child takes a row no such child took, in
  order. Copies run from the parents' rows to the rows of the other
  children that need a cache; no row is both a copy's source and a
  destination.

  Returns:
    `(new rows, source rows, copy)`: int32, int32 and bool `[batch, beam]`;
    child k needs a copy from its source row to its new row where `copy`.
  """
  beam = jnp.arange(rows.shape[1])
  source = _take(rows, parent)  # [b, beam] the parents' rows
  sibling = parent[:, :, None] == parent[:, None, :]  # [b, k, j]
  earlier = beam[None, :] < beam[:, None]  # [k, j]: j before k
  keeps = needed & ~jnp.any(sibling & earlier & needed[:, None, :], axis=2)
  taken = jnp.any(keeps[:, :, None] & (source[:, :, None] == beam), axis=1)
  free_rank = jnp.cumsum(~taken, axis=1) - 1  # [b, r] among free rows
  other_rank = jnp.cumsum(~keeps, axis=1) - 1  # [b, k] among the others
  free_row = jnp.argmax(~taken[:, None, :] & (
      free_rank[:, None, :] == other_rank[:, :, None]), axis=2)
  new_rows = jnp.where(keeps, source, free_row).astype(jnp.int32)
  return new_rows, source, needed & ~keeps


# Copies of `_copy_rows` made at a time (a gather and an in-place scatter).
_COPY_CHUNK = 16


def _copy_rows(cache: PyTree, cache_rows: PyTree, source: jax.Array,
               dest: jax.Array, copy: jax.Array) -> PyTree:
  """The HYPOTHESIS leaves of `cache` with row `dest[i]` a copy of row
  `source[i]` where `copy[i]` (flat row indices `[n]`; no row both a
  source and a destination), `_COPY_CHUNK` copies at a time, in place."""
  n = copy.shape[0]
  size = -(-n // _COPY_CHUNK) * _COPY_CHUNK
  order = jnp.argsort(~copy, stable=True)  # the copies first
  source = _pad_axis(source[order], 0, size)
  dest = jnp.where(copy[order], dest[order], size + n)  # past the end: none
  dest = jnp.concatenate([dest, jnp.full((size - n,), size + n, dest.dtype)])

  def chunk(i, cache):
    at = i * _COPY_CHUNK
    src = lax.dynamic_slice_in_dim(source, at, _COPY_CHUNK)
    dst = lax.dynamic_slice_in_dim(dest, at, _COPY_CHUNK)
    return jax.tree.map(
        lambda kind, x: x.at[dst].set(x[src], mode='drop')
        if kind is CacheRows.HYPOTHESIS else x, cache_rows, cache)

  count = jnp.sum(copy)
  return lax.fori_loop(0, (count + _COPY_CHUNK - 1) // _COPY_CHUNK, chunk,
                       cache)


def _first_rows(batch_size: int, beam_size: int) -> jax.Array:
  """`rows` of a search that starts: hypothesis k in row k."""
  return jnp.tile(jnp.arange(beam_size, dtype=jnp.int32), (batch_size, 1))


def _move_rows(cache: PyTree, cache_rows: PyTree, rows: jax.Array,
               parent: jax.Array, needed: jax.Array
               ) -> tuple[jax.Array, PyTree]:
  """The new hypotheses' rows (`_follow_parents`) and the cache with the
  copies that give them their parents' rows."""
  new_rows, source, copy = _follow_parents(rows, parent, needed)
  batch_size, beam_size = rows.shape
  first = (jnp.arange(batch_size) * beam_size)[:, None]  # [b, 1]
  return new_rows, _copy_rows(cache, cache_rows,
                              (first + source).reshape(-1),
                              (first + new_rows).reshape(-1),
                              copy.reshape(-1))


def _max_lengths(max_lengths: jax.Array | None, batch_size: int,
                 max_decode_len: int) -> jax.Array:
  if max_lengths is None:
    return jnp.full((batch_size,), max_decode_len, jnp.int32)
  max_lengths = jnp.asarray(max_lengths, jnp.int32)
  if max_lengths.shape != (batch_size,):
    raise ValueError(f'max_lengths has shape {max_lengths.shape}, expected '
                     f'({batch_size},).')
  return jnp.clip(max_lengths, 1, max_decode_len)


def _step_logits(tokens_to_logits: TokensToLogits, tokens: jax.Array,
                 cache: PyTree) -> tuple[jax.Array, PyTree]:
  """float32 logits `[n, V]` of one step and the new cache."""
  logits, new_cache = tokens_to_logits(tokens, cache)
  logits = jnp.asarray(logits, jnp.float32)
  if logits.ndim == 3:  # [n, 1, V] from a decoder called on one position
    logits = logits[:, 0]
  return logits, new_cache


def _step_logprobs(tokens_to_logits: TokensToLogits, tokens: jax.Array,
                   cache: PyTree) -> tuple[jax.Array, PyTree]:
  logits, new_cache = _step_logits(tokens_to_logits, tokens, cache)
  return jax.nn.log_softmax(logits, axis=-1), new_cache  # [n, V]


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


def _argmax_choice(log_probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The most probable token of each row `[rows, V]` and its
  log-probability, `[rows]` each."""
  token = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
  return token, jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]


def _greedy_step(logits: jax.Array, hook: StepHook | None, tokens: jax.Array,
                 length: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Greedy search's choice at a step and its log-probability, `[rows]`
  each: without a hook `_greedy_choice`'s fast path, else the argmax of
  the hooked log-probabilities."""
  if hook is None:
    return _greedy_choice(logits)
  return _argmax_choice(_hooked_log_probs(logits, hook, tokens, length))


# `_top_k`'s chunk of the vocabulary (64: the fastest of 16 to 256 for
# [256, 8000] logits on bench/README.md's machine).
_TOP_K_CHUNK = 64


def _top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k(x, k)` (the same values and indices, ties to the lower
  index), several times faster on XLA:CPU for a vocabulary-wide last axis:
  the top k of the maxima of chunks of `_TOP_K_CHUNK` entries, then the top
  k of those k chunks' entries.

  Exact: if an entry e of the top k were in a chunk C outside the k chosen,
  each chosen chunk would hold an entry before e in top_k's order (its max
  is above max(C) >= e, or equal to it in a chunk of lower indices), k
  entries before e. The chosen chunks are read in index order, so that
  ties among their entries keep the lower index first. (NaN: the searches
  below take their full computation then, as without this.)
  """
  n = x.shape[-1]
  chunks = -(-n // _TOP_K_CHUNK)
  if chunks <= k:
    return lax.top_k(x, k)
  padded = _pad_axis(x, x.ndim - 1, chunks * _TOP_K_CHUNK)
  if chunks * _TOP_K_CHUNK > n:  # padding that no real entry ranks below
    padded = jnp.where(jnp.arange(padded.shape[-1]) < n, padded, -jnp.inf)
  padded = padded.reshape(x.shape[:-1] + (chunks, _TOP_K_CHUNK))
  _, chosen = lax.top_k(jnp.max(padded, axis=-1), k)  # [..., k]
  chosen = jnp.sort(chosen, axis=-1)
  entries = jnp.take_along_axis(padded, chosen[..., None], axis=-2)
  values, at = lax.top_k(entries.reshape(x.shape[:-1] + (-1,)), k)
  index = (jnp.take_along_axis(chosen, at // _TOP_K_CHUNK, axis=-1)
           * _TOP_K_CHUNK + at % _TOP_K_CHUNK)
  return values, index.astype(jnp.int32)


def _row_max(top_x: jax.Array) -> jax.Array:
  """The row max of the logits, `[..., 1]`, from their `lax.top_k` values
  `[..., m]` (its first: the same value), which saves a pass over the
  `[rows, V]` logits. The barrier keeps XLA from fusing the top-k with the
  exp-sum that reads this max: fused, the search was several times slower
  (bench/README.md, issue 33)."""
  return lax.optimization_barrier(top_x)[..., :1]


def _greedy_choice(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`argmax(log_softmax(logits))` and its log-probability, the same token
  and bits, without the `[rows, V]` log-softmax and its argmax.

  As in `_best_extensions`: f(x) = (x - max x) - lse is non-decreasing in
  x, so the best f is the best raw logit's unless f ties across the two
  best raw logits (argmax would then take the lowest token of the tie,
  perhaps outside them): the whole step then takes the full computation
  (`lax.cond`), as it does for NaN.

  Args:
    logits: float32 `[rows, V]`.

  Returns:
    `(int32 [rows] tokens, float32 [rows] their log-probabilities)`.
  """
  def full():
    return _argmax_choice(jax.nn.log_softmax(logits, axis=-1))

  if logits.shape[-1] < 2:
    return full()
  top_x, top_token = _top_k(logits, 2)  # [rows, 2]
  x_max = _row_max(top_x)  # [rows, 1]
  lse = jnp.log(jnp.sum(jnp.exp(logits - x_max), axis=-1, keepdims=True))
  top_f = (top_x - x_max) - lse
  exact = jnp.all(top_f[:, 0] > top_f[:, 1])
  return lax.cond(exact,
                  lambda: (top_token[:, 0].astype(jnp.int32), top_f[:, 0]),
                  full)


def _best_extensions(logits: jax.Array, live_logprobs: jax.Array,
                     k: int) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k(live_logprobs[..., None] + log_softmax(logits), k)`, the
  same values and tokens bit for bit, without the `[rows, V]` log-softmax.

  log_softmax(x)_v = (x_v - max x) - lse (jax.nn.log_softmax's formula, lse
  = log Σ exp(x - max x)) is, with the row's live log-probability added, a
  non-decreasing function f of x_v alone (each float operation rounds
  monotonically). So the best k of f are among the best m > k of the raw
  logits, except where f ties across that boundary: f is computed for
  those m only and they are ordered by (f descending, token ascending),
  top_k's order. A row is exact when f of its k-th is above f of its m-th
  (nothing outside can tie with the k-th), or when its live log-probability
  is -inf (top_k of a row of -inf: tokens 0..k-1); otherwise, rare (logits
  that round together, or -inf logits), the whole step takes the full
  computation (`lax.cond`).

  Args:
    logits: float32 `[b, beam, V]`.
    live_logprobs: `[b, beam]`.
    k: candidates per row, <= V.

  Returns:
    `([b, beam, k] log-probabilities, [b, beam, k] int32 tokens)`.
  """
  vocab_size = logits.shape[-1]
  m = min(2 * k, vocab_size)
  live = live_logprobs[:, :, None]
  top_x, top_token = _top_k(logits, m)  # [b, beam, m]
  x_max = _row_max(top_x)  # [b, beam, 1]
  lse = jnp.log(jnp.sum(jnp.exp(logits - x_max), axis=-1, keepdims=True))
  top_f = live + ((top_x - x_max) - lse)
  neg_f, token = lax.sort((-top_f, top_token.astype(jnp.int32)),
                          dimension=-1, num_keys=2)
  values, token = -neg_f[..., :k], token[..., :k]
  dead = live_logprobs == NEG_INF  # [b, beam]
  values = jnp.where(dead[..., None], NEG_INF, values)
  token = jnp.where(dead[..., None], jnp.arange(k, dtype=jnp.int32), token)
  exact = dead | (top_f[..., k - 1] > top_f[..., m - 1])
  if m == vocab_size:
    return values, token

  def full():
    row_logprobs, row_token = lax.top_k(
        live + jax.nn.log_softmax(logits, axis=-1), k)
    return row_logprobs, row_token.astype(jnp.int32)

  return lax.cond(jnp.all(exact), lambda: (values, token), full)


def all_stage_lengths(stage_lengths: Sequence[int],
                      max_decode_len: int) -> list[int]:
  """The increasing lengths of the stages, ending with max_decode_len."""
  lengths = sorted({int(n) for n in stage_lengths if 0 < n < max_decode_len})
  return lengths + [max_decode_len]


def pad_to(x: jax.Array, shape: Sequence[int]) -> jax.Array:
  """Zeros appended along every axis up to `shape` (x itself if equal)."""
  if tuple(x.shape) == tuple(shape):
    return x
  return jnp.pad(x, [(0, n - m) for m, n in zip(x.shape, shape)])


def _pad_axis(x: jax.Array, axis: int, length: int) -> jax.Array:
  """Zeros appended along `axis` up to `length`."""
  shape = list(x.shape)
  shape[axis] = length
  return pad_to(x, shape)


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
    stage_lengths: shorter output lengths to try first (module docstring);
      `cache` is then sized for the first of them.
    grow_cache: `(cache, length) -> cache` padded for `length` outputs;
      needed with `stage_lengths`.
    cache_rows: the `CacheRows` of each cache leaf (module docstring).
    step_hook: changes each step's log-probabilities (module docstring).

  Returns:
    int32 `[batch, max_decode_len]` tokens, EOS included, 0 after the end.
  """
  tokens, _, _ = _greedy(tokens_to_logits, cache, batch_size, max_decode_len,
                         eos_id, max_lengths, alpha=0.0,
                         stage_lengths=stage_lengths, grow_cache=grow_cache,
                         cache_rows=cache_rows, step_hook=step_hook)
  return tokens


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


def _take(x: jax.Array, indices: jax.Array) -> jax.Array:
  """x [batch, n, ...], indices [batch, m] -> [batch, m, ...]."""
  indices = indices.reshape(indices.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, indices, axis=1)


def _candidates(logits: jax.Array, live_logprobs: jax.Array,
                rows: jax.Array, step_hook: StepHook | None = None,
                live_seqs: jax.Array | None = None,
                length: jax.Array | None = None
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The best `2 * beam` extensions of the live hypotheses: even if beam of
  them end, beam stay live.

  In two rounds (the best of each hypothesis, then the best of those),
  which selects the same candidates in the same order as one top_k over
  all beam * V of them, ties included (both prefer the lower parent, then
  the lower token), at a fraction of the cost. The first round is top_k of
  live_logprobs + log_softmax(logits) per row, without the [rows, V]
  log-softmax (`_best_extensions`), or, with a `step_hook`, top_k of
  live_logprobs + the hooked log-probabilities (`_hooked_log_probs`).

  Args:
    logits: float32 `[b, beam, V]`.
    live_logprobs: `[b, beam]`.
    rows: `[b, beam]`: hypothesis k's logits are at `logits[:, rows[:, k]]`
      (rows in place, `_follow_parents`).
    step_hook: changes the step's log-probabilities (module docstring),
      given the hypotheses' `live_seqs` `[b, beam, room]` and their
      `length` (`[]`, or `[b]`: each sentence or slot at its own).

  Returns:
    `(log-probabilities, parent slots, tokens)` of the candidates, `[b, c]`
    each, best first.
  """
  batch_size, beam_size, vocab_size = logits.shape
  num_candidates = min(2 * beam_size, beam_size * vocab_size)
  per_row = min(num_candidates, vocab_size)
  # Row by row as the logits are ([b, beam, k]), then in the hypotheses'
  # order.
  live_of_row = _take(live_logprobs, _hypothesis_of_row(rows))  # [b, beam]
  if step_hook is None:
    row_logprobs, row_token = _best_extensions(logits, live_of_row, per_row)
  else:
    seqs = _take(live_seqs, _hypothesis_of_row(rows))  # [b, beam, room]
    log_probs = _hooked_log_probs(
        logits.reshape(batch_size * beam_size, vocab_size), step_hook,
        seqs.reshape(batch_size * beam_size, -1),
        jnp.broadcast_to(jnp.reshape(length, (-1, 1)),
                         (batch_size, beam_size)).reshape(-1))
    row_logprobs, row_token = lax.top_k(
        live_of_row[..., None]
        + log_probs.reshape(batch_size, beam_size, vocab_size), per_row)
  row_logprobs, row_token = _take(row_logprobs, rows), _take(row_token, rows)
  cand_logprobs, cand_slot = lax.top_k(
      row_logprobs.reshape(batch_size, beam_size * per_row),
      num_candidates)  # [b, c]
  cand_token = jnp.take_along_axis(
      row_token.reshape(batch_size, beam_size * per_row), cand_slot,
      axis=1).astype(jnp.int32)  # [b, c]
  return cand_logprobs, cand_slot // per_row, cand_token


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
  cand_logprobs, cand_parent, cand_token = _candidates(
      jnp.asarray(logits, jnp.float32).reshape(n, beam_size, -1),
      beams.live_logprobs, beams.rows, step_hook, beams.live_seqs, step)
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
  the cache rows follow their hypotheses (rows in place, module docstring:
  a step function's results for a row must depend on that row alone, not on
  its place among the sentence's rows). A sentence is done when it has no
  live hypothesis, or when its `beam_size` finished slots are full and no live
  hypothesis can beat the worst of them: a live prefix's log-probability only
  decreases, so its best reachable score is `logprob / max(lp(t + 1),
  lp(max_length))` (valid for any sign of alpha). The loop stops when every
  sentence is done.

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
  search goes on with n1 sentences (those, and done ones to fill up): their
  state and cache rows are gathered (`CacheRows.HYPOTHESIS` and `SENTENCE`
  leaves by their rows, `ONE_PER_SENTENCE` leaves by sentence) and the
  loop, traced again for the smaller batch, runs on them alone; then n2,
  and so on. The results are put back in their sentences' places. The
  search is the same, sentence by sentence; the steps of the finished
  sentences cost nothing more. (Their rows' arithmetic is the same only if
  the step function's results for a row do not depend on the number of
  rows, which matrix products on some backends do not promise for small
  batches: `mha.search.texts` shrinks no further than `MIN_SEARCH_ROWS`.)

  Args:
    tokens_to_logits: step function `(tokens [batch * beam_size, 1], cache) ->
      (logits [batch * beam_size, V], new_cache)`.
    cache: initial cache of the step function, per-row leaves with a leading
      axis of `batch_size * beam_size` or `batch_size` (module docstring).
    batch_size: number of sentences.
    beam_size: number of hypotheses kept per sentence.
    alpha: length-penalty exponent (the paper: 0.6).
    max_decode_len: static output length; the step function is called at most
      this many times.
    eos_id: end-of-sentence token id.
    max_lengths: optional int32 `[batch]` per-sentence limit on |Y|
      (<= max_decode_len); hypotheses reaching it without EOS are finished
      there (forced end, module docstring).
    stage_lengths: shorter output lengths to try first (module docstring);
      `cache` is then sized for the first of them.
    grow_cache: `(cache, length) -> cache` padded for `length` outputs;
      needed with `stage_lengths`.
    cache_rows: the `CacheRows` of each cache leaf, a pytree of the cache's
      structure (module docstring); None: 0-d leaves shared, others per
      hypothesis.
    num_best: how many of the best finished hypotheses per sentence must be
      exact (above); None: all beam_size.
    shrink_sizes: decreasing numbers of sentences (< batch_size) to go on
      with when only that many are not done yet (above); the step function
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
  shrink_sizes = tuple(int(n) for n in shrink_sizes)
  if any(not 0 < n < m for n, m in zip(shrink_sizes,
                                        (batch_size,) + shrink_sizes)):
    raise ValueError(f'shrink_sizes must decrease from below batch_size = '
                     f'{batch_size} and stay positive, got {shrink_sizes}.')

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
    """The state of sentences `index` ([n]) alone."""
    batch_size = state.live_logprobs.shape[0]

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
        for name in _BeamState._fields if name not in ('step', 'cache')}
    return state._replace(cache=jax.tree.map(leaf, kinds, state.cache),
                          **per_sentence)

  # Every sentence has a finished hypothesis: at the latest, its live ones are
  # forced to end at its max_length.
  found = _run_stages(
      init, lengths, body, sentence_done, grow, grow_cache,
      lambda state: (state.finished_seqs, state.finished_scores,
                     state.finished_logprobs), shrink_sizes, gather_sentences)
  return found if with_log_probs else found[:2]


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
    cache_rows: the `CacheRows` of each cache leaf (module docstring).

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
