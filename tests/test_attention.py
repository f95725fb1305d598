"""Attention against NumPy implementations of the paper's equations."""
from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
import mha
from mha import validation
from mha.model import attention


def numpy_attention(q, k, v, mask=None, scale=None):
  """Eq. 1 head by head in float64: softmax(q kᵀ · scale) v."""
  b, nq, h, d_k = q.shape
  scale = 1.0 / np.sqrt(d_k) if scale is None else scale
  out = np.zeros((b, nq, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      logits = q[bi, :, hi] @ k[bi, :, hi].T * scale  # [Q, K]
      if mask is not None:
        m = np.broadcast_to(mask, (b, h, nq, k.shape[1]))[bi, hi]
        logits = np.where(m, logits, -np.inf)
      for qi in range(nq):
        row = logits[qi]
        if np.all(np.isneginf(row)):
          continue  # fully masked: zeros
        w = np.exp(row - row.max())
        out[bi, qi, hi] = (w / w.sum()) @ v[bi, :, hi]
  return out


def _qkv(rng, b=2, nq=5, nk=7, h=3, d_k=4, d_v=6):
  return (rng.normal(size=(b, nq, h, d_k)), rng.normal(size=(b, nk, h, d_k)),
          rng.normal(size=(b, nk, h, d_v)))


def test_matches_numpy_with_padding_mask_and_dk_ne_dv():
  rng = np.random.default_rng(0)
  q, k, v = _qkv(rng)
  lengths = np.array([7, 4])
  mask = (np.arange(7)[None, :] < lengths[:, None])[:, None, None, :]
  got = mha.scaled_dot_product_attention(
      jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
      jnp.asarray(v, jnp.float32), jnp.asarray(mask))
  assert got.shape == (2, 5, 3, 6)
  np.testing.assert_allclose(got, numpy_attention(q, k, v, mask), atol=1e-5)


def test_matches_numpy_with_causal_mask_and_fully_masked_rows_are_zero():
  rng = np.random.default_rng(1)
  q, k, v = _qkv(rng, nq=6, nk=6)
  causal = np.tril(np.ones((6, 6), bool))
  # Query rows 0 and 3 of batch 1 may attend to nothing.
  mask = np.broadcast_to(causal, (2, 1, 6, 6)).copy()
  mask[1, :, [0, 3]] = False
  got = np.asarray(mha.scaled_dot_product_attention(
      jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
      jnp.asarray(v, jnp.float32), jnp.asarray(mask)))
  assert np.all(np.isfinite(got))
  np.testing.assert_array_equal(got[1, [0, 3]], 0.0)
  np.testing.assert_allclose(got, numpy_attention(q, k, v, mask), atol=1e-5)


def test_fully_masked_rows_have_finite_gradients():
  rng = np.random.default_rng(2)
  q, k, v = (jnp.asarray(a, jnp.float32) for a in _qkv(rng))
  mask = jnp.zeros((2, 1, 5, 7), bool).at[0].set(True)

  def loss(q, k, v):
    return jnp.sum(mha.scaled_dot_product_attention(q, k, v, mask) ** 2)

  grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
  np.testing.assert_array_equal(grads[0][1], 0.0)


def test_unscaled_dot_product_is_eq1_without_the_scale():
  rng = np.random.default_rng(3)
  q, k, v = _qkv(rng)
  got = mha.dot_product_attention(*(jnp.asarray(a, jnp.float32)
                                    for a in (q, k, v)))
  np.testing.assert_allclose(got, numpy_attention(q, k, v, scale=1.0),
                             atol=1e-5)


def test_additive_attention_matches_numpy():
  rng = np.random.default_rng(4)
  q, k, v = _qkv(rng, d_k=4)
  energy = rng.normal(size=(3, 4))
  mask = np.ones((2, 1, 5, 7), bool)
  mask[0, :, :, 5:] = False
  expected = np.zeros((2, 5, 3, 6))
  for b in range(2):
    for h in range(3):
      for i in range(5):
        scores = np.array([energy[h] @ np.tanh(q[b, i, h] + k[b, j, h])
                           for j in range(7)])
        scores = np.where(mask[b, 0, i], scores, -np.inf)
        w = np.exp(scores - scores.max())
        expected[b, i, h] = (w / w.sum()) @ v[b, :, h]
  got = mha.additive_attention(*(jnp.asarray(a, jnp.float32)
                                 for a in (q, k, v, energy)),
                               mask=jnp.asarray(mask))
  np.testing.assert_allclose(got, expected, atol=1e-5)


def test_attention_dropout_is_inverted_and_keyed():
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(a, jnp.float32) for a in _qkv(rng))
  kwargs = dict(dropout_rate=0.5, deterministic=False)
  a = mha.scaled_dot_product_attention(q, k, v, dropout_rng=jax.random.key(0),
                                       **kwargs)
  b = mha.scaled_dot_product_attention(q, k, v, dropout_rng=jax.random.key(0),
                                       **kwargs)
  c = mha.scaled_dot_product_attention(q, k, v, dropout_rng=jax.random.key(1),
                                       **kwargs)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  # The expectation over dropout masks is the deterministic output.
  keys = jax.random.split(jax.random.key(2), 4000)
  mean = jax.vmap(lambda r: mha.scaled_dot_product_attention(
      q, k, v, dropout_rng=r, **kwargs))(keys).mean(0)
  np.testing.assert_allclose(mean, mha.scaled_dot_product_attention(q, k, v),
                             atol=0.1)


def test_footnote4_dot_products_grow_with_dk_and_scaling_restores_unit_variance():
  # q, k with independent unit-variance components: q·k has variance d_k.
  # Read the library's logits off its weights over two keys (values = the
  # identity): log(w_1 / w_2) = (q·k_1 - q·k_2) · scale, of variance
  # 2 d_k · scale². Unscaled it grows with d_k; scaled it stays 2.
  rng = np.random.default_rng(6)
  n = 20000
  eye = jnp.broadcast_to(jnp.eye(2, dtype=jnp.float32)[None, :, None, :],
                         (n, 2, 1, 2))
  for d_k in (4, 16, 64):
    q = jnp.asarray(rng.normal(size=(n, 1, 1, d_k)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(n, 2, 1, d_k)), jnp.float32)
    for attend, variance in [(mha.dot_product_attention, 2.0 * d_k),
                             (mha.scaled_dot_product_attention, 2.0)]:
      w = np.asarray(attend(q, k, eye), np.float64)[:, 0, 0]  # [n, 2]
      assert np.log(w[:, 0] / w[:, 1]).var() == pytest.approx(variance,
                                                                 rel=0.05)
  # The module's scale is exactly 1/sqrt(d_k): logits of one key scale so.
  d_k = 64
  q = jnp.asarray(rng.normal(size=(1, 1, 1, d_k)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 2, 1, d_k)), jnp.float32)
  v = jnp.eye(2, dtype=jnp.float32)[None, :, None, :]  # weights come out as-is
  w = mha.scaled_dot_product_attention(q, k, v)[0, 0, 0]
  logits = np.asarray(k[0, :, 0] @ q[0, 0, 0]) / np.sqrt(d_k)
  np.testing.assert_allclose(w, np.exp(logits) / np.exp(logits).sum(),
                             rtol=1e-5)


