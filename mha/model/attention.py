"""Attention (§3.2 of Vaswani et al. 2017): compatibility functions and heads.

Shapes follow Flax: `[batch, length, heads, head_dim]`. Letters in einsums:
B batch, Q query length, K key length, H heads, D key size d_k, V value size
d_v, M model size d_model.
"""
import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from mha import validation
from mha.model import dropout as dropout_lib
from mha.model import location
from mha.model.params import StoredParams

# The self-attention decode cache is stored as [B, H, D, L]: the axes of a
# [B, L, H, D] key or value in this order (`_append_to_cache`).
_CACHE_LAYOUT = (0, 2, 3, 1)


def masked_softmax(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
  """Softmax over the last axis with masked logits set to -inf first.

  A row whose every entry is masked gets all-zero weights (never NaN), so a
  query with nothing to attend to contributes nothing.

  Args:
    logits: `[..., K]` attention logits.
    mask: boolean, broadcastable to `logits`; True = may attend.

  Returns:
    Weights of `logits`' shape, computed in float32 at least.
  """
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  if mask is None:
    return jax.nn.softmax(logits, axis=-1)
  logits = jnp.where(mask, logits, -jnp.inf)
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  # A fully masked row has max -inf; shift by 0 instead so exp() gives zeros.
  row_max = lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  unnormalized = jnp.exp(logits - row_max)
  total = jnp.sum(unnormalized, axis=-1, keepdims=True)
  return unnormalized / jnp.where(total > 0, total, 1.0)


def _mix(weights: jax.Array, value: jax.Array, dropout_rate: float,
         dropout_rng: jax.Array | None, deterministic: bool) -> jax.Array:
  """Dropout on `[B, H, Q, K]` weights, then the weighted sum of values."""
  if not deterministic and dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("Attention dropout needs a dropout_rng.")
    keep = dropout_lib.keep_mask(dropout_rng, 1.0 - dropout_rate,
                                 weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  weights = weights.astype(value.dtype)
  # [B, H, Q, K] x [B, K, H, V] -> [B, Q, H, V]
  return jnp.einsum("BHQK,BKHV->BQHV", weights, value)


def _attend(logits: jax.Array, value: jax.Array, mask: jax.Array | None,
            dropout_rate: float, dropout_rng: jax.Array | None,
            deterministic: bool) -> jax.Array:
  """Masked softmax of `[B, H, Q, K]` logits, dropout, weighted sum of
  values."""
  return _mix(masked_softmax(logits, mask), value, dropout_rate, dropout_rng,
              deterministic)


def _dot_logits(query: jax.Array, key: jax.Array, scale: float) -> jax.Array:
  """[B, Q, H, D] x [B, K, H, D] -> `[B, H, Q, K]` logits q·k · scale."""
  # Scaling the query (Q·d_k values) is cheaper than scaling the Q·K logits.
  query = query * jnp.asarray(scale, query.dtype)
  return jnp.einsum("BQHD,BKHD->BHQK", query, key)


def _additive_logits(query: jax.Array, key: jax.Array,
                     energy: jax.Array) -> jax.Array:
  """`[B, H, Q, K]` logits vᵀ tanh(q + k) per head (`energy` = v, [H, D])."""
  # [B, Q, 1, H, D] + [B, 1, K, H, D] -> [B, Q, K, H, D]: memory grows as Q·K·D.
  hidden = jnp.tanh(query[:, :, None] + key[:, None, :])
  # [B, Q, K, H, D] x [H, D] -> [B, H, Q, K]
  return jnp.einsum("BQKHD,HD->BHQK", hidden, energy.astype(hidden.dtype))


def scaled_dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None = None,
    *,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
) -> jax.Array:
  """Attention(Q, K, V) = softmax(QKᵀ / √d_k) V, per head (eq. 1).

  Args:
    query: `[B, Q, H, d_k]`.
    key: `[B, K, H, d_k]`.
    value: `[B, K, H, d_v]`.
    mask: boolean, broadcastable to `[B, H, Q, K]`; True = may attend.
      Masked logits are set to -inf before the softmax; fully masked rows
      return zeros.
    scale: multiplies the logits; default 1/√d_k. `scale=1.0` is the unscaled
      dot-product attention of footnote 4.
    dropout_rate: dropout on the attention weights.
    dropout_rng: PRNG key for that dropout.
    deterministic: disables dropout.

  Returns:
    `[B, Q, H, d_v]`.
  """
  if scale is None:
    scale = _eq1_scale(query.shape[-1])
  logits = _dot_logits(query, key, scale)
  return _attend(logits, value, mask, dropout_rate, dropout_rng, deterministic)


def dot_product_attention(query, key, value, mask=None, **kwargs) -> jax.Array:
  """Unscaled dot-product attention softmax(QKᵀ)V (§3.2.1, footnote 4)."""
  return scaled_dot_product_attention(query, key, value, mask, scale=1.0,
                                      **kwargs)


def additive_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    energy: jax.Array,
    mask: jax.Array | None = None,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
) -> jax.Array:
  """Additive attention (Bahdanau et al.), the other function of §3.2.1.

  score(q, k) = vᵀ tanh(W_q q + W_k k), where `query` and `key` are already
  projected by W_q and W_k (the heads' projections) and `energy` is v.

  Args:
    query: `[B, Q, H, D]`, i.e. W_q q per head.
    key: `[B, K, H, D]`, i.e. W_k k per head.
    value: `[B, K, H, d_v]`.
    energy: `[H, D]`, the vector v of each head.
    mask, dropout_rate, dropout_rng, deterministic: as in
      `scaled_dot_product_attention`.

  Returns:
    `[B, Q, H, d_v]`.
  """
  logits = _additive_logits(query, key, energy)
  return _attend(logits, value, mask, dropout_rate, dropout_rng, deterministic)


