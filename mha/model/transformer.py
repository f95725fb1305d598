"""The encoder-decoder Transformer (§3 of Vaswani et al. 2017) in flax.linen.

Token ids are int32 `[batch, length]` with 0 = padding. The decoder's input is
the target shifted right by one with 0 as the start symbol. Packed rows (several
sentences in one row) pass `*_segmentation` (1, 2, ... per sentence, 0 = pad)
and `*_positions` (position within each sentence); the masks keep sentences
apart.
"""
import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mha.model import attention as attention_lib
from mha.model import dropout as dropout_lib
from mha import validation
from mha.model.attention import MultiHeadAttention
from mha.errors import ConfigError
from mha.model.params import Dense, LayerNorm, StoredParams
from mha.model.positional import AddPositionEncoding

_DTYPES = {name: getattr(jnp, name) for name in validation.DTYPES}

# The one table of feed-forward activations: config.ffn_activation -> the
# function FFN applies between its two linear maps. A new one is an entry
# here and its name in `mha.validation.FFN_ACTIVATIONS`, in the same order
# (a test keeps the two equal).
FFN_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu,  # eq. 2: max(0, x)
    "swish": nn.swish,  # x · sigmoid(x) (SiLU): Marian's, OPUS-MT's
    # x · Φ(x) with the exact normal CDF (erf): PyTorch's and Hugging
    # Face's "gelu"; flax's default is the tanh approximation.
    "gelu": functools.partial(nn.gelu, approximate=False),
}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyperparameters of the model, with the paper's symbols.

  Built from an ml_collections config by `TransformerConfig.from_config`;
  evaluation and decoding variants by `.replace(deterministic=True,
  decode=True)`.
  """
  vocab_size: int
  num_encoder_layers: int = 6   # N
  num_decoder_layers: int = 6   # N
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8            # h
  d_k: int | None = None        # None: d_model // h
  d_v: int | None = None        # None: d_model // h
  dropout_rate: float = 0.1     # P_drop
  attention_dropout_rate: float = 0.0
  attention_type: str = "scaled_dot"
  attention_impl: str = "einsum"
  location_filter_sizes: tuple[int, ...] = (7,)  # attention_type='location'
  location_num_filters: int = 8
  position_encoding: str = "sinusoidal"
  layer_norm: str = "post"
  layer_norm_epsilon: float = 1e-6  # flax's default
  ffn_activation: str = "relu"  # eq. 2
  attention_bias: bool = False  # §3.2.2: none
  output_bias: bool = False  # a bias on the shared pre-softmax map
  share_embeddings: bool = True
  dtype: Any = jnp.float32
  # A search setting (`mha.SearchSettings`, set by mha.search.texts): the
  # products with the weight matrices in bfloat16 (`weight_product`).
  matmul_dtype: str = "float32"
  max_len: int = 512
  deterministic: bool = False
  decode: bool = False

  def replace(self, **changes) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict,
                  **changes) -> "TransformerConfig":
    """Takes every field of this dataclass that `config` defines.

    `num_encoder_layers` / `num_decoder_layers` default to `num_layers`, and
    `dtype` is a name (`float32`, `bfloat16`).

    Raises:
      ConfigError: a model field that cannot be right, naming it.
    """
    values = {f.name: config[f.name] for f in dataclasses.fields(cls)
              if f.name in config and f.name != "matmul_dtype"}
    for side in ("num_encoder_layers", "num_decoder_layers"):
      if values.get(side) is None:
        values[side] = config.num_layers
    if "location_filter_sizes" in values:  # a list when read from config.json
      values["location_filter_sizes"] = tuple(values["location_filter_sizes"])
    if isinstance(values.get("dtype"), str):
      validation.check_field("dtype", values["dtype"])
      values["dtype"] = _DTYPES[values["dtype"]]
    values.update(changes)
    model_config = cls(**values)
    model_config.validate()
    return model_config

  def validate(self) -> None:
    """Refuses a field its rule refuses (`mha.validation.FIELDS`; `dtype`
    is a JAX dtype here, its name checked by `from_config`) and fields that
    cannot be right together, the attention variant's own by its `check`
    (ConfigError)."""
    for field in dataclasses.fields(self):
      if field.name in validation.FIELDS and field.name != "dtype":
        validation.check_field(field.name, getattr(self, field.name))
    if (self.d_k is None or self.d_v is None) and self.d_model % self.num_heads:
      raise ConfigError(f"config.d_model={self.d_model} is not divisible by "
                       f"config.num_heads={self.num_heads}; set d_k and d_v.")
    if self.output_bias and not self.share_embeddings:
      raise ConfigError(
          "config.output_bias=True is the bias of the shared embeddings' "
          "pre-softmax map; with config.share_embeddings=False the output "
          "projection has its own bias: set output_bias=False.")
    attention_lib.ATTENTION_VARIANTS[self.attention_type].check(self)


def create_model(config: "ml_collections.ConfigDict | TransformerConfig",
                 **changes) -> "Transformer":
  """The Transformer for an ml_collections config, or for a model config
  built from one already (`changes`, e.g. `deterministic=True`, applied to
  either): the one place a model is built.

  Raises:
    ConfigError: a model field that cannot be right (`validate`), naming it.
  """
  if isinstance(config, TransformerConfig):
    model_config = config.replace(**changes)
    model_config.validate()
    return Transformer(model_config)
  return Transformer(TransformerConfig.from_config(config, **changes))


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2), inner size d_ff; max(0,
  ·) is `config.ffn_activation`'s function (`FFN_ACTIVATIONS`)."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.config
    init = nn.initializers.xavier_uniform()
    product = attention_lib.dot_general_of(cfg.matmul_dtype)
    h = Dense(cfg.d_ff, dtype=cfg.dtype, kernel_init=init,
              dot_general=product, name="w1")(x)
    h = FFN_ACTIVATIONS[cfg.ffn_activation](h)  # [B, L, d_ff]
    return Dense(x.shape[-1], dtype=cfg.dtype, kernel_init=init,
                 dot_general=product, name="w2")(h)


class Dropout(nn.Module):
  """Inverted dropout (§5.4): zeros with probability `rate`, the rest scaled
  by 1 / (1 - rate); the mask is `mha.model.dropout.keep_mask`'s."""
  rate: float
  deterministic: bool

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.deterministic or self.rate == 0.0:
      return x
    keep_prob = 1.0 - self.rate
    keep = dropout_lib.keep_mask(self.make_rng("dropout"), keep_prob, x.shape)
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype),
                     jnp.zeros((), x.dtype))