@pytest.mark.parametrize("d_k,d_v", [(None, None), (4, 12)])
def test_multi_head_equals_explicit_loop_over_heads(d_k, d_v):
  d_model, h = 16, 4
  module = mha.MultiHeadAttention(num_heads=h, d_k=d_k, d_v=d_v)
  rng = np.random.default_rng(7)
  x_q = jnp.asarray(rng.normal(size=(2, 5, d_model)), jnp.float32)
  x_kv = jnp.asarray(rng.normal(size=(2, 6, d_model)), jnp.float32)
  mask = jnp.asarray(rng.random((2, 1, 5, 6)) > 0.3)
  params = module.init(jax.random.key(0), x_q, x_kv, mask)["params"]
  assert sorted(params) == ["key_kernel", "out_kernel", "query_kernel",
                            "value_kernel"]  # §3.2.2: no biases
  got = module.apply({"params": params}, x_q, x_kv, mask)

  p = jax.tree_util.tree_map(np.asarray, params)
  d_k = d_k or d_model // h
  d_v = d_v or d_model // h
  assert p["query_kernel"].shape == (d_model, h, d_k)
  assert p["value_kernel"].shape == (d_model, h, d_v)
  assert p["out_kernel"].shape == (h, d_v, d_model)
  heads = []
  for i in range(h):
    w_q, w_k, w_v = (p[f"{n}_kernel"][:, i, :] for n in ("query", "key",
                                                           "value"))
    q = np.asarray(x_q) @ w_q
    k = np.asarray(x_kv) @ w_k
    v = np.asarray(x_kv) @ w_v
    heads.append(numpy_attention(q[:, :, None], k[:, :, None], v[:, :, None],
                                 np.asarray(mask))[:, :, 0])
  w_o = p["out_kernel"].reshape(h * d_v, d_model)  # W^O ∈ R^{h·d_v × d_model}
  expected = np.concatenate(heads, axis=-1) @ w_o
  np.testing.assert_allclose(got, expected, atol=1e-4)


