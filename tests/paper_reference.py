"""The paper's Transformer written out by hand in plain jax.numpy, for tests.

An independent re-implementation of §3 of Vaswani et al. (2017) over the
parameter pytree of `mha.Transformer` (shared embeddings): it imports nothing
from `mha`, so a test comparing the two sees any line of the library that
departs from the paper. Everything the paper fixes is written here from the
paper: embeddings times √d_model (§3.4), sinusoids with base 10000 (§3.5),
softmax(QKᵀ/√d_k)V with masked keys at -inf (eq. 1), h heads with W^O
(§3.2.2), max(0, xW₁ + b₁)W₂ + b₂ (eq. 2), LayerNorm(x + Dropout(Sublayer(x)))
(§3.1, §5.4), dropout on the embedding + position sums (§5.4), the
pre-softmax projection with the embedding matrix (§3.4) and the
label-smoothed cross entropy (§5.4).

Dropout is supplied by the caller: `drop(x, kind)` with kind `residual`,
`embedding` or `attention` returns x with dropout applied (or x itself
without dropout), so a test can apply the very masks the model drew.
`param_count` counts the parameters of those shapes by hand.

Beyond the paper, the options an OPUS-MT (Marian) model needs, each written
from its formula: the FFN's activation (`ACTIVATIONS`: swish x/(1 + e^-x),
the exact gelu x·(1 + erf(x/√2))/2), the layer norms' ε, and the biases of
the attention projections and of the pre-softmax logits, used wherever the
parameter tree holds them (`query_bias`, `key_bias`, `value_bias`,
`out_bias`, `output_bias`).
"""
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Drop = Callable[[jax.Array, str], jax.Array]

ACTIVATIONS = {
    "relu": lambda x: jnp.maximum(x, 0.0),  # eq. 2
    "swish": lambda x: x / (1.0 + jnp.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1.0 + jax.scipy.special.erf(
        x / np.sqrt(2.0))),
}


def no_dropout(x: jax.Array, kind: str) -> jax.Array:
  del kind
  return x


