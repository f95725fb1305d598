"""The noam schedule (§5.3), the table of schedules, Adam's settings and
the smoothed loss (§5.4)."""
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import mha
from configs import base
from mha import validation
from mha.errors import ConfigError
from mha.model import losses
from mha.model import optim
from mha.train import step as train_step
from mha.train.devices import AXIS
from mha.train.devices import pmap_replicate


def formula(k, d_model=512, warmup=4000, scale=1.0):
  return scale * d_model ** -0.5 * min(k ** -0.5, k * warmup ** -1.5)


@pytest.mark.parametrize("k", [1, 2, 4000, 16000, 100000])
def test_schedule_values_against_formula(k):
  schedule = mha.noam_schedule(512, 4000)
  # optax passes the count of updates already done: k-1 for the k-th update.
  assert float(schedule(k - 1)) == pytest.approx(formula(k), rel=1e-6)


def test_schedule_golden_numbers():
  schedule = mha.noam_schedule(512, 4000, scale=2.0)
  assert float(schedule(0)) == pytest.approx(2 * 512 ** -0.5 * 4000 ** -1.5)
  # The peak at k = warmup is d_model^-0.5 · warmup^-0.5 ≈ 7.0e-4.
  assert float(mha.noam_schedule(512, 4000)(3999)) == pytest.approx(
      6.98771e-4, rel=1e-5)
  assert float(schedule(4 * 4000 - 1)) == pytest.approx(
      2 * 512 ** -0.5 * (16000) ** -0.5)


def test_first_updates_use_k_1_2_3():
  # SGD on a constant gradient of 1: the k-th update is -lrate(k).
  opt = optax.sgd(mha.noam_schedule(64, 10))
  params = jnp.zeros(())
  state = opt.init(params)
  for k in (1, 2, 3):
    updates, state = opt.update(jnp.ones(()), state, params)
    assert float(updates) == pytest.approx(-formula(k, 64, 10), rel=1e-6)


def test_optimizer_is_adam_with_the_papers_betas():
  config = base.get_config("tiny")
  opt = mha.create_optimizer(config)
  params = {"w": jnp.array([1.0, -2.0])}
  grads = [{"w": jnp.array([0.5, -1.0])}, {"w": jnp.array([-0.3, 0.2])}]
  state = opt.init(params)
  m = v = np.zeros(2)
  for k, g in enumerate(grads, start=1):
    updates, state = opt.update(g, state, params)
    g = np.asarray(g["w"], np.float64)
    m = 0.9 * m + 0.1 * g
    v = 0.98 * v + 0.02 * g * g
    m_hat, v_hat = m / (1 - 0.9 ** k), v / (1 - 0.98 ** k)
    lr = formula(k, config.d_model, config.warmup_steps)
    np.testing.assert_allclose(updates["w"], -lr * m_hat / (np.sqrt(v_hat) +
                                                             1e-9), rtol=1e-5)


def constant_warmup_formula(k, d_model=512, warmup=4000, scale=1.0):
  """The noam warmup, then constant at its peak d_model^-0.5 · warmup^-0.5."""
  return scale * d_model ** -0.5 * min(k * warmup ** -1.5, warmup ** -0.5)


# Every schedule of the table by its formula of k = 1, 2, ..., written here.
SCHEDULE_FORMULAS = {"noam": formula,
                     "constant_warmup": constant_warmup_formula}


def test_the_schedules_table_and_the_rule_name_the_same_schedules():
  """`mha.validation` sits below the model and keeps the names the config
  check accepts: the table's, in its order. The paper's is the default."""
  assert tuple(optim.SCHEDULES) == validation.LEARNING_RATE_SCHEDULES
  assert set(SCHEDULE_FORMULAS) == set(optim.SCHEDULES)
  assert base.get_config().learning_rate_schedule == "noam"


@pytest.mark.parametrize("k", [1, 2, 3999, 4000, 4001, 16000, 100000])
def test_constant_warmup_against_formula(k):
  schedule = optim.constant_warmup_schedule(512, 4000, scale=2.0)
  assert float(schedule(k - 1)) == pytest.approx(
      constant_warmup_formula(k, scale=2.0), rel=1e-6)
  # The noam rates while warming up, then noam's peak (≈ 7.0e-4) for good.
  if k <= 4000:
    assert float(schedule(k - 1)) == float(
        mha.noam_schedule(512, 4000, scale=2.0)(k - 1))
  else:
    assert float(schedule(k - 1)) == pytest.approx(2 * 6.98771e-4, rel=1e-5)


def test_the_default_schedule_is_noam_bit_for_bit_also_for_older_configs():
  """configs/base.py's schedule, and a config.json written before the field
  existed (an older workdir's): noam_schedule's rates, bit for bit."""
  counts = jnp.arange(0, 20000, 7)
  noam = jax.vmap(mha.noam_schedule(512, 4000, 1.0))(counts)
  config = base.get_config()
  older = json.loads(config.to_json())
  del older["learning_rate_schedule"]
  for given in (config, ml_collections.ConfigDict(older)):
    np.testing.assert_array_equal(
        jax.vmap(optim.config_schedule(given))(counts), noam)


