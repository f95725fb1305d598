"""The Transformer's side of the search: `mha.search.decoding`'s searches
are model-agnostic, over a step function and its cache, and this module
makes them for the Transformer.

The model a search runs (`_search_model`), its step function and cache
(`_model_fns`: the encoder run once, the encoder-decoder keys and values
stored once per sentence in the products' layout), what the rows of each
cache variable are (`CACHE_ROWS`, `cache_rows`), the cache grown between
stages (`_grow_cache_fn`), and the cache of a search with refilled rows
(`mha.search.refill`): every sentence's source keys and values made before
the search (`_refill_queue`) and copied into the rows of a slot that starts
a sentence (`_start_rows_fn`). `mha.search.batches` runs the searches over
these on the devices.
"""
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from mha.model.transformer import Transformer
from mha.model.transformer import TransformerConfig
from mha.model.transformer import create_model
from mha.search.cache_rows import CacheRows
from mha.search.common import TokensToLogits, _pad_axis, pad_to
from mha.search.refill import StartRows
from mha.search.settings import SearchSettings


# ------------------------------------------------- the Transformer's search

# What the rows of each cache variable of the Transformer are, for the search
# (`mha.search.cache_rows.CacheRows`): those of
# `mha.model.attention.MultiHeadAttention` and of `mha.model.positional`'s
# decoder position embedding.
CACHE_ROWS = {
    "position_index": CacheRows.SHARED,  # [] decoded positions
    "cache_index": CacheRows.SHARED,  # [] decoded positions
    # Decoder self-attention: [rows, h, d_k / d_v, max_decode_len].
    "cached_key": CacheRows.HYPOTHESIS,
    "cached_value": CacheRows.HYPOTHESIS,
    # Location-aware attention: [rows, h, 1, keys], the previous step's row.
    "previous_weights": CacheRows.HYPOTHESIS,
    # Encoder-decoder keys and values, [batch, s, h, d_k / d_v] (in the
    # search's cache [batch, h, d, s]: `_source_kv_stored`): one row per
    # sentence, read by the sentence's every hypothesis.
    "source_key": CacheRows.ONE_PER_SENTENCE,
    "source_value": CacheRows.ONE_PER_SENTENCE,
    # In a cache made by `model.init` (not this module's): [] whether the
    # first step has projected source_key / source_value yet.
    "filled": CacheRows.SHARED,
    # The search's cache (`_model_fns`) beside the decoder's: the encoder
    # output [batch, s, d_model] and the source ids [batch, s].
    "encoded": CacheRows.ONE_PER_SENTENCE,
    "inputs": CacheRows.ONE_PER_SENTENCE,
}


def cache_rows(cache: Any) -> Any:
  """The `CacheRows` of every leaf of a Transformer's decode cache.

  Raises:
    ValueError: a cache variable missing from `CACHE_ROWS` (a new one must
      say whether its rows are shared, per hypothesis or per sentence).
  """
  def kind(path, _):
    name = getattr(path[-1], "key", None)
    if name not in CACHE_ROWS:
      raise ValueError(f"Cache variable {jax.tree_util.keystr(path)} is not "
                       "in mha/search/model_cache.py's CACHE_ROWS: add what "
                       "its rows are.")
    return CACHE_ROWS[name]

  return jax.tree_util.tree_map_with_path(kind, cache)


def _model_fns(model: Transformer, params: Any, inputs: jax.Array,
               beam_size: int, max_decode_len: int
               ) -> tuple[TokensToLogits, Any,
                          Callable[[Any, int], Any]]:
  """The Transformer's step function and initial cache for the search.

  `encode(inputs)` once per sentence; the cache is made by applying the
  decoder with the parameters (`_init_cache`); `decode(encoded, inputs,
  tokens)` with the `cache` collection is the step function (`_step_fn`):
  the encoder output and the source mask stay at one row per sentence.

  Args:
    model: the Transformer built with `decode=True, deterministic=True`.
    params: its parameters.
    inputs: int32 `[batch, s]` source tokens, 0 = pad.
    beam_size: hypotheses per sentence.
    max_decode_len: cache length.

  The search's cache is `{"model": the decoder's cache, "encoded": ...,
  "inputs": ...}`: the encoder output and the source ids ride in it, one
  row per sentence, so that the step function takes any number of
  sentences (the search's `shrink_sizes`).

  Returns:
    `(tokens_to_logits, cache, grow_cache)` for `batch * beam_size` rows
    (`_grow_cache_fn` for `grow_cache`).
  """
  encoded = model.apply({"params": params}, inputs, method="encode")
  init_cache = functools.partial(_init_cache, model, params, encoded, inputs,
                                 inputs.shape[0] * beam_size)
  first = init_cache(max_decode_len)
  return (_step_fn(model, params),
          {"model": _source_kv_stored(first), "encoded": encoded,
           "inputs": inputs},
          _grow_cache_fn(init_cache, first))


