"""fast_top_k._best_extensions: the first round of the beam's candidates from
the raw logits, against the computation it replaces (top_k of the live
log-probability + log_softmax over the whole vocabulary), bit for bit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha.search import fast_top_k


def reference(logits, live, k):
  values, tokens = jax.lax.top_k(
      live[:, :, None] + jax.nn.log_softmax(logits, axis=-1), k)
  return np.asarray(values), np.asarray(tokens)


def check(logits, live, k):
  logits = jnp.asarray(logits, jnp.float32)
  live = jnp.asarray(live, jnp.float32)
  got = jax.jit(fast_top_k._best_extensions, static_argnums=2)(logits, live, k)
  want = reference(logits, live, k)
  np.testing.assert_array_equal(np.asarray(got[0]), want[0])
  np.testing.assert_array_equal(np.asarray(got[1]), want[1])


@pytest.mark.parametrize('seed', range(3))
def test_random_logits(seed):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(3, 4, 300)) * rng.uniform(0.1, 10.0)
  live = -rng.uniform(0.0, 40.0, size=(3, 4))
  live[1, 2:] = -np.inf  # empty beam slots
  check(logits, live, 8)


def test_ties_and_logits_that_round_together():
  # Logits 1e-7 apart: after adding a live log-probability of -30 (one ulp
  # ~2e-6) the candidates round to equal values, and top_k orders them by
  # token, not by logit; exact ties between tokens too.
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 50))
  logits[0, 0, 10:30] = 5.0 + 1e-7 * np.arange(20)[::-1]  # ascending tokens
  logits[0, 1, [3, 40, 7, 22]] = 6.0  # ties
  logits[1, 2, 11:31] = 4.0 + 1e-7 * np.arange(20)  # the last token highest
  live = np.array([[-30.0, -0.5, -2.0], [-1.0, -3.0, -31.0]])
  check(logits, live, 6)


def test_minus_infinity_logits_and_small_vocabulary():
  logits = np.random.default_rng(1).normal(size=(2, 2, 5))
  logits[..., 0] = -np.inf  # a masked token (pad)
  logits[1, 1, 1:3] = -np.inf  # fewer than k finite ones
  check(logits, np.array([[0.0, -np.inf], [-1.0, -2.0]]), 4)
  check(logits[..., :4], np.array([[0.0, -1.0], [-1.0, -2.0]]), 2)


def test_a_tie_that_reaches_past_the_raw_candidates():
  # 40 distinct logits 1e-5 apart, the highest at the last token. With a live
  # log-probability of -1e4 (one ulp ~1e-3) their scores round together, so
  # top_k takes the lowest tokens, none of them among the 2k best raw logits:
  # only the full computation (the fall-back) finds them.
  logits = np.tile(1.0 + 1e-5 * np.arange(40), (1, 2, 1))
  live = np.array([[-1e4, -1.0]])
  want = reference(jnp.asarray(logits, jnp.float32),
                   jnp.asarray(live, jnp.float32), 2)
  assert want[1][0, 0].max() < 40 - 4  # the tie reaches past the raw best 4
  check(logits, live, 2)


def check_greedy(logits):
  """fast_top_k._greedy_choice against argmax(log_softmax) and its value."""
  logits = jnp.asarray(logits, jnp.float32)
  token, logprob = jax.jit(fast_top_k._greedy_choice)(logits)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  want = np.asarray(jnp.argmax(log_probs, axis=-1))
  np.testing.assert_array_equal(np.asarray(token), want)
  np.testing.assert_array_equal(
      np.asarray(logprob), np.asarray(log_probs)[np.arange(len(want)), want])


def test_greedy_choice_random_and_tied_logits():
  rng = np.random.default_rng(2)
  check_greedy(rng.normal(size=(6, 300)) * 5.0)
  logits = rng.normal(size=(3, 50))
  logits[0, [7, 3, 40]] = 9.0  # an exact tie: the lowest token wins
  logits[1, 0] = -np.inf
  check_greedy(logits)
  check_greedy(logits[:, :1])  # one token


def test_greedy_choice_a_tie_in_log_probability_past_the_best_two():
  # Distinct logits 1e-8 apart near 0: minus lse = log(40) (one ulp ~2e-7)
  # their log-probabilities round together, so argmax takes the lowest
  # token of the tie, neither of the two best raw logits (the fall-back).
  logits = np.tile(1e-8 * np.arange(40), (2, 1))
  logits[1] = np.random.default_rng(3).normal(size=40)
  log_probs = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))
  assert len(np.unique(logits[0].astype(np.float32))) == 40
  assert np.argmax(log_probs[0]) < 38  # not among the raw best two
  check_greedy(logits)