@pytest.mark.parametrize("attention_type", list(attention.ATTENTION_VARIANTS))
@pytest.mark.parametrize("d_k,d_v", [(None, None), (2, 8), (8, 2)])
def test_xla_impl_equals_einsum_impl(d_k, d_v, attention_type):
  # d_k != d_v (Table 3 row B): jax's kernel needs one head size, so the xla
  # path pads; the result must still be the einsum path's. Every variant:
  # the plain dot-product ones run in jax's kernel at their own scale, the
  # others stay on the einsum path.
  rng = np.random.default_rng(8)
  x = jnp.asarray(rng.normal(size=(2, 6, 16)), jnp.float32)
  mask = jnp.tril(jnp.ones((6, 6), bool))[None, None]
  mask = mask & jnp.asarray([True] * 6 + [True] * 3 + [False] * 3).reshape(
      2, 1, 1, 6)
  kwargs = dict(num_heads=4, d_k=d_k, d_v=d_v, attention_type=attention_type)
  ours = mha.MultiHeadAttention(**kwargs)
  params = ours.init(jax.random.key(0), x, x, mask)
  xla = mha.MultiHeadAttention(**kwargs, attention_impl="xla")
  np.testing.assert_allclose(ours.apply(params, x, x, mask),
                             xla.apply(params, x, x, mask), atol=1e-5)


def test_the_variants_table_and_the_rule_name_the_same_variants():
  """`mha.validation` sits below the model and keeps the names the config
  check accepts; they are the table's, in its order (the order in which a
  refusal lists them)."""
  assert tuple(attention.ATTENTION_VARIANTS) == validation.ATTENTION_TYPES
  # A variant of encoder-decoder attention only leaves self-attention to
  # one that applies to both.
  fallback = attention.ATTENTION_VARIANTS[attention.SELF_ATTENTION_TYPE]
  assert not fallback.cross_attention_only


def _softmax(logits, mask):
  logits = np.where(mask, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  return weights / weights.sum(-1, keepdims=True)


def _scaled_dot(q, k, p, mask):
  del p, mask
  return np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])