# The encoder-decoder keys and values, `[b, S, h, d]` in the decoder's
# cache, ride in the search's cache as `[b, h, d, S]`: the layout in which
# the attention products read them (`_step_fn` hands the decoder a
# transposed view, which XLA folds into the products' operands). Stored as
# the decoder makes them, they were transposed at every step of the search.
_SOURCE_KV = ("source_key", "source_value")
_SOURCE_KV_LAYOUT = (0, 2, 3, 1)  # [b, S, h, d] -> [b, h, d, S]


def _map_source_kv(cache: Any, fn: Callable[[jax.Array], jax.Array]) -> Any:
  def leaf(path, x):
    return fn(x) if getattr(path[-1], "key", None) in _SOURCE_KV else x
  return jax.tree_util.tree_map_with_path(leaf, cache)


def _source_kv_stored(cache: Any) -> Any:
  """The decoder's cache with its encoder-decoder keys and values as the
  search stores them (`[b, h, d, S]`)."""
  return _map_source_kv(cache, lambda x: jnp.transpose(x, _SOURCE_KV_LAYOUT))


def _source_kv_view(cache: Any) -> Any:
  """The search's stored cache as the decoder reads it (`[b, S, h, d]`)."""
  # The barrier keeps XLA from cancelling this transposition against the
  # stored one (it would carry [b, S, h, d] again).
  return _map_source_kv(cache, lambda x: jnp.transpose(
      lax.optimization_barrier(x), tuple(np.argsort(_SOURCE_KV_LAYOUT))))


def _init_cache(model: Transformer, params: Any, encoded: jax.Array,
                inputs: jax.Array, num_rows: int, length: int) -> Any:
  """The decoder's cache for `num_rows` hypotheses and `length` outputs.

  Made by applying the decoder with the parameters (`mutable=["cache"]`),
  which projects the encoder-decoder keys and values once per sentence
  (`[batch, s, h, d]`, `CacheRows.ONE_PER_SENTENCE`); the self-attention
  keys and values have a row per hypothesis (rows ordered [batch, beam]).
  """
  # Only the cache is kept: XLA drops the rest of this decoder pass.
  _, made = model.apply({"params": params}, encoded, inputs,
                        jnp.ones((num_rows, length), jnp.int32),
                        mutable=["cache"], method="decode")
  return made["cache"]


def _grow_cache_fn(init_cache: Callable[[int], Any], first: Any
                   ) -> Callable[[Any, int], Any]:
  """`grow_cache(cache, length)`: every leaf of the search's cache whose
  shape depends on the output length (the self-attention keys and values)
  padded with zeros along the axes that depend on it, to the size of a
  cache `init_cache(length)` (any number of rows)."""
  first_shapes = jax.tree.map(lambda x: x.shape, first)

  def grow_cache(cache: Any, length: int) -> Any:
    shapes = jax.eval_shape(functools.partial(init_cache, length))

    def pad(x, made_first, made):
      if x.ndim != len(made_first):  # per-row positions ([rows], not [])
        return x
      # Only the axes that grow with the output length; the rows stay.
      shape = [n if a == b else c for n, a, b, c in zip(
          x.shape, made_first, made.shape, made.shape)]
      return pad_to(x, shape)

    return dict(cache, model=jax.tree.map(pad, cache["model"], first_shapes,
                                          shapes))

  return grow_cache


def _step_fn(model: Transformer, params: Any) -> TokensToLogits:
  """The search's step function: tokens `[rows, 1]` and the search's cache
  -> (logits `[rows, V]`, the cache with the decoder's part advanced)."""

  def tokens_to_logits(tokens: jax.Array, cache: Any):
    logits, mutated = model.apply(
        {"params": params, "cache": _source_kv_view(cache["model"])},
        cache["encoded"], cache["inputs"], tokens, mutable=["cache"],
        method="decode")
    # [rows, V]; the cache back in the search's layout.
    return logits[:, 0], dict(cache, model=_source_kv_stored(
        mutated["cache"]))

  return tokens_to_logits


# --------------------------------------------------------------- refilled rows

_POSITIONS = ("cache_index", "position_index")


def _leaf_name(path) -> Any:
  return getattr(path[-1], "key", None)


def _source_leaves(cache: Any) -> list[jax.Array]:
  """The encoder-decoder keys and values of a decoder's cache, in tree
  order."""
  return [x for path, x in jax.tree_util.tree_flatten_with_path(cache)[0]
          if _leaf_name(path) in _SOURCE_KV]


