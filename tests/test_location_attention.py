"""Location-aware and multi-resolution attention (issue 8)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha
from configs import base
from mha.errors import ConfigError
from mha.model import location
from mha.search import decoding
from mha.search import batches as batch_search


def tiny(**changes):
  config = base.get_config("tiny,location")
  config.update(changes)
  return config


SRC = jnp.array([[5, 6, 7, 8, 1, 0], [9, 10, 1, 0, 0, 0]], jnp.int32)
TGT = jnp.array([[11, 12, 13, 1, 0], [14, 15, 16, 17, 1]], jnp.int32)


def _inputs(seed, b=2, q=5, k=7, d_model=16):
  rng = np.random.default_rng(seed)
  x_q = jnp.asarray(rng.normal(size=(b, q, d_model)), jnp.float32)
  x_kv = jnp.asarray(rng.normal(size=(b, k, d_model)), jnp.float32)
  lengths = np.array([k, k - 3])
  mask = (np.arange(k)[None, :] < lengths[:, None])[:, None, None, :]
  return x_q, x_kv, jnp.asarray(mask)


def test_zero_filters_reduce_exactly_to_content_only_attention():
  x_q, x_kv, mask = _inputs(0)
  aware = mha.MultiHeadAttention(num_heads=4, attention_type="location",
                                 location_filter_sizes=(1, 3, 5, 7))
  params = aware.init(jax.random.key(0), x_q, x_kv, mask)["params"]
  zeroed = {k: (jnp.zeros_like(v) if k.startswith("location_filter_") else v)
            for k, v in params.items()}
  content = {k: v for k, v in params.items() if not k.startswith("location")}
  scaled = mha.MultiHeadAttention(num_heads=4)
  expected = scaled.apply({"params": content}, x_q, x_kv, mask)
  np.testing.assert_array_equal(
      aware.apply({"params": zeroed}, x_q, x_kv, mask), expected)
  # With the learned (random) filters the location term changes the output.
  assert not np.allclose(aware.apply({"params": params}, x_q, x_kv, mask),
                         expected, atol=1e-3)


def test_location_scores_of_a_hand_computed_case():
  # One head, one filter of width 3 [a, b, c] = [1, 2, -1], u = 0.5, previous
  # weights [0, 1, 0.5, 0]: score_j = u·tanh(a·α[j-1] + b·α[j] + c·α[j+1]).
  previous = jnp.array([0.0, 1.0, 0.5, 0.0]).reshape(1, 1, 1, 4)
  filters = jnp.array([1.0, 2.0, -1.0]).reshape(1, 3, 1)
  projection = jnp.array([[0.5]])
  expected = [0.5 * math.tanh(0 + 0 - 1.0),      # j=0: c·1
              0.5 * math.tanh(0 + 2.0 - 0.5),    # j=1: b·1 + c·0.5
              0.5 * math.tanh(1.0 + 1.0 + 0),    # j=2: a·1 + b·0.5
              0.5 * math.tanh(0.5 + 0 + 0)]      # j=3: a·0.5 (then padding)
  got = location.location_scores(previous, filters, projection)
  np.testing.assert_allclose(np.asarray(got).ravel(), expected, rtol=1e-6)


def test_each_head_has_the_receptive_field_of_its_filter_width():
  widths = (1, 3, 5, 7)
  x_q, x_kv, _ = _inputs(1, b=1, q=2, k=21)
  module = mha.MultiHeadAttention(num_heads=4, attention_type="location",
                                  location_filter_sizes=widths)
  params = module.init(jax.random.key(3), x_q, x_kv)["params"]
  filters = location.stack_filters(
      [params[f"location_filter_{h}"] for h in range(4)])
  assert filters.shape == (4, 7, 8)
  impulse_at = 10
  previous = jnp.zeros((1, 4, 1, 21)).at[..., impulse_at].set(1.0)
  term = location.location_scores(previous, filters,
                                  params["location_projection"])
  for h, width in enumerate(widths):
    support = np.flatnonzero(np.abs(np.asarray(term[0, h, 0])) > 1e-7)
    radius = width // 2
    np.testing.assert_array_equal(
        support, np.arange(impulse_at - radius, impulse_at + radius + 1))


def test_previous_weights_are_shifted_and_reset_at_sentence_starts():
  w = jnp.arange(1, 2 * 1 * 4 * 3 + 1, dtype=jnp.float32).reshape(2, 1, 4, 3)
  starts = jnp.array([[True, False, True, False], [True, False, False, False]])
  got = np.asarray(location.previous_position_weights(w, starts))
  np.testing.assert_array_equal(got[:, :, 0], 0.0)
  np.testing.assert_array_equal(got[0, 0, 1], w[0, 0, 0])
  np.testing.assert_array_equal(got[0, 0, 2], 0.0)  # a new sentence
  np.testing.assert_array_equal(got[0, 0, 3], w[0, 0, 2])
  np.testing.assert_array_equal(got[1, 0, 1:], w[1, 0, :3])


def test_only_encoder_decoder_attention_is_location_aware():
  model = mha.create_model(tiny(location_filter_sizes=(1, 3, 5, 7)))
  shapes = jax.eval_shape(model.init, jax.random.key(0), SRC, TGT)["params"]
  for layer in ("decoder_layers_0", "decoder_layers_1"):
    cross = shapes[layer]["cross_attention"]
    assert [cross[f"location_filter_{h}"].shape for h in range(4)] == [
        (1, 8), (3, 8), (5, 8), (7, 8)]
    assert cross["location_projection"].shape == (4, 8)
    assert not any(k.startswith("location")
                   for k in shapes[layer]["self_attention"])
  assert not any(k.startswith("location")
                 for k in shapes["encoder_layers_0"]["self_attention"])
  # Its self-attention is the paper's, eq. 1: the encoder (which has no
  # encoder-decoder attention) computes what the base model's does.
  params = model.init(jax.random.key(0), SRC, TGT)["params"]

  def encode(config):
    return mha.create_model(config, deterministic=True).apply(
        {"params": params}, SRC, method="encode")

  np.testing.assert_array_equal(encode(tiny()),
                                encode(base.get_config("tiny")))
  # In a search, the cache carries the previous step's weights there only.
  decoder = mha.create_model(tiny(location_filter_sizes=(1, 3, 5, 7)),
                             deterministic=True, decode=True)
  cache = jax.eval_shape(decoder.init, jax.random.key(0), SRC, TGT)["cache"]
  assert "previous_weights" in cache["decoder_layers_0"]["cross_attention"]
  assert "previous_weights" not in cache["decoder_layers_0"]["self_attention"]


def test_bad_filter_sizes_name_the_field():
  """Refused when the model is built (the variant's check in the table),
  and by the attention module itself, in the same words."""
  x_q, x_kv, _ = _inputs(2)
  for sizes in [(4,), (1, 3), (3.0,)]:  # even; not 1 or 4 widths; no int
    module = mha.MultiHeadAttention(num_heads=4, attention_type="location",
                                    location_filter_sizes=sizes)
    for build in (lambda: mha.create_model(tiny(location_filter_sizes=sizes)),
                  lambda: module.init(jax.random.key(0), x_q, x_kv)):
      with pytest.raises(ConfigError) as refused:
        build()
      assert str(refused.value) == (
          "config.location_filter_sizes must be one odd width or one odd "
          f"width per head (num_heads=4), got {sizes!r}.")


def test_beam_search_scores_equal_full_pass_log_probabilities():
  # The cache rows (previous weights included) follow their hypotheses
  # through every beam reorder: each finished hypothesis's score is the
  # log-probability the full, uncached model gives its tokens.
  eos, max_len, beam = 1, 6, 3
  config = tiny(location_filter_sizes=(1, 3, 5, 7), vocab_size=16)
  model_config = mha.TransformerConfig.from_config(config, deterministic=True)
  model = mha.Transformer(model_config)
  params = model.init(jax.random.key(1), SRC, TGT)["params"]
  # Sharper random output distributions than the initialiser's.
  params["source_embed"]["embedding"] *= 8.0
  decoder = mha.Transformer(model_config.replace(decode=True))

  @jax.jit
  def search(params):
    step, cache, _ = batch_search._model_fns(decoder, params, SRC, beam,
                                             max_len)
    return decoding.beam_search(step, cache, 2, beam, 0.0, max_len, eos,
                                cache_rows=batch_search.cache_rows(cache))

  tokens, scores = (np.asarray(x) for x in search(params))
  checked = 0
  for b in range(2):
    for k in range(beam):
      if not np.isfinite(scores[b, k]):
        continue
      seq = list(tokens[b, k])
      if eos in seq:
        seq = seq[:seq.index(eos) + 1]
      target = jnp.asarray([seq], jnp.int32)
      # Segment ids: a generated 0 is a token here, as in the cached decoder.
      logits = model.apply({"params": params}, SRC[b:b + 1], target,
                           inputs_segmentation=(SRC[b:b + 1] > 0).astype(
                               jnp.int32),
                           targets_segmentation=jnp.ones_like(target))
      log_probs = jax.nn.log_softmax(logits[0], axis=-1)
      expected = sum(float(log_probs[t, tok]) for t, tok in enumerate(seq))
      np.testing.assert_allclose(scores[b, k], expected, rtol=1e-4, atol=1e-4)
      checked += 1
  assert checked >= 4