def _location(q, k, p, mask):
  """Eq. 1's logits + u_hᵀ tanh(Σ_t F_h[t] c_{i-1}[j + t - 1]) for filters
  of width 3, c_{i-1} the content weights of the previous query (zeros at
  query 0 and beyond the keys)."""
  content = _scaled_dot(q, k, p, mask)
  weights = _softmax(content, np.broadcast_to(mask, content.shape))
  _, heads, nq, nk = content.shape
  term = np.zeros_like(content)
  for h in range(heads):
    f, u = p[f"location_filter_{h}"], p["location_projection"][h]  # [3, N]
    for i in range(1, nq):
      for j in range(nk):
        conv = sum(weights[:, h, i - 1, j + t - 1, None] * f[t]  # [B, N]
                   for t in range(3) if 0 <= j + t - 1 < nk)
        term[:, h, i, j] = np.tanh(conv) @ u
  return content + term


FORMULAS = {
    "scaled_dot": _scaled_dot,
    "dot": lambda q, k, p, mask: np.einsum("bhqd,bhkd->bhqk", q, k),
    "additive": lambda q, k, p, mask: np.einsum(
        "bhqkd,hd->bhqk", np.tanh(q[:, :, :, None] + k[:, :, None]),
        p["energy"]),
    "location": _location,
}


