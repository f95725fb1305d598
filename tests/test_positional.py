"""Sinusoidal encodings (§3.5): golden values and the relative-position map."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha


def test_golden_values():
  pe = mha.sinusoidal_encoding(50, 8)
  assert pe.shape == (50, 8) and pe.dtype == np.float32
  # pos 0: sin 0 = 0 in even columns, cos 0 = 1 in odd ones.
  np.testing.assert_array_equal(pe[0], [0, 1, 0, 1, 0, 1, 0, 1])
  # pos 1, i = 0: sin(1), cos(1); i = 1: 10000^(2/8) = 10.
  np.testing.assert_allclose(pe[1, :4], [np.sin(1), np.cos(1), np.sin(0.1),
                                         np.cos(0.1)], rtol=1e-6)
  # pos 7, i = 3 (columns 6, 7): 10000^(6/8) = 1000.
  np.testing.assert_allclose(pe[7, 6:], [np.sin(0.007), np.cos(0.007)],
                             rtol=1e-5)
  # The paper's base is 10000, not 1000: column 2 at pos 30 is sin(30/10).
  np.testing.assert_allclose(pe[30, 2], np.sin(3.0), rtol=1e-5)


def test_shift_by_k_is_a_fixed_linear_map():
  # PE(pos + k) = PE(pos) M_k with M_k a block rotation independent of pos.
  d_model, k = 16, 5
  pe = mha.sinusoidal_encoding(100, d_model).astype(np.float64)
  freqs = 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)
  m = np.zeros((d_model, d_model))
  for i, w in enumerate(freqs):
    c, s = np.cos(w * k), np.sin(w * k)
    # [sin(a+b), cos(a+b)] = [sin a, cos a] @ [[c, -s], [s, c]].
    m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -s], [s, c]]
  np.testing.assert_allclose(pe[:-k] @ m, pe[k:], atol=1e-5)


def test_module_adds_encoding_and_honours_positions():
  module = mha.AddPositionEncoding(max_len=20)
  x = jnp.zeros((2, 4, 6))
  out = module.apply({}, x)
  np.testing.assert_allclose(out[0], mha.sinusoidal_encoding(20, 6)[:4])
  positions = jnp.asarray([[0, 1, 0, 1], [0, 1, 2, 3]])
  out = module.apply({}, x, positions)
  np.testing.assert_allclose(out[0, 2], mha.sinusoidal_encoding(20, 6)[0])


def test_learned_positions_are_parameters():
  module = mha.AddPositionEncoding(max_len=20, kind="learned")
  params = module.init(jax.random.key(0), jnp.zeros((1, 3, 6)))
  assert params["params"]["embedding"].shape == (20, 6)
  table = jnp.arange(120.0).reshape(20, 6)
  out = module.apply({"params": {"embedding": table}}, jnp.zeros((1, 3, 6)))
  np.testing.assert_array_equal(out[0], table[:3])


def test_bad_position_encoding_is_refused():
  module = mha.AddPositionEncoding(max_len=8, kind="rotary")
  with pytest.raises(ValueError, match="config.position_encoding must be one "
                     "of sinusoidal, learned, got 'rotary'"):
    module.init(jax.random.key(0), jnp.ones((1, 3, 4)))
