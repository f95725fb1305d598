"""Location-aware and multi-resolution attention (Chorowski et al. 2015).

`attention_type='location'` (`mha.model.attention.ATTENTION_VARIANTS`):
the logits of query position i are

    q_i·k_j / √d_k + uₕᵀ tanh((Fₕ ∗ c_{i-1})_j),

where c_{i-1} is the *content-only* weight row of position i-1 of the same
head, softmax_j(q_{i-1}·k_j / √d_k) under the same mask (zeros for the first
position of a sentence: `previous_position_weights`), Fₕ are
`location_num_filters` learned 1-D filters of head h's width along the key
axis and uₕ projects them to a scalar per key (`location_scores`). Feeding
the final weights of i-1 instead would make position i wait for position
i-1 (a recurrence over the target). The content weights of every position
come from one matmul, so training stays parallel; in incremental decoding
the cache holds c_{i-1} (`PREVIOUS_WEIGHTS`) and step i computes exactly
the same numbers, so the two agree. One width per head
(`location_filter_sizes=(1, 3, 5, 7)`) gives multi-resolution heads; one
width for all heads gives plain location-aware heads. These heads always
use `MultiHeadAttention`'s einsum implementation.
"""
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from mha import validation
from mha.errors import ConfigError

# The decode-cache variable of the previous step's content weights,
# `[rows, H, 1, K]`: one row per hypothesis.
PREVIOUS_WEIGHTS = "previous_weights"


def previous_position_weights(weights: jax.Array,
                              sentence_starts: jax.Array | None = None
                              ) -> jax.Array:
  """The weights of query position i-1 at position i (zeros where none).

  Args:
    weights: `[B, H, Q, K]` attention weights.
    sentence_starts: `[B, Q]` booleans, True where a query starts a sentence
      (packed rows): it gets zeros instead of the previous sentence's weights.
      Position 0 always gets zeros.

  Returns:
    `[B, H, Q, K]` with row i holding row i-1 of `weights`.
  """
  previous = jnp.pad(weights, ((0, 0), (0, 0), (1, 0), (0, 0)))[:, :, :-1]
  if sentence_starts is not None:
    previous = jnp.where(sentence_starts[:, None, :, None], 0.0, previous)
  return previous


def stack_filters(filters: list[jax.Array]) -> jax.Array:
  """Per-head filters `[width_h, N]` -> `[H, W, N]`, W the widest width.

  Narrower filters are zero-padded on both sides, centred: head h still reads
  exactly width_h neighbouring keys (its receptive field).
  """
  widest = max(f.shape[0] for f in filters)
  return jnp.stack([jnp.pad(f, (((widest - f.shape[0]) // 2,) * 2, (0, 0)))
                    for f in filters])


def location_scores(previous: jax.Array, filters: jax.Array,
                    projection: jax.Array) -> jax.Array:
  """The location term uₕᵀ tanh((Fₕ ∗ α_prev)_j) of every key j.

  Chorowski et al. (2015), eq. 8-9: the previous weights α_prev of each head
  are convolved along the key (source) axis with that head's filters Fₕ (the
  output at key j reads α_prev[j - c .. j + c], c = W // 2, zeros beyond the
  ends), squashed by tanh and projected to a scalar by uₕ.

  Args:
    previous: `[B, H, Q, K]` weights of the previous query position.
    filters: `[H, W, N]`, N filters of odd width W per head (taps outside a
      head's own width are zero for multi-resolution heads).
    projection: `[H, N]`, the vector uₕ of each head.

  Returns:
    `[B, H, Q, K]` scores to add to the content logits.
  """
  width = filters.shape[1]
  if width % 2 != 1:
    raise ValueError(f"Location filters need an odd width, got {width}.")
  center, length = width // 2, previous.shape[-1]
  padded = jnp.pad(previous, ((0, 0), (0, 0), (0, 0), (center, center)))
  # windows[..., j, t] = previous[..., j + t - center]: [B, H, Q, K, W].
  windows = jnp.stack([padded[..., t:t + length] for t in range(width)],
                      axis=-1)
  features = jnp.tanh(jnp.einsum("BHQKW,HWN->BHQKN", windows,
                                 filters.astype(previous.dtype)))
  return jnp.einsum("BHQKN,HN->BHQK", features,
                    projection.astype(previous.dtype))


def filter_widths(sizes: Sequence[int], num_heads: int) -> tuple[int, ...]:
  """One odd filter width per head, from `location_filter_sizes`: one width
  for all heads, or one per head.

  Raises:
    ConfigError: naming config.location_filter_sizes and num_heads.
  """
  if (not isinstance(sizes, (tuple, list))
      or len(sizes) not in (1, num_heads)
      or any(not validation.is_int(w) or w < 1 or w % 2 == 0
             for w in sizes)):
    raise ConfigError(
        "config.location_filter_sizes must be one odd width or one odd "
        f"width per head (num_heads={num_heads}), got {sizes!r}.")
  return tuple(int(w) for w in sizes) * (num_heads if len(sizes) == 1 else 1)


def check_config(config: Any) -> None:
  """The model config's fields of this variant (`TransformerConfig`):
  `location_filter_sizes` against `num_heads` (ConfigError)."""
  filter_widths(config.location_filter_sizes, config.num_heads)


def location_term(module: nn.Module, content_weights: jax.Array,
                  sentence_starts: jax.Array | None) -> jax.Array:
  """The location scores of `module` (a `MultiHeadAttention`) from the
  content weights `[B, H, Q, K]`.

  Parameters: `location_filter_<h>` `[width_h, N]` per head and
  `location_projection` `[H, N]`. Filters are zero-padded to the widest
  head's width, so a head of width w reads exactly w neighbouring keys.
  """
  num = module.location_num_filters
  widths = filter_widths(module.location_filter_sizes, module.num_heads)
  filters = [module.param(f"location_filter_{h}", nn.initializers.normal(1.0),
                          (width, num))
             for h, width in enumerate(widths)]
  projection = module.param("location_projection",
                            nn.initializers.normal(num ** -0.5),
                            (module.num_heads, num))
  previous = _previous_weights(module, content_weights, sentence_starts)
  return location_scores(previous, stack_filters(filters), projection)


def _previous_weights(module: nn.Module, content_weights: jax.Array,
                      sentence_starts: jax.Array | None) -> jax.Array:
  """c_{i-1} of every query: the content weights shifted by one position,
  or in incremental decoding the cached row of the previous step (which
  this step's row then replaces)."""
  if module.decode and module.has_variable("cache", PREVIOUS_WEIGHTS):
    # One query per step: the cache holds the previous step's content row.
    cached = module.variable("cache", PREVIOUS_WEIGHTS)
    previous = cached.value  # [rows, H, 1, K], one row per hypothesis
    b, h, g, k = content_weights.shape  # g > 1: rows by sentence
    cached.value = content_weights.astype(cached.value.dtype).transpose(
        0, 2, 1, 3).reshape(cached.value.shape)
    return previous.reshape(b, g, h, k).transpose(0, 2, 1, 3)
  if module.decode:  # initialising the cache: zeros before the first step
    b, h, _, k = content_weights.shape
    module.variable("cache", PREVIOUS_WEIGHTS, jnp.zeros, (b, h, 1, k),
                    jnp.float32)
  return previous_position_weights(content_weights, sentence_starts)
