"""What the search's modules share: the step function's type
(`TokensToLogits`, `mha.search.decoding`'s module docstring) and its
float32 logits (`_step_logits`), each sentence's limit on |Y| checked
(`_max_lengths`), the score of a slot without a hypothesis (`NEG_INF`),
zeros appended along axes (`pad_to`) and each sentence's rows gathered
(`_take`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
TokensToLogits = Callable[[jax.Array, PyTree], tuple[jax.Array, PyTree]]

# Slots without a hypothesis have score -inf. Masking uses jnp.where, never
# arithmetic with the infinity, so no NaN can appear.
NEG_INF = -np.inf


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


def _take(x: jax.Array, indices: jax.Array) -> jax.Array:
  """x [batch, n, ...], indices [batch, m] -> [batch, m, ...]."""
  indices = indices.reshape(indices.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, indices, axis=1)


def _max_lengths(max_lengths: jax.Array | None, batch_size: int,
                 max_decode_len: int) -> jax.Array:
  """Each sentence's limit on |Y|, int32 `[batch]`: `max_lengths` (None:
  `max_decode_len`) checked and clipped to 1..max_decode_len."""
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
