"""The encoder-decoder model: masks, sharing, caching, sizes, packing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha
from configs import base
from mha.errors import ConfigError
from mha.model import attention
from mha.model.transformer import Dropout
from mha.model.transformer import EncoderLayer
from mha.search import batches as batch_search


def tiny(**changes):
  config = base.get_config("tiny")
  config.update(changes)
  return config


def init(model, inputs, targets):
  return model.init(jax.random.key(0), inputs, targets)["params"]


SRC = jnp.array([[5, 6, 7, 8, 1, 0], [9, 10, 1, 0, 0, 0]], jnp.int32)
TGT = jnp.array([[11, 12, 13, 1, 0], [14, 15, 16, 17, 1]], jnp.int32)


@pytest.mark.parametrize("layer_norm", ["post", "pre"])
def test_padding_does_not_change_encoder_output_or_loss(layer_norm):
  model = mha.create_model(tiny(layer_norm=layer_norm), deterministic=True)
  params = init(model, SRC, TGT)
  more_pad_src = jnp.pad(SRC, ((0, 0), (0, 3)))
  more_pad_tgt = jnp.pad(TGT, ((0, 0), (0, 4)))
  enc = model.apply({"params": params}, SRC, method="encode")
  enc_padded = model.apply({"params": params}, more_pad_src, method="encode")
  real = np.asarray(SRC > 0)
  np.testing.assert_allclose(np.asarray(enc)[real],
                             np.asarray(enc_padded)[:, :6][real], atol=1e-5)

  def loss(src, tgt):
    logits = model.apply({"params": params}, src, tgt)
    return mha.cross_entropy_with_label_smoothing(logits, tgt, 0.1)

  (a, n_a), (b, n_b) = loss(SRC, TGT), loss(more_pad_src, more_pad_tgt)
  assert float(n_a) == float(n_b) == 9.0
  np.testing.assert_allclose(a, b, rtol=1e-5)


def test_future_targets_do_not_change_earlier_logits():
  model = mha.create_model(tiny(), deterministic=True)
  params = init(model, SRC, TGT)
  logits = model.apply({"params": params}, SRC, TGT)
  changed = TGT.at[:, 3:].set(jnp.array([20, 21], jnp.int32))
  logits_changed = model.apply({"params": params}, SRC, changed)
  # Logits at position t predict token t from tokens < t: positions 0..3 read
  # targets 0..2 only, which are unchanged.
  np.testing.assert_allclose(logits[:, :4], logits_changed[:, :4], atol=1e-5)
  assert not np.allclose(logits[:, 4], logits_changed[:, 4])


@pytest.mark.parametrize("changes", [
    {"layer_norm": "pre"}, {"position_encoding": "learned"},
    {"share_embeddings": False}, {"d_k": 4, "d_v": 12},
    {"matmul_dtype": "bfloat16"},
    # Every attention variant of the table (scaled_dot: the base model);
    # location-aware attention, which carries the previous step's weights
    # in the cache, also with one width per head (multires).
    *({"attention_type": name} for name in attention.ATTENTION_VARIANTS),
    {"attention_type": "location", "location_filter_sizes": (1, 3, 5, 7)},
], ids=lambda changes: ",".join(f"{k}={v}" for k, v in changes.items()))
def test_incremental_decoding_equals_full_pass(changes):
  # matmul_dtype is the searches' setting, not a config field of the model.
  search = {k: v for k, v in changes.items() if k == "matmul_dtype"}
  config = tiny(**{k: v for k, v in changes.items() if k not in search})
  model = mha.create_model(config, deterministic=True, **search)
  params = init(model, SRC, TGT)
  full = model.apply({"params": params}, SRC, TGT)  # [B, T, V]

  decoder = mha.create_model(config, deterministic=True, decode=True,
                             **search)
  length = TGT.shape[1]
  cache = decoder.init(jax.random.key(0), SRC, jnp.ones((2, length),
                                                        jnp.int32))["cache"]
  encoded = decoder.apply({"params": params}, SRC, method="encode")
  previous = jnp.zeros((2, 1), jnp.int32)  # start symbol
  step = jax.jit(lambda cache, token: decoder.apply(
      {"params": params, "cache": cache}, encoded, SRC, token,
      mutable=["cache"], method="decode"))
  for t in range(length):
    logits, mutated = step(cache, previous)
    cache = mutated["cache"]
    real = np.asarray(TGT[:, t] > 0) | (t == 0)
    np.testing.assert_allclose(np.asarray(logits[:, 0])[real],
                               np.asarray(full[:, t])[real], atol=1e-4)
    previous = TGT[:, t:t + 1]


@pytest.mark.parametrize("changes", [
    *({"attention_type": name} for name in attention.ATTENTION_VARIANTS),
    {"attention_bias": True, "num_decoder_layers": 3},
], ids=lambda changes: ",".join(f"{k}={v}" for k, v in changes.items()))
def test_source_kv_makes_the_decoders_source_keys_and_values(changes):
  # `Transformer.source_kv` (the refilled searches' queue) makes, bit for
  # bit, the encoder-decoder keys and values that a whole decoder pass
  # with the parameters puts in the cache, and nothing else of the cache.
  model = mha.create_model(tiny(**changes), deterministic=True, decode=True)
  params = init(mha.create_model(tiny(**changes), deterministic=True), SRC,
                TGT)
  encoded = model.apply({"params": params}, SRC, method="encode")
  _, whole = model.apply({"params": params}, encoded, SRC, TGT,
                         mutable=["cache"], method="decode")
  _, alone = jax.jit(lambda e: model.apply(
      {"params": params}, e, SRC, mutable=["cache"], method="source_kv"))(
          encoded)

  def sources(cache):
    return {jax.tree_util.keystr(path): np.asarray(x) for path, x in
            jax.tree_util.tree_flatten_with_path(cache)[0]
            if path[-1].key in ("source_key", "source_value")}

  made, expected = sources(alone["cache"]), sources(whole["cache"])
  assert len(expected) == 2 * model.config.num_decoder_layers
  assert list(made) == list(expected)
  for name, x in expected.items():
    np.testing.assert_array_equal(made[name], x, err_msg=name)
  assert {path[-1].key for path, _ in jax.tree_util.tree_flatten_with_path(
      alone["cache"])[0]} <= {"source_key", "source_value",
                              "previous_weights"}


@pytest.mark.parametrize("changes", [
    # Every attention variant of the table (location's previous weights
    # restart at each sentence), and multires.
    *({"attention_type": name} for name in attention.ATTENTION_VARIANTS),
    {"attention_type": "location", "location_filter_sizes": (1, 3, 5, 7)},
], ids=lambda changes: ",".join(f"{k}={v}" for k, v in changes.items()))
def test_packed_rows_equal_separate_rows(changes):
  model = mha.create_model(tiny(**changes), deterministic=True)
  params = init(model, SRC, TGT)
  separate = model.apply({"params": params}, SRC, TGT)
  # Sentence 0 then sentence 1 in one row of length 11 / 10.
  src = jnp.array([[5, 6, 7, 8, 1, 9, 10, 1, 0, 0, 0]], jnp.int32)
  src_seg = jnp.array([[1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0]], jnp.int32)
  src_pos = jnp.array([[0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 0]], jnp.int32)
  tgt = jnp.array([[11, 12, 13, 1, 14, 15, 16, 17, 1, 0]], jnp.int32)
  tgt_seg = jnp.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]], jnp.int32)
  tgt_pos = jnp.array([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0]], jnp.int32)
  packed = model.apply({"params": params}, src, tgt, src_pos, tgt_pos,
                       src_seg, tgt_seg)
  np.testing.assert_allclose(packed[0, :4], separate[0, :4], atol=1e-5)
  np.testing.assert_allclose(packed[0, 4:9], separate[1, :5], atol=1e-5)


def _layer_names(tree, layer: str) -> dict[str, set[str]]:
  """{attention layer: its variable names} of a params or cache tree, for
  the attention layers of the encoder or decoder layer `layer`."""
  return {name: set(tree[layer][name])
          for name in ("self_attention", "cross_attention")
          if name in tree[layer]}


@pytest.mark.parametrize("name", list(attention.ATTENTION_VARIANTS))
def test_each_variant_builds_what_its_table_entry_says(name):
  """Where the variant applies (both attentions, or encoder-decoder
  attention only: self-attention then has the parameters of
  `SELF_ATTENTION_TYPE`), and what it adds to the decode cache: its
  `cache` variables, each with its rows known to the search."""
  variant = attention.ATTENTION_VARIANTS[name]

  def variables(attention_type, collection, **changes):
    model = mha.create_model(tiny(attention_type=attention_type),
                             deterministic=True, **changes)
    return jax.eval_shape(model.init, jax.random.key(0), SRC, TGT)[collection]

  def standalone(attention_type):
    module = mha.MultiHeadAttention(num_heads=4, attention_type=attention_type)
    x = jax.ShapeDtypeStruct((2, 5, 32), jnp.float32)
    return set(jax.eval_shape(module.init, jax.random.key(0), x, x)["params"])

  self_type = (attention.SELF_ATTENTION_TYPE if variant.cross_attention_only
               else name)
  params = variables(name, "params")
  for layer in ("encoder_layers_0", "decoder_layers_1"):
    names = _layer_names(params, layer)
    assert names["self_attention"] == standalone(self_type), layer
    if "cross_attention" in names:
      assert names["cross_attention"] == standalone(name)
  cache = _layer_names(variables(name, "cache", decode=True),
                       "decoder_layers_0")
  paper = _layer_names(variables("scaled_dot", "cache", decode=True),
                       "decoder_layers_0")
  added = {layer: names - paper[layer] for layer, names in cache.items()}
  assert added == {
      "self_attention": set() if variant.cross_attention_only
                        else set(variant.cache),
      "cross_attention": set(variant.cache)}
  assert set(variant.cache) <= set(batch_search.CACHE_ROWS)


def _layer_norm(x, eps=1e-6):
  return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                   + eps)


def test_encoder_layer_is_post_layer_norm_of_residuals():
  # LayerNorm(x + Sublayer(x)) twice, composed by hand from the sublayers.
  cfg = mha.TransformerConfig.from_config(tiny(), deterministic=True)
  layer = EncoderLayer(cfg)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 32)),
                  jnp.float32)
  params = layer.init(jax.random.key(1), x, None)["params"]
  attention = mha.MultiHeadAttention(num_heads=cfg.num_heads)
  a = attention.apply({"params": params["self_attention"]}, x, x)
  h = _layer_norm(np.asarray(x + a))
  w1, w2 = params["ffn"]["w1"], params["ffn"]["w2"]
  f = np.maximum(h @ w1["kernel"] + w1["bias"], 0) @ w2["kernel"] + w2["bias"]
  expected = _layer_norm(h + f)
  np.testing.assert_allclose(layer.apply({"params": params}, x, None),
                             expected, atol=1e-4)


def test_embeddings_shared_and_scaled_by_sqrt_d_model():
  config = tiny()
  model = mha.create_model(config, deterministic=True)
  params = init(model, SRC, TGT)
  embedding_tables = [k for k in jax.tree_util.tree_leaves_with_path(params)
                      if "embedding" in jax.tree_util.keystr(k[0])]
  assert len(embedding_tables) == 1  # source, target and pre-softmax
  table = np.asarray(params["source_embed"]["embedding"])
  embedded = model.apply({"params": params}, SRC,
                         method=lambda m, ids: m.source_embed(ids))
  np.testing.assert_allclose(embedded, table[np.asarray(SRC)] *
                             np.sqrt(config.d_model), rtol=1e-6)
  # The pre-softmax map is the same table, unscaled: logits = y · Eᵀ.
  kernel, bias = model.apply({"params": params},
                             method=lambda m: m.output_weights())
  assert bias is None
  np.testing.assert_array_equal(kernel, table)
  hidden = model.apply(
      {"params": params}, SRC, TGT,
      method=lambda m, s, t: m.decode_hidden(m.encode(s), s, t))
  np.testing.assert_allclose(model.apply({"params": params}, SRC, TGT),
                             np.asarray(hidden) @ table.T, rtol=1e-5,
                             atol=1e-5)


def test_dropout_only_in_training():
  model = mha.create_model(tiny())
  params = init(model, SRC, TGT)

  def run(seed):
    return model.apply({"params": params}, SRC, TGT,
                       rngs={"dropout": jax.random.key(seed)})

  np.testing.assert_array_equal(run(0), run(0))
  assert not np.allclose(run(0), run(1))
  # Evaluation drops nothing: it equals the training-mode model with every
  # dropout rate 0, whatever the key.
  evaluation = mha.create_model(tiny(), deterministic=True)
  out = evaluation.apply({"params": params}, SRC, TGT)
  no_dropout = mha.create_model(tiny(dropout_rate=0.0,
                                     attention_dropout_rate=0.0))
  np.testing.assert_allclose(
      out, no_dropout.apply({"params": params}, SRC, TGT,
                            rngs={"dropout": jax.random.key(3)}), atol=1e-6)


def test_dropout_inverted_scaling():
  # The mask's rate and randomness: tests/test_dropout.py.
  x = jnp.arange(1.0, 1.0 + 4096).reshape(64, 64)
  out = np.asarray(Dropout(0.25, deterministic=False).apply(
      {}, x, rngs={"dropout": jax.random.key(1)}))
  kept = out != 0
  np.testing.assert_allclose(out[kept], np.asarray(x)[kept] / 0.75, rtol=1e-6)
  assert 0.2 < 1 - kept.mean() < 0.3
  assert Dropout(0.25, deterministic=True).apply({}, x) is x


def test_bfloat16_compute_keeps_float32_params():
  model = mha.create_model(tiny(dtype="bfloat16"), deterministic=True)
  params = init(model, SRC, TGT)
  assert all(p.dtype == jnp.float32 for p in jax.tree_util.tree_leaves(params))
  logits = model.apply({"params": params}, SRC, TGT)
  assert logits.dtype == jnp.float32 and np.all(np.isfinite(logits))
  # The same parameters in float32: close, but rounded as bfloat16 computes
  # (8 bits of mantissa), so not equal.
  full = mha.create_model(tiny(), deterministic=True).apply(
      {"params": params}, SRC, TGT)
  scale = np.abs(np.asarray(full)).max()
  error = np.abs(np.asarray(logits) - np.asarray(full)).max() / scale
  assert 1e-4 < error < 5e-2
  hlo = jax.jit(lambda p: model.apply({"params": p}, SRC, TGT)).lower(
      params).as_text()
  assert "bf16" in hlo


def count_params(config) -> int:
  config.vocab_size = 37000
  model = mha.create_model(config)
  ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), ids, ids)
  return sum(int(np.prod(p.shape))
             for p in jax.tree_util.tree_leaves(shapes["params"]))


def test_table3_rows_as_config_arguments():
  # Row A keeps the computation constant (d_k = d_v = d_model / h, left to
  # follow d_model): the same parameter count as the base model.
  assert base.get_config("A1").num_heads == 1
  base_count = count_params(base.get_config())
  for row in ("A1", "A2", "A3", "A4"):
    assert count_params(base.get_config(row)) == base_count, row
  assert base.get_config("B1").d_k == 16
  assert base.get_config("E").position_encoding == "learned"
  assert base.get_config("D3").label_smoothing == 0.0
  # A row changes the parameter count the way the paper's table does.
  assert count_params(base.get_config("C6")) < base_count
  with pytest.raises(ValueError, match="Unknown config argument 'Z9'"):
    base.get_config("Z9")


def test_config_errors_name_the_field():
  """A model built from a config without the training's checks (mha.load,
  a user's script) refuses a bad field as a ConfigError naming it."""
  with pytest.raises(ConfigError, match="config.layer_norm must be one of"):
    mha.create_model(tiny(layer_norm="middle"))
  with pytest.raises(ConfigError, match="num_heads"):
    mha.create_model(tiny(d_model=30, num_heads=4))
  with pytest.raises(ConfigError, match="config.dtype must be one of float32, "
                     "bfloat16, float16, got 'int8'"):
    mha.create_model(tiny(dtype="int8"))
  # A TransformerConfig built by hand goes through the same rules.
  model_config = mha.TransformerConfig.from_config(tiny())
  for changes, message in [
      (dict(dropout_rate=1.5), r"config.dropout_rate must be in \[0, 1\), "
       r"got 1.5"),
      (dict(vocab_size=0), "config.vocab_size must be >= 4, got 0"),
      (dict(d_model=30, num_heads=4), "not divisible by config.num_heads=4"),
      (dict(layer_norm="middle"), "config.layer_norm must be one of")]:
    with pytest.raises(ConfigError, match=message):
      mha.create_model(model_config, **changes)
    with pytest.raises(ConfigError, match=message):
      mha.create_model(model_config.replace(**changes))


def test_bfloat16_weight_products_reach_the_pre_softmax_projection():
  """A model config with `matmul_dtype='bfloat16'` (the searches' setting):
  the logits are the product of the bfloat16-rounded final hidden states
  and shared embedding matrix, in float32."""
  model_config = mha.TransformerConfig.from_config(
      tiny(), deterministic=True).replace(matmul_dtype="bfloat16")
  model = mha.create_model(model_config)
  params = init(model, SRC, TGT)
  hidden, (kernel, bias) = model.apply({"params": params}, SRC, TGT,
                                       method="hidden_and_output_weights")
  assert bias is None  # shared embeddings (§3.4)
  rounded = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
             for x in (hidden, kernel)]
  logits = model.apply({"params": params}, SRC, TGT)
  np.testing.assert_allclose(logits, rounded[0] @ rounded[1].T, atol=1e-4)
  assert np.max(np.abs(np.asarray(logits)
                       - np.asarray(hidden) @ np.asarray(kernel).T)) > 1e-4