def test_an_unknown_schedule_is_refused_naming_the_field():
  config = base.get_config("tiny")
  config.learning_rate_schedule = "cosine"
  with pytest.raises(ConfigError, match=(
      "config.learning_rate_schedule must be one of "
      f"{', '.join(optim.SCHEDULES)}, got 'cosine'")):
    mha.create_optimizer(config)


@pytest.mark.parametrize("name", list(optim.SCHEDULES))
def test_every_schedule_drives_adam_and_the_logged_rate(name):
  """The trainer's update (`make_apply_step`) with `create_optimizer` of
  each schedule, on a constant gradient of 1: Adam's m̂ = v̂ = 1, so update
  k moves the parameter by -lrate(k) / (1 + ε), and the rate logged with
  it is lrate(k), both by the formula, through and after the warmup."""
  config = base.get_config("tiny")
  config.update(learning_rate_schedule=name, warmup_steps=3,
                learning_rate_scale=2.0)
  tx = mha.create_optimizer(config)
  devices = jax.local_devices()[:1]
  apply_step = jax.pmap(train_step.make_apply_step(tx, config),
                        axis_name=AXIS, devices=devices)
  params = {"w": jnp.zeros(2)}
  state = pmap_replicate({"step": jnp.array(0, jnp.int32), "params": params,
                          "opt_state": tx.init(params)}, devices)
  grads = pmap_replicate({"w": jnp.ones(2)}, devices)
  sums = pmap_replicate({k: jnp.float32(1.0) for k in (
      "loss", "nll", "correct", "tokens", "source_tokens")}, devices)
  stop = np.zeros((1,), np.int32)
  w = 0.0
  for k in range(1, 8):
    state, metrics = apply_step(state, grads, sums, stop)
    lrate = SCHEDULE_FORMULAS[name](k, config.d_model, 3, 2.0)
    assert float(metrics["learning_rate"][0]) == pytest.approx(lrate,
                                                               rel=1e-6)
    w -= lrate / (1 + config.adam_eps)
    np.testing.assert_allclose(state["params"]["w"][0], [w, w], rtol=1e-5)


def test_label_smoothing_against_hand_computation():
  logits = jnp.array([[[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]])
  targets = jnp.array([[2, 0]])  # second position is padding
  eps = 0.1
  loss, tokens = mha.cross_entropy_with_label_smoothing(logits, targets, eps)
  log_p = np.log(np.exp([2.0, 1, 0, -1]) / np.exp([2.0, 1, 0, -1]).sum())
  q = np.array([eps / 3, eps / 3, 1 - eps, eps / 3])
  expected = -(q * log_p).sum() + (q * np.log(q)).sum()  # KL(q || p)
  assert float(tokens) == 1.0
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  nll, _ = mha.negative_log_likelihood(logits, targets)
  assert float(nll) == pytest.approx(-log_p[2], rel=1e-6)


def test_label_smoothing_matches_float64_numpy_for_large_logits():
  # Random logits around +-60 (softmax saturates): the per-token KL(q || p)
  # in float64, and the loss is unchanged by adding a constant to a row.
  rng = np.random.default_rng(0)
  eps, vocab = 0.1, 50
  logits = rng.normal(scale=20.0, size=(3, 4, vocab)) + 40.0
  targets = rng.integers(1, vocab, size=(3, 4))
  targets[0, 2:] = 0
  z = logits - logits.max(-1, keepdims=True)
  log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
  q = np.full(logits.shape, eps / (vocab - 1))
  np.put_along_axis(q, targets[..., None], 1 - eps, axis=-1)
  kl = (q * (np.log(q) - log_p)).sum(-1)
  expected = (kl * (targets > 0)).sum()
  loss, tokens = mha.cross_entropy_with_label_smoothing(
      jnp.asarray(logits, jnp.float32), jnp.asarray(targets), eps)
  assert float(tokens) == 10.0
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  shifted, _ = mha.cross_entropy_with_label_smoothing(
      jnp.asarray(logits - 1000.0, jnp.float32), jnp.asarray(targets), eps)
  assert float(shifted) == pytest.approx(expected, rel=1e-4)


def test_smoothed_loss_is_minimal_at_the_smoothed_distribution():
  eps, vocab = 0.1, 5
  q = np.full(vocab, eps / (vocab - 1))
  q[3] = 1 - eps
  loss, _ = mha.cross_entropy_with_label_smoothing(
      jnp.log(jnp.asarray(q))[None, None], jnp.array([[3]]), eps)
  assert float(loss) == pytest.approx(0.0, abs=1e-6)
  grad = jax.grad(lambda z: mha.cross_entropy_with_label_smoothing(
      z, jnp.array([[3]]), eps)[0])(jnp.log(jnp.asarray(q))[None, None])
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)