def _xla_attention(query, key, value, mask, scale):
  """`jax.nn.dot_product_attention` with the same mask convention.

  jax's kernel gives fully masked rows uniform weights instead of zeros; those
  rows are zeroed here so both implementations agree everywhere. It also
  needs one head size for queries, keys and values: where d_k != d_v (Table
  3 row B), the narrower side is padded with zeros, which changes neither
  QKᵀ (the scale stays 1/√d_k) nor the first d_v output features, and the
  padding is sliced off the output.
  """
  d_k, d_v = query.shape[-1], value.shape[-1]
  width = max(d_k, d_v)
  pad = lambda x: jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])])
  out = jax.nn.dot_product_attention(pad(query), pad(key), pad(value),
                                     mask=mask, scale=scale,
                                     implementation="xla")[..., :d_v]
  if mask is not None:
    b, q, h = query.shape[:3]
    any_key = jnp.any(jnp.broadcast_to(mask, (b, h, q, key.shape[1])), axis=-1)
    out = jnp.where(jnp.transpose(any_key, (0, 2, 1))[..., None], out, 0)
  return out


# A variant's compatibility function in `MultiHeadAttention`: (the module,
# projected queries [B, Q, H, d_k], keys [B, K, H, d_k], the mask, the
# packed rows' sentence starts [B, Q] or None) -> logits [B, H, Q, K].
# It creates the variant's own parameters and decode-cache variables on the
# module (`module.param`, `module.variable`).
Logits = Callable[[nn.Module, jax.Array, jax.Array, jax.Array | None,
                   jax.Array | None], jax.Array]


