"""The pmapped update: device-count invariance and token weighting."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mha
from configs import base
from mha.model import dropout
from mha.model import losses as losses_lib
from mha.train import step as train_step
from mha.train.devices import AXIS
from mha.train.devices import pmap_replicate
from mha.train.devices import pmap_unreplicate
from mha.train.devices import shard


def _config(**changes):
  """The tiny model with one layer a side: these tests compare updates
  computed two ways (devices, micro-batches, autodiff), which the depth
  does not change; each compiles its pmapped steps, most of its time."""
  config = base.get_config("tiny")
  config.num_layers = 1
  config.update(changes)
  config.dropout_rate = 0.0  # dropout masks depend on the device split
  return config


def _batch(rng, rows=8, src_len=9, tgt_len=7, vocab=64):
  """Random ids with random lengths (padding at the end of each row)."""
  def ids(length):
    x = rng.integers(3, vocab, size=(rows, length))
    lengths = rng.integers(2, length + 1, size=rows)
    x[np.arange(length)[None, :] >= lengths[:, None]] = 0
    return x.astype(np.int32)
  return {"inputs": ids(src_len), "targets": ids(tgt_len)}


def _run(config, num_devices, batches):
  devices = jax.local_devices()[:num_devices]
  model = mha.create_model(config)
  # Plain SGD: its update is proportional to the gradient, so the comparison
  # below sees the psum'd gradients' rounding as it is. Adam divides each
  # entry by its own running scale, and at an entry whose gradient is
  # rounding noise that turns a 1e-9 difference into an lr-sized one.
  tx = optax.sgd(1.0)
  state = pmap_replicate(train_step.init_state(config, model, tx), devices)
  step = jax.pmap(train_step.make_train_step(model, tx, config),
                  axis_name=AXIS, devices=devices)
  losses = []
  for batch in batches:
    stop = np.zeros((num_devices,), np.int32)
    state, metrics = step(state, shard(batch, num_devices), stop)
    losses.append(float(metrics["loss"][0]))
  return losses, pmap_unreplicate(state)


@pytest.mark.parametrize("changes", [
    {}, {"attention_type": "location", "location_filter_sizes": (1, 3, 5, 7)}])
def test_one_and_four_devices_give_the_same_updates(changes):
  assert jax.local_device_count() >= 4, "conftest sets 4 CPU devices"
  config = _config(**changes)
  rng = np.random.default_rng(0)
  batches = [_batch(rng) for _ in range(4)]
  losses_1, state_1 = _run(config, 1, batches)
  losses_4, state_4 = _run(config, 4, batches)
  np.testing.assert_allclose(losses_1, losses_4, rtol=1e-5)
  assert losses_1[-1] < losses_1[0]
  jax.tree_util.tree_map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
      state_1["params"], state_4["params"])
  assert int(state_1["step"]) == int(state_4["step"]) == 4


def test_loss_is_token_weighted_mean_over_devices():
  # One device holds a long row, the others short ones: the reported loss is
  # the mean over all target tokens, as computed without pmap.
  config = _config()
  rng = np.random.default_rng(1)
  batch = _batch(rng)
  batch["targets"][:4, 2:] = 0
  model = mha.create_model(config)
  tx = mha.create_optimizer(config)
  state = train_step.init_state(config, model, tx)
  logits = model.apply({"params": state["params"]}, batch["inputs"],
                       batch["targets"], rngs={"dropout": jax.random.key(0)})
  loss, tokens = mha.cross_entropy_with_label_smoothing(
      logits, jnp.asarray(batch["targets"]), config.label_smoothing)
  losses, _ = _run(config, 4, [batch])
  assert losses[0] == pytest.approx(float(loss / tokens), rel=1e-5)


def test_gradient_accumulation_equals_one_big_batch():
  # Two micro-batches of 8 rows accumulated = one update on the 16 rows.
  rng = np.random.default_rng(2)
  batches = [_batch(rng) for _ in range(4)]
  config = _config()
  model = mha.create_model(config)
  tx = mha.create_optimizer(config)
  devices = jax.local_devices()[:2]

  def run(accum, groups):
    config.grad_accum_steps = accum
    update = train_step.CompiledUpdate(model, tx, config, devices)
    state = pmap_replicate(train_step.init_state(config, model, tx), devices)
    losses = []
    for group in groups:
      state, metrics = update(state, [shard(b, 2) for b in group],
                              np.zeros((2,), np.int32))
      losses.append(float(metrics["loss"][0]))
    return losses, pmap_unreplicate(state)

  big = [[{k: np.concatenate([a[k], b[k]]) for k in a}]
         for a, b in (batches[:2], batches[2:])]
  losses_1, state_1 = run(1, big)
  losses_2, state_2 = run(2, [batches[:2], batches[2:]])
  np.testing.assert_allclose(losses_1, losses_2, rtol=1e-5)
  jax.tree_util.tree_map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
      state_1["params"], state_2["params"])
  assert int(state_2["step"]) == 2


def test_dropout_masks_differ_per_step_micro_batch_and_device():
  """`_dropout_rng`: a different key for each step, micro-batch and device,
  the same for the same triple; its masks keep the fraction asked (0.9 of
  2^20 draws per device, within 6 sigma)."""
  def draw(step, micro_step):
    state = {"rng": jax.random.key_data(jax.random.key(7)),
             "step": jnp.int32(step)}
    def per_device(_):
      key = train_step._dropout_rng(state, micro_step)  # pylint: disable=protected-access
      return dropout.keep_mask(key, 0.9, (1 << 20,))
    return np.asarray(jax.pmap(per_device, axis_name=AXIS)(
        jnp.zeros(2)))

  masks = {"a": draw(3, 0), "again": draw(3, 0), "step": draw(4, 0),
           "micro": draw(3, 1)}
  np.testing.assert_array_equal(masks["a"], masks["again"])
  assert not np.array_equal(masks["a"][0], masks["a"][1])  # devices
  for other in ("step", "micro"):
    assert not np.array_equal(masks["a"], masks[other])
  sigma = np.sqrt(0.9 * 0.1 / (1 << 20))
  for mask in masks.values():
    assert np.all(np.abs(mask.mean(axis=1) - 0.9) < 6 * sigma)


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_grad_step_equals_autodiff_through_the_whole_logits(share_embeddings):
  # The train step's loss, metrics and gradient (the pre-softmax projection
  # and the loss one chunk at a time, with a hand-written gradient) against
  # jax.grad of the same loss from the model's whole [B, T, V] logits, with
  # and without a shared embedding (the separate projection has a bias).
  config = _config(share_embeddings=share_embeddings, label_smoothing=0.1)
  model = mha.create_model(config)
  params = train_step.init_state(config, model, optax.sgd(1.0))["params"]
  if not share_embeddings:  # a bias of zeros would hide a missing gradient
    params["output_projection"]["bias"] = jnp.linspace(
        -1.0, 1.0, config.vocab_size)
  batch = _batch(np.random.default_rng(3))
  grad_step = jax.pmap(train_step.make_grad_step(model, config),
                       axis_name=AXIS, devices=jax.local_devices()[:1])
  state = pmap_replicate({"params": params, "step": jnp.array(0),
                             "rng": jax.random.key_data(jax.random.key(0))},
                            jax.local_devices()[:1])
  grads, sums = pmap_unreplicate(grad_step(
      state, shard(batch, 1), np.zeros((1,), np.int32)))

  def whole(p):
    logits = model.apply({"params": p}, batch["inputs"], batch["targets"])
    return losses_lib.token_sums(logits, batch["targets"], 0.1)

  # Jitted: op by op, the reference's backward pass dispatches thousands of
  # small ops (most of this test's time).
  want_grads = jax.jit(jax.grad(lambda p: whole(p)["loss"]))(params)
  want = jax.jit(whole)(params)
  for name in ("loss", "nll", "correct", "tokens"):
    assert float(sums[name]) == pytest.approx(float(want[name]), rel=1e-5)
  flat_got = jax.tree_util.tree_leaves_with_path(grads)
  flat_want = dict(jax.tree_util.tree_leaves_with_path(want_grads))
  assert len(flat_got) == len(flat_want)
  for path, got in flat_got:
    np.testing.assert_allclose(got, flat_want[path], rtol=1e-4, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