def test_accuracy_counts_non_pad_tokens():
  logits = jnp.eye(4)[jnp.array([[1, 2, 3, 0]])] * 5
  correct, tokens = mha.accuracy(logits, jnp.array([[1, 3, 3, 0]]))
  assert (float(correct), float(tokens)) == (2.0, 3.0)


def test_loss_gradient_equals_autodiff_of_log_softmax():
  # The loss from logit_stats' four numbers per position (no log-softmax):
  # its value and gradient against autodiff of the log_softmax formula.
  rng = np.random.default_rng(1)
  eps, vocab = 0.1, 11
  logits = jnp.asarray(rng.normal(scale=3.0, size=(2, 5, vocab)), jnp.float32)
  targets = jnp.asarray(rng.integers(1, vocab, size=(2, 5)))
  targets = targets.at[1, 3:].set(0)

  def reference(z):
    q = jnp.full(z.shape, eps / (vocab - 1)).at[
        jnp.arange(2)[:, None], jnp.arange(5)[None], targets].set(1 - eps)
    kl = jnp.sum(q * (jnp.log(q) - jax.nn.log_softmax(z)), axis=-1)
    return jnp.sum(kl * (targets > 0))

  def ours(z):
    return mha.cross_entropy_with_label_smoothing(z, targets, eps)[0]

  np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-5)
  np.testing.assert_allclose(jax.grad(ours)(logits),
                             jax.grad(reference)(logits), atol=1e-6)
  sums = losses.token_sums(logits, targets, eps)
  assert float(sums["loss"]) == pytest.approx(float(ours(logits)), rel=1e-6)
  nll, tokens = mha.negative_log_likelihood(logits, targets)
  correct, _ = mha.accuracy(logits, targets)
  assert float(sums["nll"]) == pytest.approx(float(nll), rel=1e-6)
  assert (float(sums["correct"]), float(sums["tokens"])) == (
      float(correct), float(tokens))
  argmax_correct = (jnp.argmax(logits, -1) == targets) & (targets > 0)
  assert float(correct) == float(jnp.sum(argmax_correct))


@pytest.mark.parametrize("eps,with_bias", [(0.1, False), (0.0, True)])
def test_chunked_projection_loss_against_log_softmax_formula(eps, with_bias):
  # projected_token_sums computes the logits hidden·Kᵀ (+ b) four positions
  # at a time (21 positions: the last chunk padded) and the loss gradient in
  # the same pass; its sums and its gradients with respect to hidden, K and
  # b against autodiff of the KL formula on the whole logits.
  rng = np.random.default_rng(2)
  vocab, width = 13, 6
  hidden = jnp.asarray(rng.normal(size=(3, 7, width)), jnp.float32)
  kernel = jnp.asarray(rng.normal(scale=0.7, size=(vocab, width)), jnp.float32)
  bias = (jnp.asarray(rng.normal(size=(vocab,)), jnp.float32) if with_bias
          else None)
  targets = jnp.asarray(rng.integers(1, vocab, size=(3, 7)))
  targets = targets.at[2, 4:].set(0)
  weights = (targets > 0).astype(jnp.float32)
  q = jnp.where(jax.nn.one_hot(targets, vocab) > 0, 1 - eps,
                eps / (vocab - 1))

  def logits_of(h, k, b):
    z = jnp.einsum("BTM,VM->BTV", h, k)
    return z if b is None else z + b

  def reference(h, k, b):
    log_p = jax.nn.log_softmax(logits_of(h, k, b))
    kl = jnp.sum(q * (jnp.log(jnp.maximum(q, 1e-30)) - log_p), axis=-1)
    return jnp.sum(kl * weights)

  def ours(h, k, b):
    return losses.projected_token_sums(h, k, targets, eps, b,
                                       chunk_tokens=4)["loss"]

  sums = losses.projected_token_sums(hidden, kernel, targets, eps, bias,
                                     chunk_tokens=4)
  whole = losses.token_sums(logits_of(hidden, kernel, bias), targets, eps)
  assert float(sums["loss"]) == pytest.approx(
      float(reference(hidden, kernel, bias)), rel=1e-5)
  for name in ("nll", "correct", "tokens"):
    assert float(sums[name]) == pytest.approx(float(whole[name]), rel=1e-5)
  assert float(sums["tokens"]) == 18.0
  argnums = (0, 1, 2) if with_bias else (0, 1)
  for got, want in zip(
      jax.grad(ours, argnums)(hidden, kernel, bias),
      jax.grad(reference, argnums)(hidden, kernel, bias)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Only the loss carries a gradient; scaling it scales every gradient.
  twice = jax.grad(lambda h: 2.0 * ours(h, kernel, bias))(hidden)
  np.testing.assert_allclose(twice, 2.0 * jax.grad(ours)(hidden, kernel, bias),
                             rtol=1e-6)