class ResidualSublayer(nn.Module):
  """Post-LN: LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4); or pre-LN:
  x + Dropout(Sublayer(LayerNorm(x)))."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, sublayer, x: jax.Array, *args, **kwargs) -> jax.Array:
    cfg = self.config
    norm = LayerNorm(epsilon=cfg.layer_norm_epsilon, dtype=cfg.dtype,
                     name="layer_norm")
    dropout = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)
    if cfg.layer_norm == "pre":
      return x + dropout(sublayer(norm(x), *args, **kwargs))
    return norm(x + dropout(sublayer(x, *args, **kwargs)))


def _attention(cfg: TransformerConfig, name: str) -> MultiHeadAttention:
  """The attention layer `name` (`self_attention`, `cross_attention`) of
  `cfg`, of the variant it uses (`attention_lib.layer_attention_type`)."""
  attention_type = attention_lib.layer_attention_type(
      cfg.attention_type, cross_attention=name == "cross_attention")
  return MultiHeadAttention(
      num_heads=cfg.num_heads, d_k=cfg.d_k, d_v=cfg.d_v,
      attention_type=attention_type, attention_impl=cfg.attention_impl,
      location_filter_sizes=cfg.location_filter_sizes,
      location_num_filters=cfg.location_num_filters,
      dropout_rate=cfg.attention_dropout_rate,
      deterministic=cfg.deterministic, decode=cfg.decode, dtype=cfg.dtype,
      matmul_dtype=cfg.matmul_dtype, use_bias=cfg.attention_bias, name=name)


class EncoderLayer(nn.Module):
  """Multi-head self-attention, then the feed-forward network."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None) -> jax.Array:
    cfg = self.config
    attention = _attention(cfg.replace(decode=False), "self_attention")
    x = ResidualSublayer(cfg, name="attention_block")(
        lambda y: attention(y, y, mask), x)
    return ResidualSublayer(cfg, name="ffn_block")(
        FeedForward(cfg, name="ffn"), x)


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention, feed-forward network."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, y: jax.Array, encoded: jax.Array,
               self_mask: jax.Array | None,
               cross_mask: jax.Array | None,
               sentence_starts: jax.Array | None = None, *,
               source_kv_only: bool = False) -> jax.Array:
    """The layer's output; with `source_kv_only` (and `decode`), only its
    cross-attention's first call, which makes the decode cache's
    encoder-decoder keys and values (`y` returned as it is)."""
    cfg = self.config
    self_attention = _attention(cfg, "self_attention")
    cross_attention = _attention(cfg, "cross_attention")
    if source_kv_only:
      cross_attention(y, encoded, cross_mask, cross_attention=True)
      return y
    y = ResidualSublayer(cfg, name="self_attention_block")(
        lambda z: self_attention(z, z, self_mask), y)
    y = ResidualSublayer(cfg, name="cross_attention_block")(
        lambda z: cross_attention(z, encoded, cross_mask, cross_attention=True,
                                  sentence_starts=sentence_starts), y)
    return ResidualSublayer(cfg, name="ffn_block")(
        FeedForward(cfg, name="ffn"), y)