def test_each_variants_logits_are_its_formula():
  """The attention weights each variant's module computes (sown) against
  the NumPy formula of its logits on the module's own projections and
  parameters; `FORMULAS` must name every variant of the table."""
  assert set(FORMULAS) == set(attention.ATTENTION_VARIANTS)
  rng = np.random.default_rng(9)
  x_q = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
  x_kv = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
  mask = jnp.asarray(rng.random((2, 1, 3, 5)) > 0.3).at[..., 0].set(True)
  for name, formula in FORMULAS.items():
    module = mha.MultiHeadAttention(num_heads=2, attention_type=name,
                                    location_filter_sizes=(3,))
    params = module.init(jax.random.key(1), x_q, x_kv, mask)["params"]
    _, sown = module.apply({"params": params}, x_q, x_kv, mask,
                           mutable=["intermediates"])
    weights = np.asarray(sown["intermediates"]["attention_weights"][0])
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    q = np.einsum("blm,mhd->bhld", x_q, p["query_kernel"])
    k = np.einsum("blm,mhd->bhld", x_kv, p["key_kernel"])
    expected = _softmax(formula(q, k, p, np.asarray(mask)), np.asarray(mask))
    np.testing.assert_allclose(weights, expected, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("module, message", [
    (mha.MultiHeadAttention(num_heads=2, attention_type="cosine"),
     "config.attention_type must be one of "
     f"{', '.join(attention.ATTENTION_VARIANTS)}, got 'cosine'"),
    (mha.MultiHeadAttention(num_heads=2, attention_impl="cudnn"),
     "config.attention_impl must be one of einsum, xla, got 'cudnn'"),
])
def test_bad_attention_choice_is_refused(module, message):
  """The module refuses a name the one table of rules does not offer, with
  the config's words (a ConfigError is a ValueError)."""
  x = jnp.ones((1, 2, 4))
  with pytest.raises(ValueError, match=message):
    module.init(jax.random.key(0), x, x)


def _bfloat16_rounded(x: np.ndarray) -> np.ndarray:
  """x rounded to bfloat16 (8 bits of mantissa, to nearest even), back in
  float64: the top 16 bits of each float32, computed on the bits."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
  return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def test_weight_products_in_bfloat16_round_the_inputs_only():
  """`matmul_dtype='bfloat16'` (a search setting): each product with a
  weight matrix is that of the bfloat16-rounded inputs, summed and returned
  in float32; 'float32' is the plain einsum, and so is any other
  computation dtype."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, 48)).astype(np.float32)
  w = rng.normal(size=(48, 3, 8)).astype(np.float32)
  expected = np.einsum("blm,mhd->blhd", _bfloat16_rounded(x),
                       _bfloat16_rounded(w))
  got = attention.weight_product("BLM,MHD->BLHD", jnp.asarray(x),
                                 jnp.asarray(w), "bfloat16")
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  exact = np.einsum("blm,mhd->blhd", x.astype(np.float64), w)
  assert np.max(np.abs(np.asarray(got) - exact)) > 1e-2  # inputs rounded
  plain = jnp.einsum("BLM,MHD->BLHD", x, w)
  np.testing.assert_array_equal(
      attention.weight_product("BLM,MHD->BLHD", x, w, "float32"), plain)
  half = jnp.asarray(x, jnp.bfloat16)
  np.testing.assert_array_equal(
      attention.weight_product("BLM,MHD->BLHD", half, w, "bfloat16"),
      jnp.einsum("BLM,MHD->BLHD", half, w))
  # The feed-forward network's nn.Dense, through dot_general_of.
  dense = nn.Dense(8, use_bias=False,
                   dot_general=attention.dot_general_of("bfloat16"))
  params = {"params": {"kernel": jnp.asarray(w[:, 0])}}
  np.testing.assert_allclose(
      dense.apply(params, x), np.einsum("blm,md->bld", _bfloat16_rounded(x),
                                        _bfloat16_rounded(w[:, 0])),
      rtol=1e-5, atol=1e-5)
  assert attention.dot_general_of("float32") is None


def test_bfloat16_products_are_a_search_setting_not_a_training_one():
  config = base.get_config()
  assert config.matmul_dtype == "float32"
  config.matmul_dtype = "bfloat16"  # the searches' (mha.SearchSettings)
  assert mha.TransformerConfig.from_config(config).matmul_dtype == "float32"


def test_the_layers_take_bfloat16_weight_products_where_asked():
  """MultiHeadAttention's four projections and the feed-forward network's
  two with `matmul_dtype='bfloat16'`: each product of the NumPy layer on
  bfloat16-rounded operands, the rest (attention weights, ReLU, biases)
  in float64."""
  from mha.model import transformer  # pylint: disable=import-outside-toplevel
  d_model, h = 16, 4
  rng = np.random.default_rng(3)
  x_q = jnp.asarray(rng.normal(size=(2, 5, d_model)), jnp.float32)
  x_kv = jnp.asarray(rng.normal(size=(2, 6, d_model)), jnp.float32)
  mask = jnp.asarray(rng.random((2, 1, 5, 6)) > 0.3)
  module = mha.MultiHeadAttention(num_heads=h, matmul_dtype="bfloat16")
  params = module.init(jax.random.key(0), x_q, x_kv, mask)["params"]
  got = module.apply({"params": params}, x_q, x_kv, mask)
  r = _bfloat16_rounded
  p = {name: np.asarray(w) for name, w in params.items()}
  q, k, v = (np.einsum("blm,mhd->blhd", r(x), r(p[f"{name}_kernel"]))
             for x, name in ((x_q, "query"), (x_kv, "key"), (x_kv, "value")))
  heads = numpy_attention(q, k, v, np.asarray(mask))  # [B, Q, H, d_v]
  expected = np.einsum("bqhv,hvm->bqm", r(heads), r(p["out_kernel"]))
  np.testing.assert_allclose(got, expected, atol=1e-4)
  plain = mha.MultiHeadAttention(num_heads=h).apply({"params": params}, x_q,
                                                    x_kv, mask)
  assert np.max(np.abs(np.asarray(plain) - expected)) > 1e-3

  ffn = transformer.FeedForward(transformer.TransformerConfig(
      vocab_size=8, d_ff=32, matmul_dtype="bfloat16"))
  ffn_params = ffn.init(jax.random.key(1), x_q)["params"]
  w1, w2 = (ffn_params[n] for n in ("w1", "w2"))
  hidden = np.maximum(np.einsum("blm,mf->blf", r(x_q), r(w1["kernel"]))
                      + np.asarray(w1["bias"]), 0.0)
  expected = (np.einsum("blf,fm->blm", r(hidden), r(w2["kernel"]))
              + np.asarray(w2["bias"]))
  np.testing.assert_allclose(ffn.apply({"params": ffn_params}, x_q), expected,
                             atol=1e-4)
