"""Label-smoothed cross entropy (§5.4) and token accuracy, as sums.

Losses are returned as sums over non-padding tokens together with the token
count, so that averages across devices and accumulation steps can be weighted
by tokens (psum the sums, then divide).

Every figure here needs only four numbers per position of the `[B, T, V]`
logits z: logsumexp(z), the gold logit, Σ_v z_v and max_v z_v
(`logit_stats`); no `[B, T, V]` log-probabilities are materialised, and the
loss, NLL and accuracy of a train step share one computation of them
(`token_sums`).
"""
import jax
import jax.numpy as jnp


def logit_stats(logits: jax.Array, targets: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(logsumexp(z), z_gold, Σ_v z_v, max_v z_v), each `[B, T]`, float32.

  Args:
    logits: `[B, T, V]`.
    targets: int `[B, T]`, the gold ids.

  The max has no gradient (it serves the accuracy, a metric). Autodiff keeps
  one `[B, T, V]` array (exp(z - max)) for the backward pass; a hand-written
  gradient that kept softmax(z) instead measured no faster and kept one more
  `[B, T, V]` array alive at the peak (XLA's temp memory of the base train
  step, `bench/train_step.py --baseline`).
  """
  logits = logits.astype(jnp.float32)
  row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)
  gold = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  total = jnp.sum(logits, axis=-1)
  return log_normalizer, gold, total, row_max


def smoothed_loss_per_token(stats, vocab: int, label_smoothing: float):
  """KL(q || p) per position from `logit_stats`' (lse, gold, Σz, max).

  q puts 1 - ε_ls on the gold token and ε_ls / (V - 1) on each other token.
  With q summing to 1, Σ_v q(v) log p(v) = (1-ε) z_gold + ε/(V-1) (Σ_v z_v -
  z_gold) - lse(z); q's entropy is subtracted, so a perfect model scores 0;
  with ε_ls = 0 this is the negative log-likelihood.
  """
  log_normalizer, gold, total, _ = stats
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1)
  expected = confidence * gold + low * (total - gold) - log_normalizer
  entropy = -(confidence * jnp.log(confidence) +
              (vocab - 1) * low * jnp.log(low + 1e-20))
  return -expected - entropy


def _weights(targets, weights):
  return (targets > 0).astype(jnp.float32) if weights is None else weights


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
  weights = _weights(targets, weights)
  per_token = smoothed_loss_per_token(logit_stats(logits, targets),
                                      logits.shape[-1], label_smoothing)
  return jnp.sum(per_token * weights), jnp.sum(weights)


def negative_log_likelihood(logits: jax.Array, targets: jax.Array,
                            weights: jax.Array | None = None):
  """Unsmoothed NLL summed over non-pad tokens (for perplexity)."""
  return cross_entropy_with_label_smoothing(logits, targets, 0.0, weights)


def _correct(stats):
  # The gold logit is the largest: one max-reduce, where argmax's (value,
  # index) reduction is not vectorized by XLA:CPU. Differs from argmax ==
  # targets only on exact ties.
  _, gold, _, row_max = stats
  return (gold >= row_max).astype(jnp.float32)


def accuracy(logits: jax.Array, targets: jax.Array,
             weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(number of non-pad tokens whose argmax is the target, token count)."""
  weights = _weights(targets, weights)
  correct = _correct(logit_stats(logits, targets))
  return jnp.sum(correct * weights), jnp.sum(weights)


def token_sums(logits: jax.Array, targets: jax.Array, label_smoothing: float,
               weights: jax.Array | None = None) -> dict[str, jax.Array]:
  """The training metrics from one `logit_stats` pass over the logits.

  Returns:
    {'loss': smoothed loss sum, 'nll': negative log-likelihood sum,
     'correct': tokens whose argmax is the target, 'tokens': token count},
    each as `cross_entropy_with_label_smoothing`, `negative_log_likelihood`
    and `accuracy` would give them.
  """
  weights = _weights(targets, weights)
  stats = logit_stats(logits, targets)
  vocab = logits.shape[-1]
  return {"loss": jnp.sum(smoothed_loss_per_token(stats, vocab,
                                                  label_smoothing) * weights),
          "nll": jnp.sum(smoothed_loss_per_token(stats, vocab, 0.0) * weights),
          "correct": jnp.sum(_correct(stats) * weights),
          "tokens": jnp.sum(weights)}


def projected_token_sums(hidden: jax.Array, kernel: jax.Array,
                         targets: jax.Array, label_smoothing: float,
                         bias: jax.Array | None = None,
                         weights: jax.Array | None = None,
                         chunk_tokens: int = 1024) -> dict[str, jax.Array]:
  """`token_sums` of the logits `hidden · kernelᵀ (+ bias)`, computed
  `chunk_tokens` positions at a time, with the loss's gradient.

  The `[B, T, V]` logits are never whole: each chunk's `[C, V]` logits give
  its sums and, in the same pass, the gradient of the smoothed loss sum
  with respect to them (softmax(z) - q, q the smoothed target
  distribution), which the two matmuls of the backward pass turn into the
  chunk's `hidden` gradient and its share of `kernel`'s (and `bias`'s). The
  FLOPs are those of autodiff (no recomputation); the training step's
  memory holds one chunk's `[C, V]` arrays instead of three `[B, T, V]` ones.

  Args:
    hidden: `[B, T, M]`, the decoder's output.
    kernel: `[V, M]`: the logits are `hidden @ kernel.T` in `hidden`'s dtype
      (the shared embedding's `attend`), then float32.
    targets: int `[B, T]`, 0 = padding.
    label_smoothing: ε_ls of the differentiated loss.
    bias: `[V]` or None, added to the float32 logits.
    weights: `[B, T]`; default 1 where targets != 0.
    chunk_tokens: positions per chunk (the last chunk is padded with
      weight 0).

  Returns:
    `token_sums`' dict. Only 'loss' is differentiable (the others are
    metrics: gradients through them are taken as zero).
  """
  weights = _weights(targets, weights).astype(jnp.float32)
  vocab, width = kernel.shape
  flat = hidden.reshape(-1, width)
  count = flat.shape[0]
  chunk = min(chunk_tokens, count)
  pad = -count % chunk
  flat = jnp.pad(flat, ((0, pad), (0, 0)))
  ids = jnp.pad(targets.reshape(-1), (0, pad))
  mass = jnp.pad(weights.reshape(-1), (0, pad))
  bias = jnp.zeros((vocab,), jnp.float32) if bias is None else bias
  # The name in the compiled ops' metadata (profiles; bench/train_step.py).
  with jax.named_scope("projected_token_sums"):
    return _chunked_sums(label_smoothing, chunk)(
        flat, kernel, bias.astype(jnp.float32), ids, mass)


def _chunked_sums(label_smoothing: float, chunk: int):
  """The custom-VJP function of `projected_token_sums` for one ε_ls and
  chunk size: (hidden `[N, M]`, kernel, bias, ids `[N]`, weights `[N]`)."""
  confidence = 1.0 - label_smoothing

  def forward(hidden, kernel, bias, ids, weights):
    vocab, width = kernel.shape
    low = label_smoothing / (vocab - 1)
    weight_matrix = kernel.astype(hidden.dtype)

    def one_chunk(carry, xs):
      grad_kernel, grad_bias, sums = carry
      h, t, w = xs
      logits = jnp.einsum("CM,VM->CV", h, weight_matrix).astype(
          jnp.float32) + bias
      stats = logit_stats(logits, t)
      # dL/dz for the smoothed loss summed with weights: w·(softmax(z) - q).
      probs = jnp.exp(logits - stats[0][:, None])
      gold = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1) == t[:, None]
      grad_logits = w[:, None] * (probs - jnp.where(gold, confidence, low))
      grad_h = jnp.einsum("CV,VM->CM", grad_logits.astype(h.dtype),
                          weight_matrix)
      grad_kernel += jnp.einsum("CV,CM->VM", grad_logits.astype(h.dtype),
                                h).astype(jnp.float32)
      grad_bias += jnp.sum(grad_logits, axis=0)
      sums = {"loss": sums["loss"] + jnp.sum(
                  smoothed_loss_per_token(stats, vocab, label_smoothing) * w),
              "nll": sums["nll"] + jnp.sum(
                  smoothed_loss_per_token(stats, vocab, 0.0) * w),
              "correct": sums["correct"] + jnp.sum(_correct(stats) * w),
              "tokens": sums["tokens"] + jnp.sum(w)}
      return (grad_kernel, grad_bias, sums), grad_h

    zero = jnp.zeros((), jnp.float32)
    carry = (jnp.zeros((vocab, width), jnp.float32),
             jnp.zeros((vocab,), jnp.float32),
             {"loss": zero, "nll": zero, "correct": zero, "tokens": zero})
    xs = (hidden.reshape(-1, chunk, width), ids.reshape(-1, chunk),
          weights.reshape(-1, chunk))
    (grad_kernel, grad_bias, sums), grad_h = jax.lax.scan(one_chunk, carry, xs)
    grads = (grad_h.reshape(hidden.shape), grad_kernel.astype(kernel.dtype),
             grad_bias)
    return sums, grads

  @jax.custom_vjp
  def sums_of(hidden, kernel, bias, ids, weights):
    return forward(hidden, kernel, bias, ids, weights)[0]

  def backward(grads, cotangent):
    scale = cotangent["loss"]
    grad_h, grad_kernel, grad_bias = grads
    return ((scale * grad_h).astype(grad_h.dtype),
            (scale * grad_kernel).astype(grad_kernel.dtype),
            scale * grad_bias, None, None)

  sums_of.defvjp(forward, backward)
  return sums_of
