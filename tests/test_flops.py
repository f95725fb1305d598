"""mha.model.flops.training_flops against the model's own parameter tree."""
import jax
import jax.numpy as jnp
import pytest

import mha
from conftest import tiny_config
from mha.model import flops
from mha.model.transformer import TransformerConfig


def _kernel_flops(params, n_source: int, n_target: int) -> int:
  """2 FLOPs per multiply-add of every kernel of the tree, each applied to
  the tokens it reads: the encoder's and the cross-attention's keys and
  values read the N_s source positions, every other decoder kernel the N_t
  target positions."""
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = [p.key for p in path]
    if names[-1].endswith("kernel") and leaf.ndim >= 2:
      source_side = names[0].startswith("encoder") or (
          "cross_attention" in names and names[-1] in ("key_kernel",
                                                       "value_kernel"))
      total += 2 * leaf.size * (n_source if source_side else n_target)
  return total


@pytest.mark.parametrize("changes", [
    dict(),
    dict(num_encoder_layers=3, num_decoder_layers=1, d_k=4, d_v=12),
])
def test_training_flops_are_three_forward_passes_of_the_trees_kernels(changes):
  config = tiny_config(**changes)
  cfg = TransformerConfig.from_config(config)
  rows, s, t = 3, 7, 5
  ids = jnp.ones((rows, s), jnp.int32)
  params = jax.eval_shape(  # shapes only: nothing to compute
      mha.create_model(config).init, jax.random.key(0), ids,
      jnp.ones((rows, t), jnp.int32))["params"]
  d_k = cfg.d_k or cfg.d_model // cfg.num_heads
  d_v = cfg.d_v or cfg.d_model // cfg.num_heads
  # QKᵀ and AV of every attention: per head q_len·k_len·(d_k + d_v) MACs.
  attention = 2 * rows * cfg.num_heads * (d_k + d_v) * (
      cfg.num_encoder_layers * s * s
      + cfg.num_decoder_layers * (t * t + t * s))
  logits = 2 * rows * t * cfg.d_model * cfg.vocab_size
  forward = _kernel_flops(params, rows * s, rows * t) + attention + logits
  assert flops.training_flops(cfg, rows, s, t) == 3 * forward