def _refill_queue(model: Transformer, params: Any,
                  inputs: Sequence[jax.Array], length: int, beam_size: int
                  ) -> tuple[list[jax.Array], jax.Array, Any]:
  """The source keys and values of every sentence of `inputs`, arrays
  `[k, rows, s]` of k batches each, `[sentences, h, d, s_max]` (the
  search's layout, the source positions padded to the longest s with
  zeros), made batch by batch by `Transformer.source_kv` (the
  projections of `_model_fns`'s decoder pass, without the rest of that
  pass, which a trace would otherwise go through once a source length);
  the source
  ids `[sentences, s_max]`; and the shapes of the decoder's cache of one
  batch of s_max positions (`beam_size` rows a sentence) for `length`
  outputs, as the decoder makes it.

  The padding changes no bits of the decoder's outputs (its keys are
  masked; checked on the trained Multi30k model, bench/README.md).
  """
  num_slots = inputs[0].shape[1]
  width = max(x.shape[2] for x in inputs)

  def make(batch_inputs):
    encoded = model.apply({"params": params}, batch_inputs, method="encode")
    return _init_cache(model, params, encoded, batch_inputs,
                       batch_inputs.shape[0] * beam_size, length)

  def sources(batch_inputs):  # the cache's source keys and values alone
    encoded = model.apply({"params": params}, batch_inputs, method="encode")
    _, made = model.apply({"params": params}, encoded, batch_inputs,
                          mutable=["cache"], method="source_kv")
    return _source_leaves(_source_kv_stored(made["cache"]))

  def padded(x):  # [k, rows, ..., s] -> [k * rows, ..., width]
    x = _pad_axis(x, x.ndim - 1, width)
    return x.reshape((-1,) + x.shape[2:])

  parts = [lax.map(sources, x) for x in inputs]
  queue = [jnp.concatenate([padded(part[i]) for part in parts])
           for i in range(len(parts[0]))]
  ids = jnp.concatenate([padded(x) for x in inputs])
  return queue, ids, jax.eval_shape(make, ids[:num_slots])


def _refill_cache(shapes: Any, queue: list[jax.Array], inputs: jax.Array,
                  num_slots: int, beam_size: int, d_model: int) -> Any:
  """The search's cache of slots 0..num_slots-1 on sentences
  0..num_slots-1 (`beam_size` rows each): positions one per row, source
  keys and values from the `queue`, the rest zeros as the decoder makes
  them (`inputs`: `[sentences, s]`)."""
  sources = iter(queue)

  def leaf(path, shape):
    if _leaf_name(path) in _SOURCE_KV:
      return next(sources)[:num_slots]
    if _leaf_name(path) in _POSITIONS:
      return jnp.zeros((num_slots * beam_size,), shape.dtype)
    return jnp.zeros(shape.shape, shape.dtype)

  model_cache = jax.tree_util.tree_map_with_path(leaf, shapes)
  # The encoder output is not read by a step (the source keys and values
  # are cached): zeros of its shape.
  return {"model": model_cache, "inputs": inputs[:num_slots],
          "encoded": jnp.zeros((num_slots, inputs.shape[1], d_model))}


def _start_rows_fn(queue: list[jax.Array], queue_inputs: jax.Array
                   ) -> StartRows:
  """`refill.greedy_refill`'s and `beam_refill`'s `start_rows` for the
  cache of `_refill_cache`: the positions of a started slot's rows back to
  0, their `previous_weights` zeros, and its sentence's source keys, values
  and ids copied in, slot by slot (a loop over the started slots only)."""
  def start_rows(cache, start, sentence):
    def reset(path, x):
      if _leaf_name(path) not in _POSITIONS + ("previous_weights",):
        return x
      rows = jnp.repeat(start, x.shape[0] // start.shape[0])  # [slot, beam]
      return jnp.where(rows.reshape(rows.shape + (1,) * (x.ndim - 1)),
                       jnp.zeros((), x.dtype), x)

    model_cache = jax.tree_util.tree_map_with_path(reset, cache["model"])
    flat, tree = jax.tree_util.tree_flatten_with_path(model_cache)
    where = [i for i, (path, _) in enumerate(flat)
             if _leaf_name(path) in _SOURCE_KV]
    sources = queue + [queue_inputs]
    order = jnp.argsort(~start, stable=True)  # the started slots first

    def copy(i, leaves):
      row, taken = order[i], sentence[order[i]]
      return [lax.dynamic_update_index_in_dim(
          x, lax.dynamic_index_in_dim(y, taken, 0, keepdims=False), row, 0)
              for x, y in zip(leaves, sources)]

    leaves = lax.fori_loop(0, jnp.sum(start), copy,
                           [flat[i][1] for i in where] + [cache["inputs"]])
    values = [x for _, x in flat]
    for i, x in zip(where, leaves):
      values[i] = x
    return dict(cache, model=jax.tree_util.tree_unflatten(tree, values),
                inputs=leaves[-1])

  return start_rows


def _search_model(model_config: TransformerConfig,
                  settings: SearchSettings) -> Transformer:
  """The model a search with `settings` runs: the eval variant with a
  decode cache, its weight products in `settings.matmul_dtype`."""
  return create_model(model_config.replace(
      matmul_dtype=settings.matmul_dtype), decode=True, deterministic=True)
