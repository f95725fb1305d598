"""The whole train step against a slow re-implementation (issue 16).

Two updates of `train_step.make_train_step`, `pmap`ped over 2 devices whose
halves of the batch hold different numbers of target tokens, are compared
with the same two updates computed without any of the library: the
hand-written Transformer and label-smoothed loss of `paper_reference.py`,
the token-weighted mean over the whole batch, `jax.grad` of that, the noam
rate and Adam in NumPy with the paper's β1, β2, ε. The reported loss, the
gradient norm and the parameters after each update must agree.

One-line changes caught (tests/README.md): gradients not divided by the
token count, or averaged over devices instead of summed, the config's ε_ls
ignored, the schedule's k off by one, and every model change the forward
pass sees.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

import mha
from configs import base
from mha.train import step as train_step
from mha.train.devices import AXIS
from mha.train.devices import pmap_replicate
from mha.train.devices import pmap_unreplicate
from mha.train.devices import shard
import paper_reference as ref

NUM_DEVICES = 2
LABEL_SMOOTHING = 0.2  # not the default 0.1: the config's value must be used


def _config():
  config = base.get_config("tiny")
  config.update(vocab_size=24, num_layers=1, d_model=16, d_ff=32,
                num_heads=2, d_k=4, d_v=6, dropout_rate=0.0,
                attention_dropout_rate=0.0, label_smoothing=LABEL_SMOOTHING,
                warmup_steps=10, learning_rate_scale=1.0)
  return config


def _batch(rng, long_rows: int):
  """4 rows; the first `long_rows` long, the others short (device 0 holds
  rows 0-1, device 1 rows 2-3)."""
  src = rng.integers(2, 24, size=(4, 7)).astype(np.int32)
  tgt = rng.integers(2, 24, size=(4, 6)).astype(np.int32)
  for row in range(4):
    n_src, n_tgt = (7, 6) if row < long_rows else (3, 2)
    src[row, n_src:] = 0
    tgt[row, n_tgt:] = 0
  return {"inputs": src, "targets": tgt}


def _random_params(config, seed: int):
  shapes = jax.eval_shape(mha.create_model(config).init, jax.random.key(0),
                          jnp.ones((1, 7), jnp.int32),
                          jnp.ones((1, 6), jnp.int32))["params"]
  return ref.random_params(shapes, seed)


def _reference_updates(params, batches):
  """(loss, grad norm, params) after each update, from the paper alone."""
  params = jax.tree_util.tree_map(lambda p: np.asarray(p, np.float64),
                                  params)
  m = jax.tree_util.tree_map(np.zeros_like, params)
  v = jax.tree_util.tree_map(np.zeros_like, params)
  b1, b2, eps = 0.9, 0.98, 1e-9
  d_model, warmup = 16, 10
  results = []

  @jax.jit
  def loss_and_grad(params, inputs, targets):
    def mean_loss(params):
      logits = ref.logits(params, inputs, targets, num_layers=1)
      total, tokens = ref.smoothed_loss(logits, targets, LABEL_SMOOTHING)
      return total / tokens  # mean over every target token of the batch
    return jax.value_and_grad(mean_loss)(params)

  for k, batch in enumerate(batches, start=1):
    f32 = jax.tree_util.tree_map(lambda p: jnp.asarray(p, jnp.float32),
                                 params)
    loss, grads = loss_and_grad(f32, batch["inputs"], batch["targets"])
    grads = jax.tree_util.tree_map(lambda g: np.asarray(g, np.float64), grads)
    lr = d_model ** -0.5 * min(k ** -0.5, k * warmup ** -1.5)
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v,
                               grads)
    params = jax.tree_util.tree_map(
        lambda p, m, v: p - lr * (m / (1 - b1 ** k)) / (
            np.sqrt(v / (1 - b2 ** k)) + eps), params, m, v)
    norm = np.sqrt(sum(np.sum(g ** 2)
                       for g in jax.tree_util.tree_leaves(grads)))
    results.append((float(loss), norm, params))
  return results


def test_two_updates_equal_the_slow_reference():
  config = _config()
  model = mha.create_model(config)
  tx = mha.create_optimizer(config)
  params = _random_params(config, seed=0)
  rng = np.random.default_rng(1)
  # Device 0 holds more target tokens than device 1, in different
  # proportions in the two batches.
  batches = [_batch(rng, long_rows=2), _batch(rng, long_rows=1)]

  devices = jax.local_devices()[:NUM_DEVICES]
  state = {"step": jnp.array(0, jnp.int32), "params": params,
           "opt_state": tx.init(params),
           "rng": jax.random.key_data(jax.random.key(0))}
  state = pmap_replicate(state, devices)
  step = jax.pmap(train_step.make_train_step(model, tx, config),
                  axis_name=AXIS, devices=devices)
  expected = _reference_updates(params, batches)
  for batch, (loss, grad_norm, want) in zip(batches, expected):
    state, metrics = step(state, shard(batch, NUM_DEVICES),
                          np.zeros((NUM_DEVICES,), np.int32))
    np.testing.assert_allclose(float(metrics["loss"][0]), loss, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["grad_norm"][0]), grad_norm,
                               rtol=1e-4)
    got = pmap_unreplicate(state)["params"]
    jax.tree_util.tree_map(
        functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=2e-6),
        got, want)