@dataclasses.dataclass(frozen=True)
class AttentionVariant:
  """What the model needs to build and run one `attention_type`.

  Attributes:
    logits: its compatibility function (`Logits`).
    xla_scale: for a plain dot-product variant, whose logits are q·k ·
      xla_scale(d_k): `attention_impl='xla'` runs it as
      `jax.nn.dot_product_attention`. None: the einsum path only.
    cross_attention_only: used in encoder-decoder attention only; the
      Transformer's self-attention then uses `SELF_ATTENTION_TYPE`
      (`layer_attention_type`).
    cache: the decode-cache variables it adds to those of every variant
      (the keys and values); each needs its rows in the search's
      `mha.search.batches.CACHE_ROWS`.
    check: refuses a model config (`TransformerConfig`) whose fields of
      this variant cannot be right (ConfigError naming the field).
  """
  logits: Logits
  xla_scale: Callable[[int], float] | None = None
  cross_attention_only: bool = False
  cache: tuple[str, ...] = ()
  check: Callable[[Any], None] = lambda config: None


def _eq1_scale(d_k: int) -> float:
  """1/√d_k, eq. 1's scale."""
  return 1.0 / np.sqrt(d_k)


def _dot_product(scale: Callable[[int], float]) -> AttentionVariant:
  """The variant of logits q·k · scale(d_k)."""
  def logits(module, query, key, mask, sentence_starts):
    del module, mask, sentence_starts
    return _dot_logits(query, key, scale(query.shape[-1]))
  return AttentionVariant(logits, xla_scale=scale)


def _additive_variant_logits(module, query, key, mask, sentence_starts):
  """vᵀ tanh(q + k) (`additive_attention`), v the parameter `energy`
  `[H, d_k]`."""
  del mask, sentence_starts
  d_k = query.shape[-1]
  energy = module.param("energy", nn.initializers.normal(d_k ** -0.5),
                        (module.num_heads, d_k))
  return _additive_logits(query, key, energy)


def _location_variant_logits(module, query, key, mask, sentence_starts):
  """Eq. 1's logits plus the location term of their content weights
  (`mha.model.location`)."""
  logits = _dot_logits(query, key, _eq1_scale(query.shape[-1]))
  return logits + location.location_term(
      module, masked_softmax(logits, mask), sentence_starts)


# The one table of attention variants: config.attention_type -> how the
# model builds and runs it. A new variant is an entry here (its function
# here or in a module of its own, as location-aware attention's) and its
# name in `mha.validation.ATTENTION_TYPES`, in the same order (the rule
# that refuses other names, below the model; a test keeps the two equal).
ATTENTION_VARIANTS: dict[str, AttentionVariant] = {
    "scaled_dot": _dot_product(_eq1_scale),
    "dot": _dot_product(lambda d_k: 1.0),  # §3.2.1, footnote 4
    "additive": AttentionVariant(_additive_variant_logits),
    "location": AttentionVariant(
        _location_variant_logits, cross_attention_only=True,
        cache=(location.PREVIOUS_WEIGHTS,), check=location.check_config),
}
# Self-attention's variant where config.attention_type is one of
# encoder-decoder attention only: eq. 1's.
SELF_ATTENTION_TYPE = "scaled_dot"


def layer_attention_type(attention_type: str, cross_attention: bool) -> str:
  """The variant an attention layer uses under `attention_type` (the
  config's): the config's, or in self-attention `SELF_ATTENTION_TYPE` for a
  variant of encoder-decoder attention only."""
  if cross_attention or not ATTENTION_VARIANTS[
      attention_type].cross_attention_only:
    return attention_type
  return SELF_ATTENTION_TYPE


