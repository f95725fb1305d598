"""Parameters read without tracing their initializers at every `apply`.

flax's `Module.param` checks an existing parameter's shape against its
initializer's by tracing the initializer (`jax.eval_shape`) at every
`apply`: one trace per parameter per traced call of the model (the train
step, each search, every cache made; what it costs: bench/README.md).
`StoredParams.param` compares the stored shape with the shape argument
itself (every initializer here and in flax takes the shape after the key)
and traces nothing; a new parameter is made by flax's `param`, and its
initializer's output is checked to have that shape. A parameter whose
first argument is not a shape (a tuple of ints) is left to flax's `param`
both ways. `Dense` and `LayerNorm` are flax's layers with this `param`
(their parameters, names and arithmetic unchanged).
"""
from flax.core import meta
import flax.errors
import flax.linen as nn
import numpy as np


class StoredParams:
  """Mixin for a `flax.linen.Module` (before it in the bases): `param`
  returns a stored parameter after comparing its shape with the shape
  argument, without flax's per-`apply` trace of the initializer."""

  def param(self, name, init_fn, *init_args, unbox=True, **init_kwargs):
    shape = _shape(init_args[0]) if init_args else None
    if shape is not None and self.has_variable("params", name):
      value = self.get_variable("params", name)
      if np.shape(value) != shape:
        raise flax.errors.ScopeParamShapeError(
            name, self.scope.path_text, np.shape(value), shape)
      return meta.unbox(value) if unbox else value
    value = super().param(name, init_fn, *init_args, unbox=unbox,
                          **init_kwargs)
    if shape is not None and np.shape(value) != shape:
      raise ValueError(f"The initializer of parameter {name!r} of "
                       f"{self.scope.path_text} made shape "
                       f"{np.shape(value)}, not its shape argument {shape}.")
    return value


def _shape(arg) -> tuple[int, ...] | None:
  """`arg` as a shape, if it is one (a tuple or list of ints)."""
  if isinstance(arg, (tuple, list)) and all(
      isinstance(n, (int, np.integer)) for n in arg):
    return tuple(int(n) for n in arg)
  return None


class Dense(StoredParams, nn.Dense):
  """`flax.linen.Dense` with `StoredParams.param`."""


class LayerNorm(StoredParams, nn.LayerNorm):
  """`flax.linen.LayerNorm` with `StoredParams.param`."""
