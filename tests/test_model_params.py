"""mha/model/params.py: a stored parameter is read without tracing its
initializer, and its shape is still checked, as flax checks it."""
import contextlib

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from mha.model import params as params_lib
from mha.model import transformer


class Counting:
  """An initializer (flax's `normal`) that counts its calls, traced or
  run."""

  def __init__(self):
    self.calls = 0

  def __call__(self, rng, shape, dtype=jnp.float32):
    self.calls += 1
    return nn.initializers.normal(1.0)(rng, shape, dtype)


class Layers(nn.Module):
  """A `Dense`, a `LayerNorm` and a parameter of a `StoredParams` module,
  each made by a counting initializer."""
  kernel_init: Counting
  width: int = 3

  @nn.compact
  def __call__(self, x):
    x = params_lib.Dense(self.width, kernel_init=self.kernel_init)(x)
    x = params_lib.LayerNorm(scale_init=self.kernel_init)(x)
    return Own(self.kernel_init, self.width)(x)


class Own(params_lib.StoredParams, nn.Module):
  kernel_init: Counting
  width: int

  @nn.compact
  def __call__(self, x):
    return x @ self.param("w", self.kernel_init, (x.shape[-1], self.width))


def test_an_apply_traces_no_initializer_and_computes_flaxs_layers():
  init = Counting()
  x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
  variables = Layers(init).init(jax.random.key(0), x)
  assert init.calls == 3  # made once each
  jax.jit(Layers(init).apply)(variables, x)
  out = Layers(init).apply(variables, x)
  assert init.calls == 3  # flax's own `param` would trace each again
  # The same arithmetic as flax's layers on the same parameters (both run
  # op by op: no fusion to round apart).
  p = variables["params"]
  h = nn.Dense(3).apply({"params": p["Dense_0"]}, x)
  h = nn.LayerNorm().apply({"params": p["LayerNorm_0"]}, h)
  np.testing.assert_array_equal(out, h @ p["Own_0"]["w"])


@pytest.mark.parametrize("module, name", [
    ("Dense_0", "kernel"), ("LayerNorm_0", "scale"), ("Own_0", "w")])
def test_a_stored_parameter_of_another_shape_is_flaxs_error(module, name):
  x = np.ones((2, 4), np.float32)
  variables = Layers(Counting()).init(jax.random.key(0), x)
  wrong = jax.tree.map(lambda v: v, variables)
  stored = wrong["params"][module][name]
  wrong["params"][module][name] = np.zeros(stored.shape + (1,), stored.dtype)
  with pytest.raises(flax.errors.ScopeParamShapeError, match=name):
    Layers(Counting()).apply(wrong, x)


def test_an_initializer_that_makes_another_shape_is_refused_at_init():
  def init(rng, shape):
    return jax.random.normal(rng, shape[:1])

  class Bad(params_lib.StoredParams, nn.Module):
    @nn.compact
    def __call__(self, x):
      return x * self.param("w", init, (4, 4))

  with pytest.raises(ValueError, match=r"'w' .* made shape \(4,\), not "
                     r"its shape argument \(4, 4\)"):
    Bad().init(jax.random.key(0), np.ones((4,), np.float32))


def test_the_transformers_apply_traces_no_initializer():
  # Every parameter of the model is made by an initializer counted here:
  # applying it (with the parameters) traces none of them.
  init = Counting()
  config = transformer.TransformerConfig.from_config(
      base.get_config("tiny"), deterministic=True, vocab_size=32, max_len=16,
      share_embeddings=False, attention_bias=True)
  model = transformer.Transformer(config)
  ids = np.ones((1, 4), np.int32)
  with _counting_initializers(init):
    variables = model.init(jax.random.key(0), ids, ids)
    made = init.calls
    model.apply(variables, ids, ids)
  assert made == len(jax.tree.leaves(variables["params"]))
  assert init.calls == made


@contextlib.contextmanager
def _counting_initializers(counter: Counting):
  """Within: every initializer given to flax's `Module.param` (that of
  `StoredParams.param` too) counts its calls, traced or run, in
  `counter.calls`."""
  real = nn.Module.param

  def param(module, name, init_fn, *args, **kwargs):
    def counted(*a, **k):
      counter.calls += 1
      return init_fn(*a, **k)
    return real(module, name, counted, *args, **kwargs)

  nn.Module.param = param
  try:
    yield
  finally:
    nn.Module.param = real


def test_a_parameter_without_a_shape_argument_is_flaxs_both_ways():
  # An initializer taking a size, not a shape: made and checked by flax's
  # `param` (its trace at each apply), as without the mixin.
  def square(rng, size):
    return jax.random.normal(rng, (size, size))

  class Square(params_lib.StoredParams, nn.Module):
    size: int

    @nn.compact
    def __call__(self, x):
      return x @ self.param("w", square, self.size)

  x = np.ones((2, 3), np.float32)
  variables = Square(3).init(jax.random.key(0), x)
  assert variables["params"]["w"].shape == (3, 3)
  np.testing.assert_array_equal(Square(3).apply(variables, x),
                                x @ variables["params"]["w"])
  with pytest.raises(flax.errors.ScopeParamShapeError, match="w"):
    Square(4).apply(variables, np.ones((2, 4), np.float32))