def sinusoids(length: int, d_model: int) -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...)."""
  pe = np.zeros((length, d_model))
  for pos in range(length):
    for i in range(0, d_model, 2):
      angle = pos / 10000 ** (i / d_model)
      pe[pos, i] = np.sin(angle)
      if i + 1 < d_model:
        pe[pos, i + 1] = np.cos(angle)
  return pe.astype(np.float32)


def layer_norm(p, x: jax.Array, eps: float = 1e-6) -> jax.Array:
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def attention(p, x_q: jax.Array, x_kv: jax.Array, mask: np.ndarray,
              drop: Drop) -> jax.Array:
  """MultiHead(Q, K, V) with every head's softmax(q kᵀ / √d_k) v.

  `mask` [B, Q, K] (True = may attend); a query row with no key gets zeros.
  Kernels [d_model, h, d_k], out_kernel [h, d_v, d_model].
  """
  bias = lambda name: (jnp.asarray(p[name])[None, :, None, :] if name in p
                       else 0.0)  # [h, d] -> [1, h, 1, d]
  q = jnp.einsum("bqm,mhd->bhqd", x_q, p["query_kernel"]) + bias("query_bias")
  k = jnp.einsum("bkm,mhd->bhkd", x_kv, p["key_kernel"]) + bias("key_bias")
  v = jnp.einsum("bkm,mhd->bhkd", x_kv, p["value_kernel"]) + bias(
      "value_bias")
  d_k = q.shape[-1]
  logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(d_k)
  mask = jnp.asarray(mask)[:, None]  # [B, 1, Q, K]
  logits = jnp.where(mask, logits, -jnp.inf)
  any_key = mask.any(-1, keepdims=True)
  logits = jnp.where(any_key, logits, 0.0)
  weights = jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0)
  weights = drop(weights, "attention")
  heads = jnp.einsum("bhqk,bhkv->bqhv", weights, v)
  return (jnp.einsum("bqhv,hvm->bqm", heads, p["out_kernel"])
          + p.get("out_bias", 0.0))


def feed_forward(p, x: jax.Array, activation: str = "relu") -> jax.Array:
  h = ACTIVATIONS[activation](x @ p["w1"]["kernel"] + p["w1"]["bias"])
  return h @ p["w2"]["kernel"] + p["w2"]["bias"]


def residual(p_norm, x: jax.Array, sublayer: Callable, drop: Drop,
             layer_norm_kind: str, eps: float = 1e-6) -> jax.Array:
  if layer_norm_kind == "pre":  # x + Dropout(Sublayer(LayerNorm(x)))
    return x + drop(sublayer(layer_norm(p_norm, x, eps)), "residual")
  # The paper: LayerNorm(x + Dropout(Sublayer(x))).
  return layer_norm(p_norm, x + drop(sublayer(x), "residual"), eps)


def logits(params, inputs: np.ndarray, targets: np.ndarray, *,
           num_layers: int, drop: Drop = no_dropout,
           layer_norm_kind: str = "post", activation: str = "relu",
           eps: float = 1e-6) -> jax.Array:
  """Teacher-forced logits [B, T, V] for source and target ids (0 = pad);
  `activation` (a name of `ACTIVATIONS`) and `eps` (every layer norm's)
  beyond the paper."""
  inputs, targets = jnp.asarray(inputs), jnp.asarray(targets)
  table = params["source_embed"]["embedding"]  # [V, d_model]
  d_model = table.shape[1]
  pe = sinusoids(max(inputs.shape[1], targets.shape[1]), d_model)
  src_real, tgt_real = inputs > 0, targets > 0
  s, t = inputs.shape[1], targets.shape[1]

  x = table[inputs] * np.sqrt(d_model) + pe[:s]
  x = drop(x, "embedding")
  enc_mask = jnp.broadcast_to(src_real[:, None, :], (len(inputs), s, s))
  for i in range(num_layers):
    p = params[f"encoder_layers_{i}"]
    x = residual(p["attention_block"]["layer_norm"], x,
                 lambda y, p=p: attention(p["self_attention"], y, y,
                                          enc_mask, drop),
                 drop, layer_norm_kind, eps)
    x = residual(p["ffn_block"]["layer_norm"], x,
                 lambda y, p=p: feed_forward(p["ffn"], y, activation), drop,
                 layer_norm_kind, eps)
  if layer_norm_kind == "pre":
    x = layer_norm(params["encoder_norm"], x, eps)

  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]  # start symbol 0
  y = table[shifted] * np.sqrt(d_model) + pe[:t]
  y = drop(y, "embedding")
  causal = np.tril(np.ones((t, t), bool))
  self_mask = causal[None] & tgt_real[:, None, :]
  cross_mask = jnp.broadcast_to(src_real[:, None, :], (len(targets), t, s))
  for i in range(num_layers):
    p = params[f"decoder_layers_{i}"]
    y = residual(p["self_attention_block"]["layer_norm"], y,
                 lambda z, p=p: attention(p["self_attention"], z, z,
                                          self_mask, drop),
                 drop, layer_norm_kind, eps)
    y = residual(p["cross_attention_block"]["layer_norm"], y,
                 lambda z, p=p: attention(p["cross_attention"], z, x,
                                          cross_mask, drop),
                 drop, layer_norm_kind, eps)
    y = residual(p["ffn_block"]["layer_norm"], y,
                 lambda z, p=p: feed_forward(p["ffn"], z, activation), drop,
                 layer_norm_kind, eps)
  if layer_norm_kind == "pre":
    y = layer_norm(params["decoder_norm"], y, eps)
  # The pre-softmax projection shares the embeddings (§3.4); Marian's
  # final_logits_bias where the model has one.
  return y @ table.T + params.get("output_bias", 0.0)


def smoothed_loss(logits_: jax.Array, targets: jax.Array,
                  epsilon: float) -> tuple[jax.Array, jax.Array]:
  """Σ over non-pad tokens of KL(q || p), q = 1 - ε on the gold token and
  ε / (V - 1) on every other; returns (sum, token count)."""
  vocab = logits_.shape[-1]
  gold = jnp.arange(vocab) == jnp.asarray(targets)[..., None]  # [B, T, V]
  q = jnp.where(gold, 1.0 - epsilon, epsilon / (vocab - 1))
  log_q = jnp.log(jnp.where(q > 0, q, 1.0))
  log_p = jax.nn.log_softmax(logits_, axis=-1)
  per_token = jnp.sum(q * (log_q - log_p), axis=-1)
  weights = jnp.asarray(targets) > 0
  return (jnp.sum(jnp.where(weights, per_token, 0.0)),
          jnp.sum(weights).astype(jnp.float32))


def random_params(shapes, seed: int):
  """Random values for a parameter tree of `shapes` (ShapeDtypeStructs),
  from NumPy (no initialiser to compile): LayerNorm scales and biases away
  from 1 and 0, so that each of them matters; other weights of unit-variance
  outputs."""
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    name = jax.tree_util.keystr(path)
    x = rng.normal(size=shape.shape)
    if "scale" in name:
      x = 1.0 + 0.2 * x
    elif "bias" in name:
      x = 0.2 * x
    elif "embedding" in name:
      x = x / np.sqrt(shape.shape[1])
    else:
      x = x / np.sqrt(shape.shape[0])
    return np.asarray(x, np.float32)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


def param_count(num_layers: int, d_model: int, d_ff: int, num_heads: int,
                d_k: int, d_v: int, vocab: int, *, learned_positions: int = 0,
                attention_type: str = "scaled_dot",
                location_filter_sizes: Sequence[int] = (),
                location_num_filters: int = 0) -> int:
  """Parameters of the model with shared embeddings, counted by hand.

  Attention: W^Q, W^K (d_model × h·d_k), W^V (d_model × h·d_v) and W^O
  (h·d_v × d_model), no biases; FFN: W₁, b₁, W₂, b₂; a LayerNorm has a
  scale and a bias of d_model; 2 sublayers per encoder layer and 3 per
  decoder layer, each with its LayerNorm; one embedding matrix (source,
  target and pre-softmax); learned positions: a table of
  `learned_positions` rows per side. Beyond the paper: additive attention
  adds a vector v of d_k per head to every attention; location-aware
  encoder-decoder attention adds `location_num_filters` filters of each
  head's width (one width for all heads, or one per head) and a projection
  of the filters to one score per head.
  """
  h = num_heads
  attention = 2 * d_model * h * d_k + d_model * h * d_v + h * d_v * d_model
  ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
  norm = 2 * d_model
  encoder_layer = attention + ffn + 2 * norm
  decoder_layer = 2 * attention + ffn + 3 * norm
  total = (vocab * d_model + num_layers * (encoder_layer + decoder_layer)
           + 2 * learned_positions * d_model)
  if attention_type == "additive":  # 3 attentions per encoder-decoder pair
    total += 3 * num_layers * h * d_k
  if attention_type == "location":  # encoder-decoder attention only
    widths = list(location_filter_sizes)
    widths = widths * h if len(widths) == 1 else widths
    total += num_layers * (location_num_filters * sum(widths)
                           + h * location_num_filters)
  return total