class MultiHeadAttention(StoredParams, nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (§3.2.2).

  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V). The h projections of each of
  Q, K and V are fused into one kernel (one matmul for all heads).

  The compatibility function is the one of `attention_type` in
  `ATTENTION_VARIANTS` (its own parameters and decode-cache variables
  included); the mask, softmax, attention dropout and weighted sum of
  values are shared by all.

  With attention_impl='einsum' the weights after the softmax (before dropout)
  are sown as `intermediates/attention_weights` `[B, H, Q, K]`: apply with
  `mutable=['intermediates']` to read them (attention maps).

  Attributes:
    num_heads: h.
    d_k: query/key size per head (default d_model / h).
    d_v: value size per head (default d_model / h); Table 3 rows A and B set
      d_k and d_v apart from d_model / h.
    out_features: output size (default: the size of `inputs_q`, d_model).
    attention_type: a name of `ATTENTION_VARIANTS`: `scaled_dot` (eq. 1),
      `dot` (unscaled), `additive` or `location` (scaled dot plus a location
      term: `mha.model.location`).
    attention_impl: `einsum` (this module's own) or `xla`
      (`jax.nn.dot_product_attention`); the latter for the plain dot-product
      variants only (`AttentionVariant.xla_scale`: `scaled_dot` and `dot`),
      and without attention dropout.
    location_filter_sizes: odd filter widths, one for all heads or one per
      head (`location` only).
    location_num_filters: filters per head (`location` only).
    dropout_rate: dropout on the attention weights.
    deterministic: disables dropout.
    decode: incremental decoding with a cache (see `__call__`).
    dtype: computation dtype; parameters stay in float32.
    matmul_dtype: the projections' products (`weight_product`).
    kernel_init: initializer of the projections.
    use_bias: biases on the Q, K, V projections (`<name>_bias`, `[h,
      head_size]`) and on W^O (`out_bias`, `[out_features]`), zero at
      init (config.attention_bias, Marian's); the paper's have none.
  """
  num_heads: int
  d_k: int | None = None
  d_v: int | None = None
  out_features: int | None = None
  attention_type: str = "scaled_dot"
  attention_impl: str = "einsum"
  location_filter_sizes: tuple[int, ...] = (7,)
  location_num_filters: int = 8
  dropout_rate: float = 0.0
  deterministic: bool = True
  decode: bool = False
  dtype: jnp.dtype = jnp.float32
  matmul_dtype: str = "float32"
  kernel_init: Callable = nn.initializers.xavier_uniform()
  use_bias: bool = False

  def _projection(self, name: str, d_model: int, head_size: int) -> jax.Array:
    """The fused kernel [d_model, h, head_size] of the h heads' projections.

    As in §3.2.2 the projections are linear maps without bias, unless
    `use_bias` (`_biased`). (A key bias adds q·b, the same for every key,
    to a row of logits: the softmax cancels it, its gradient is rounding
    noise, and Adam's normalisation turns that noise into full-size
    updates; Marian's models have one, kept so that they are represented
    exactly.)
    """
    # W^Q = [W_1^Q, ..., W_h^Q] ∈ R^{d_model × h × d_k};
    # W_i^Q = kernel[:, i, :].
    kernel = self.param(
        f"{name}_kernel",
        lambda rng, shape: self.kernel_init(
            rng, (d_model, self.num_heads * head_size)).reshape(shape),
        (d_model, self.num_heads, head_size))
    return kernel.astype(self.dtype)

  def _bias(self, name: str, shape: tuple[int, ...]) -> jax.Array | None:
    """The bias `name` (zeros at init) where `use_bias`, else None."""
    if not self.use_bias:
      return None
    return self.param(name, nn.initializers.zeros_init(), shape
                      ).astype(self.dtype)

  def _project(self, name: str, x: jax.Array, head_size: int) -> jax.Array:
    """x [B, L, M] -> [B, L, H, head_size] through a fused kernel (and its
    bias, `_bias`)."""
    kernel = self._projection(name, x.shape[-1], head_size)
    # [B, L, M] x [M, H, D] -> [B, L, H, D]
    return _plus(weight_product("BLM,MHD->BLHD", x.astype(self.dtype), kernel,
                                self.matmul_dtype),
                 self._bias(f"{name}_bias", (self.num_heads, head_size)))

  @nn.compact
  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array,
               mask: jax.Array | None = None, *,
               cross_attention: bool = False,
               sentence_starts: jax.Array | None = None) -> jax.Array:
    """Attends from `inputs_q` to `inputs_kv`.

    Args:
      inputs_q: `[B, Q, d_model]`.
      inputs_kv: `[B, K, d_model]`.
      mask: boolean, broadcastable to `[B, H, Q, K]`; True = may attend.
      cross_attention: with `decode=True`, marks encoder-decoder attention:
        its keys and values are projected once, on the first decoding step,
        and read from the cache afterwards. Self-attention with `decode=True`
        appends one position per call to the key/value cache and attends to
        every position written so far (`mask` is then ignored: causality comes
        from the cache index).
      sentence_starts: `[B, Q]`, True where a query starts a packed sentence,
        for the variants that read the previous query position's weights
        (`location`: none there).

    Returns:
      `[B, Q, out_features]`.
    """
    validation.check_field("attention_type", self.attention_type)
    validation.check_field("attention_impl", self.attention_impl)
    d_model = inputs_q.shape[-1]
    d_k = self.d_k or d_model // self.num_heads
    d_v = self.d_v or d_model // self.num_heads
    out_features = self.out_features or d_model

    query = self._project("query", inputs_q, d_k)  # [B, Q, H, d_k]
    if self.decode and cross_attention:
      key, value, mask = self._cached_cross_kv(inputs_kv, mask, d_k, d_v,
                                               query.shape[0])
      query = _queries_by_sentence(query, key.shape[0])  # [b, G * Q, H, D]
    else:
      key = self._project("key", inputs_kv, d_k)  # [B, K, H, d_k]
      value = self._project("value", inputs_kv, d_v)  # [B, K, H, d_v]
      if self.decode:
        key, value, mask = self._append_to_cache(key, value)

    heads = self._heads(query, key, value, mask, sentence_starts)
    # heads [B, Q, H, d_v]; W^O ∈ R^{h·d_v × d_model}, stored as [H, d_v, M].
    w_out = self.param(
        "out_kernel",
        lambda rng, shape: self.kernel_init(
            rng, (self.num_heads * d_v, out_features)).reshape(shape),
        (self.num_heads, d_v, out_features))
    # Concat(head_1..head_h) W^O: [B, Q, H, V] x [H, V, M] -> [B, Q, M]
    # Rows by sentence (cached cross-attention) back to one row per query.
    heads = heads.reshape(inputs_q.shape[:2] + heads.shape[2:])
    return _plus(weight_product("BQHV,HVM->BQM", heads,
                                w_out.astype(self.dtype), self.matmul_dtype),
                 self._bias("out_bias", (out_features,)))

  def _heads(self, query: jax.Array, key: jax.Array, value: jax.Array,
             mask: jax.Array | None,
             sentence_starts: jax.Array | None) -> jax.Array:
    """head_1..head_h `[B, Q, H, d_v]` from projected queries, keys, values:
    the compatibility function, masked softmax, attention dropout, and the
    weighted sum of values."""
    variant = ATTENTION_VARIANTS[self.attention_type]
    dropout_rng = None
    if not self.deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    if self.attention_impl == "xla" and variant.xla_scale is not None:
      if dropout_rng is not None:
        raise ValueError("attention_impl='xla' has no attention dropout; set "
                         "attention_dropout_rate=0 or attention_impl='einsum'.")
      return _xla_attention(query, key, value, mask,
                            variant.xla_scale(query.shape[-1]))
    logits = variant.logits(self, query, key, mask, sentence_starts)
    weights = masked_softmax(logits, mask)  # [B, H, Q, K]
    self.sow("intermediates", "attention_weights", weights)
    return _mix(weights, value, self.dropout_rate, dropout_rng,
                self.deterministic)

  def _append_to_cache(self, key, value):
    """Writes this step's key/value at the cache index; returns the cache.

    The cache is created (zero-filled, sized by the length of `inputs_kv`)
    when the module is initialised with `decode=True`, as in Flax. It is
    stored as `[B, H, D, L]` (`cached_key`, `cached_value`), the layout in
    which XLA's attention products read it (stored as `[B, L, H, D]`, the
    whole cache was transposed for them at every step), and returned as
    `[B, L, H, D]` (a transposed view).

    `cache_index` is one position for all rows, or `[B]`, one per row (a
    search that refills finished rows with new sentences, `mha.search.refill`):
    row b then writes at its own position and attends to positions
    0..index[b]; what its earlier sentence left beyond is masked.
    """
    layout = lambda x: jnp.transpose(x, _CACHE_LAYOUT)  # [B, L, H, D] -> store
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros,
                               layout(key).shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros,
                                 layout(value).shape, value.dtype)
    cache_index = self.variable("cache", "cache_index",
                                lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return key, value, None
    if key.shape[1] != 1:
      raise ValueError("Incremental decoding takes one position per call, got "
                       f"{key.shape[1]}.")
    index = cache_index.value
    cached_key.value = _write_position(cached_key.value, key, index)
    cached_value.value = _write_position(cached_value.value, value, index)
    cache_index.value = index + 1
    view = lambda x: jnp.transpose(x, tuple(np.argsort(_CACHE_LAYOUT)))
    key, value = view(cached_key.value), view(cached_value.value)
    # The query at position `index` attends to positions 0..index.
    positions = jnp.arange(key.shape[1])
    if jnp.ndim(index):  # [B, 1, 1, L]
      return key, value, (positions <= index[:, None])[:, None, None, :]
    return key, value, (positions <= index)[None, None, None, :]

  def _cached_cross_kv(self, inputs_kv, mask, d_k, d_v, rows):
    """Encoder-decoder keys/values of the decode cache, one row per sentence.

    `inputs_kv` `[b, S, d_model]` has one row per sentence; the queries have
    `rows` = b * G rows, G hypotheses per sentence ordered `[sentence,
    hypothesis]` (G = 1 without a beam). The keys and values are projected
    and cached once per sentence (`source_key` / `source_value`, b rows);
    `__call__` attends from the G query rows of sentence i to key row i
    (`_queries_by_sentence`), under the mask of sentence i.

    The cache is made in one of two ways:

    * applying the model with its parameters and `mutable=['cache']` on the
      encoder output (`mha.search.texts`): the keys and values are projected
      then, and every step reads them as they are;
    * `model.init` (random parameters, so nothing can be projected yet):
      zeros and a `filled` flag, and the first step projects them (a
      `lax.cond` on the flag, which copies them at every step).

    Returns:
      `(key, value, mask)`: `[b, S, H, d_k / d_v]` and `mask` as given; in
      the call that makes the cache, repeated to `rows` rows each, so that
      the call's other cache variables (`previous_weights`) are made per
      query row (that call's output is not a decoding step's).
    """
    initialized = self.has_variable("cache", "source_key")
    d_model = inputs_kv.shape[-1]
    w_key = self._projection("key", d_model, d_k)
    w_value = self._projection("value", d_model, d_v)
    b_key = self._bias("key_bias", (self.num_heads, d_k))
    b_value = self._bias("value_bias", (self.num_heads, d_v))
    inputs_kv = inputs_kv.astype(self.dtype)

    def project():
      return (_plus(weight_product("BLM,MHD->BLHD", inputs_kv, w_key,
                                   self.matmul_dtype), b_key),  # [b,S,H,d_k]
              _plus(weight_product("BLM,MHD->BLHD", inputs_kv, w_value,
                                   self.matmul_dtype), b_value))

    batch = inputs_kv.shape[0]
    if not initialized:
      key, value = project()
      stored = (key, value)
      if self.is_initializing():
        self.variable("cache", "filled", lambda: jnp.array(False))
        stored = (jnp.zeros_like(key), jnp.zeros_like(value))
      self.variable("cache", "source_key", lambda: stored[0])
      self.variable("cache", "source_value", lambda: stored[1])
      per_row = lambda x: (x if x is None or x.shape[0] != batch else
                           jnp.repeat(x, rows // batch, axis=0))
      return per_row(key), per_row(value), per_row(mask)
    cached_key = self.variable("cache", "source_key")
    cached_value = self.variable("cache", "source_value")
    if not self.has_variable("cache", "filled"):  # made with the parameters
      return cached_key.value, cached_value.value, mask
    filled = self.variable("cache", "filled")
    # Only the branch taken runs: the projections cost nothing after step 1.
    key, value = lax.cond(filled.value,
                          lambda: (cached_key.value, cached_value.value),
                          project)
    cached_key.value, cached_value.value = key, value
    filled.value = jnp.array(True)
    return key, value, mask


def _plus(y: jax.Array, bias: jax.Array | None) -> jax.Array:
  """`y + bias`, or `y` itself (the same array) for no bias."""
  return y if bias is None else y + bias


def _write_position(cache: jax.Array, x: jax.Array,
                    index: jax.Array) -> jax.Array:
  """`x` `[B, 1, H, D]` written into `cache` `[B, H, D, L]` at position
  `index`: one for all rows (`[]`) or one per row (`[B]`; a position past
  the cache writes nothing)."""
  x = jnp.transpose(x.astype(cache.dtype), _CACHE_LAYOUT)  # [B, H, D, 1]
  if jnp.ndim(index):
    return cache.at[jnp.arange(cache.shape[0]), :, :, index].set(
        x[..., 0], mode="drop")
  start = tuple(index if axis == 1 else 0 for axis in _CACHE_LAYOUT)
  return lax.dynamic_update_slice(cache, x, start)


def _queries_by_sentence(query: jax.Array, sentences: int) -> jax.Array:
  """`[b * G, Q, H, D]` queries, rows ordered `[sentence, hypothesis]`, as
  `[b, G * Q, H, D]`: the G hypotheses of a sentence attend to its one row
  of keys and values. (A reshape: no copy; the output is reshaped back.)"""
  rows, length = query.shape[:2]
  if rows == sentences:
    return query
  if rows % sentences:
    raise ValueError(f"{rows} query rows cannot attend to {sentences} rows of "
                     "keys: expected a multiple (hypotheses per sentence).")
  return query.reshape((sentences, rows // sentences * length)
                       + query.shape[2:])


def weight_product(spec: str, x: jax.Array, weights: jax.Array,
                   matmul_dtype: str = "float32") -> jax.Array:
  """`jnp.einsum(spec, x, weights)`: activations times a weight matrix.

  `matmul_dtype='bfloat16'` (a search setting, `mha.SearchSettings`): a
  float32 product takes both operands in bfloat16 and returns float32, as
  a TPU's default precision does; on CPUs with bfloat16 instructions
  (AVX512-BF16) such products run faster (bench/README.md), and the
  results differ from float32's by bfloat16's rounding of the inputs.
  'float32' (the default) and any other computation dtype: the product as
  it is.
  """
  if matmul_dtype == "float32" or x.dtype != jnp.float32:
    return jnp.einsum(spec, x, weights)
  return jnp.einsum(spec, x.astype(jnp.bfloat16),
                    weights.astype(jnp.bfloat16),
                    preferred_element_type=jnp.float32)


def dot_general_of(matmul_dtype: str) -> Callable[..., jax.Array] | None:
  """`nn.Dense`'s `dot_general` for `matmul_dtype` (`weight_product`):
  None (lax.dot_general) for float32."""
  if matmul_dtype == "float32":
    return None

  def dot_general(lhs, rhs, dimension_numbers, precision=None,
                  preferred_element_type=None):
    del precision, preferred_element_type
    if lhs.dtype != jnp.float32:
      return lax.dot_general(lhs, rhs, dimension_numbers)
    return lax.dot_general(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16),
                           dimension_numbers,
                           preferred_element_type=jnp.float32)

  return dot_general
