"""Exact fast paths of the searches' token choices (a speed-up of
`mha.search.decoding`): the same tokens and bits as the computations they
replace.

Without a step hook, the best tokens come from the raw logits, without the
`[rows, V]` log-softmax and its argmax or top-k: `_greedy_choice` for
greedy search's token, `_best_extensions` for a beam's, both over
`_top_k`, `lax.top_k` of a vocabulary-wide axis by chunks. Where a
shortcut could differ from the full computation (a tie across its
boundary, NaN), the whole step takes the full computation (`lax.cond`). A
beam's candidates, with a hook or without, are chosen in two rounds
(`_candidates`): the best of each hypothesis, then the best of those.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax import lax
import jax.numpy as jnp

from mha.search.cache_rows import _hypothesis_of_row
from mha.search.common import NEG_INF, _pad_axis, _take

# (logits [rows, V], tokens [rows, room], length [rows]) -> the step's
# log-probabilities changed by its hook (`mha.search.decoding.StepHook`).
Hooked = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def _argmax_choice(log_probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The most probable token of each row `[rows, V]` and its
  log-probability, `[rows]` each."""
  token = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
  return token, jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]


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


def _candidates(logits: jax.Array, live_logprobs: jax.Array,
                rows: jax.Array, hooked: Hooked | None = None,
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
  log-softmax (`_best_extensions`), or, with `hooked`, top_k of
  live_logprobs + the hooked log-probabilities.

  Args:
    logits: float32 `[b, beam, V]`.
    live_logprobs: `[b, beam]`.
    rows: `[b, beam]`: hypothesis k's logits are at `logits[:, rows[:, k]]`
      (rows in place, `_follow_parents`).
    hooked: the step's log-probabilities changed by the step hook
      (`mha.search.decoding._hooked_log_probs`; None: no hook), given the
      hypotheses' `live_seqs` `[b, beam, room]` and their `length` (`[]`,
      or `[b]`: each sentence or slot at its own).

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
  if hooked is None:
    row_logprobs, row_token = _best_extensions(logits, live_of_row, per_row)
  else:
    seqs = _take(live_seqs, _hypothesis_of_row(rows))  # [b, beam, room]
    log_probs = hooked(
        logits.reshape(batch_size * beam_size, vocab_size),
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