class Embed(StoredParams, nn.Module):
  """Token embeddings multiplied by √d_model (§3.4); with shared embeddings
  the same matrix is the pre-softmax linear map
  (`Transformer.output_weights`)."""
  vocab_size: int
  d_model: int
  dtype: Any = jnp.float32

  def setup(self):
    # stddev d_model^-0.5: the scaled embeddings start with unit variance.
    self.embedding = self.param(
        "embedding", nn.initializers.normal(stddev=self.d_model ** -0.5),
        (self.vocab_size, self.d_model))

  def __call__(self, ids: jax.Array) -> jax.Array:
    x = jnp.take(self.embedding, ids, axis=0)  # [B, L, M]
    return (x * np.sqrt(self.d_model)).astype(self.dtype)


def _padding_mask(q_ids: jax.Array, k_ids: jax.Array) -> jax.Array:
  """[B, 1, Q, K]: both positions are real tokens."""
  return ((q_ids > 0)[:, None, :, None] & (k_ids > 0)[:, None, None, :])


def _segment_mask(q_seg: jax.Array, k_seg: jax.Array) -> jax.Array:
  """[B, 1, Q, K]: both positions belong to the same packed sentence."""
  return q_seg[:, None, :, None] == k_seg[:, None, None, :]


class OutputProjection(StoredParams, nn.Module):
  """The pre-softmax linear map when embeddings are not shared: `nn.Dense`'s
  parameters ('kernel' `[M, V]`, 'bias' `[V]`) and initializers, created in
  `setup` so that `Transformer.output_weights` can read them without a call."""
  width: int
  vocab_size: int

  def setup(self):
    self.kernel = self.param("kernel", nn.initializers.lecun_normal(),
                             (self.width, self.vocab_size))
    self.bias = self.param("bias", nn.initializers.zeros_init(),
                           (self.vocab_size,))


class Transformer(StoredParams, nn.Module):
  """The encoder-decoder Transformer (Figure 1).

  Attributes:
    config: a `TransformerConfig`.
  """
  config: TransformerConfig

  def setup(self):
    cfg = self.config
    self.source_embed = Embed(cfg.vocab_size, cfg.d_model, cfg.dtype)
    if cfg.share_embeddings:
      self.target_embed = self.source_embed
    else:
      self.target_embed = Embed(cfg.vocab_size, cfg.d_model, cfg.dtype)
      self.output_projection = OutputProjection(cfg.d_model, cfg.vocab_size)
    self.source_positions = AddPositionEncoding(
        cfg.max_len, cfg.position_encoding)
    self.target_positions = AddPositionEncoding(
        cfg.max_len, cfg.position_encoding, decode=cfg.decode)
    self.dropout = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)
    self.encoder_layers = [EncoderLayer(cfg)
                           for _ in range(cfg.num_encoder_layers)]
    self.decoder_layers = [DecoderLayer(cfg)
                           for _ in range(cfg.num_decoder_layers)]
    if cfg.layer_norm == "pre":
      self.encoder_norm = LayerNorm(epsilon=cfg.layer_norm_epsilon,
                                    dtype=cfg.dtype)
      self.decoder_norm = LayerNorm(epsilon=cfg.layer_norm_epsilon,
                                    dtype=cfg.dtype)
    if cfg.output_bias:  # Marian's final_logits_bias
      self.output_bias = self.param("output_bias", nn.initializers.zeros_init(),
                                    (cfg.vocab_size,))

  def encode(self, inputs: jax.Array,
             inputs_positions: jax.Array | None = None,
             inputs_segmentation: jax.Array | None = None) -> jax.Array:
    """Encodes source ids `[B, S]` into `[B, S, d_model]`."""
    mask = _padding_mask(inputs, inputs)  # [B, 1, S, S]
    if inputs_segmentation is not None:
      mask &= _segment_mask(inputs_segmentation, inputs_segmentation)
    x = self.source_embed(inputs)
    x = self.dropout(self.source_positions(x, inputs_positions))
    for layer in self.encoder_layers:
      x = layer(x, mask)
    if self.config.layer_norm == "pre":
      x = self.encoder_norm(x)
    return x

  def decode(self, encoded: jax.Array, inputs: jax.Array, targets: jax.Array,
             targets_positions: jax.Array | None = None,
             inputs_segmentation: jax.Array | None = None,
             targets_segmentation: jax.Array | None = None) -> jax.Array:
    """Logits `[B, T, vocab]` of the next token at each target position:
    `decode_hidden`'s output through the pre-softmax projection."""
    kernel, bias = self.output_weights()
    logits = attention_lib.weight_product(
        "BLM,VM->BLV",
        self.decode_hidden(encoded, inputs, targets, targets_positions,
                           inputs_segmentation, targets_segmentation),
        kernel.astype(self.config.dtype),
        self.config.matmul_dtype).astype(jnp.float32)
    return logits if bias is None else logits + bias

  def source_kv(self, encoded: jax.Array, inputs: jax.Array) -> None:
    """With `config.decode` and `mutable=["cache"]`: only the decode
    cache's encoder-decoder keys and values (each decoder layer's
    `source_key` and `source_value`), as `decode`'s first call makes
    them, without the rest of the decoder (one zero query a sentence
    through each cross-attention, its output unused)."""
    query = jnp.zeros(encoded.shape[:1] + (1,) + encoded.shape[2:],
                      self.config.dtype)
    cross_mask = (inputs > 0)[:, None, None, :]
    for layer in self.decoder_layers:
      layer(query, encoded, None, cross_mask, source_kv_only=True)

  def output_weights(self) -> tuple[jax.Array, jax.Array | None]:
    """(kernel `[V, M]`, bias `[V]` or None) of the pre-softmax linear map:
    the shared embedding matrix (§3.4) and `output_bias` where
    `config.output_bias`, else `output_projection`'s."""
    if self.config.share_embeddings:
      return (self.target_embed.embedding,
              self.output_bias if self.config.output_bias else None)
    return self.output_projection.kernel.T, self.output_projection.bias

  def hidden_and_output_weights(
      self, inputs: jax.Array, targets: jax.Array,
      inputs_positions: jax.Array | None = None,
      targets_positions: jax.Array | None = None,
      inputs_segmentation: jax.Array | None = None,
      targets_segmentation: jax.Array | None = None
  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array | None]]:
    """(decoder output `[B, T, M]`, (kernel, bias) of the pre-softmax map),
    for the same arguments as `__call__`: the training loss projects the
    decoder output a chunk of positions at a time
    (`losses.projected_token_sums`), never holding `[B, T, vocab]` logits."""
    encoded = self.encode(inputs, inputs_positions, inputs_segmentation)
    hidden = self.decode_hidden(encoded, inputs, targets, targets_positions,
                                inputs_segmentation, targets_segmentation)
    return hidden, self.output_weights()

  def decode_hidden(self, encoded: jax.Array, inputs: jax.Array,
                    targets: jax.Array,
                    targets_positions: jax.Array | None = None,
                    inputs_segmentation: jax.Array | None = None,
                    targets_segmentation: jax.Array | None = None
                    ) -> jax.Array:
    """The decoder's output `[B, T, M]` before the pre-softmax projection.

    In training, `targets` `[B, T]` are the gold outputs; the decoder reads
    them shifted right (start symbol 0) under a causal mask. With
    `config.decode=True`, `targets` `[B, 1]` is the previous output token (0
    at the first step), one position per call, with keys and values in the
    `cache` collection.
    """
    cfg = self.config
    sentence_starts = None  # packed rows: where each target sentence begins
    if cfg.decode:
      decoder_input = targets
      self_mask = None  # causality from the cache index
      cross_mask = (inputs > 0)[:, None, None, :]  # [B, 1, 1, S]
    else:
      decoder_input = _shift_right(targets, targets_segmentation)
      length = targets.shape[1]
      causal = jnp.tril(jnp.ones((length, length), jnp.bool_))
      # A packed row's start tokens are 0 after the shift; use the segment ids
      # for its padding mask, else non-pad targets.
      target_real = (targets_segmentation if targets_segmentation is not None
                     else targets)
      self_mask = _padding_mask(target_real, target_real) & causal[None, None]
      cross_mask = _padding_mask(target_real, inputs)
      if targets_segmentation is not None:
        self_mask &= _segment_mask(targets_segmentation, targets_segmentation)
        cross_mask &= _segment_mask(targets_segmentation, inputs_segmentation)
        previous = jnp.pad(targets_segmentation, ((0, 0), (1, 0)))[:, :-1]
        sentence_starts = targets_segmentation != previous
    y = self.target_embed(decoder_input)
    y = self.dropout(self.target_positions(y, targets_positions))
    for layer in self.decoder_layers:
      y = layer(y, encoded, self_mask, cross_mask, sentence_starts)
    if cfg.layer_norm == "pre":
      y = self.decoder_norm(y)
    return y

  def __call__(self, inputs: jax.Array, targets: jax.Array,
               inputs_positions: jax.Array | None = None,
               targets_positions: jax.Array | None = None,
               inputs_segmentation: jax.Array | None = None,
               targets_segmentation: jax.Array | None = None) -> jax.Array:
    """Teacher-forced logits `[B, T, vocab]` for source and target ids."""
    encoded = self.encode(inputs, inputs_positions, inputs_segmentation)
    return self.decode(encoded, inputs, targets, targets_positions,
                       inputs_segmentation, targets_segmentation)


def _shift_right(targets: jax.Array,
                 segmentation: jax.Array | None = None) -> jax.Array:
  """[y1, y2, ...] -> [0, y1, y2, ...]; in packed rows, 0 at each start."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segmentation is not None:
    previous = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segmentation == previous, shifted, 0)
  return shifted
