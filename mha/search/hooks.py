"""Step hooks: what changes a search step's log-probabilities.

A hook is a callable `(log_probs [rows, V], tokens [rows, room], length
[rows]) -> log_probs` (`mha.search.decoding.StepHook`): every search
(greedy, beam, their refilled forms, sampling) applies it in one place at
each step, to the log-softmax of the step's logits, and ranks and scores
what it returns. A hook may lower a log-probability (a ban: -inf; a
penalty), never raise one above 0.

The search's settings build the hooks (`SearchSettings.step_hook`): a new
constraint is a class here, a field of `SearchSettings` and its rule in
`mha.validation.FIELDS`. Hooks are frozen dataclasses, so that a search
compiled for one is found again for an equal one.
"""
import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class NoRepeatNGram:
  """Bans each token that would repeat an n-gram of the row's output
  (fairseq's `--no-repeat-ngram-size`, transformers'
  `no_repeat_ngram_size`): with the output's last n - 1 tokens equal to
  an earlier (n - 1)-gram, the token that followed that one is banned.
  `n = 1` bans every token already in the output. `eos_id` is never
  banned, so that a hypothesis can always end.

  Attributes:
    n: the n-gram's length, >= 1.
    eos_id: the end-of-sentence id.
  """
  n: int
  eos_id: int

  def __call__(self, log_probs: jax.Array, tokens: jax.Array,
               length: jax.Array) -> jax.Array:
    rows, room = tokens.shape
    n = self.n
    starts = room - n + 1  # windows of n - 1 tokens with one after them
    if starts <= 0:
      return log_probs
    # The windows' n - 1 tokens and the token after each: [rows, starts].
    windows = (jnp.stack([tokens[:, i:i + starts] for i in range(n - 1)],
                         axis=-1) if n > 1
               else jnp.zeros((rows, starts, 0), tokens.dtype))
    # [rows, starts, n - 1]
    after = tokens[:, n - 1:]  # [rows, starts]
    # The output's last n - 1 tokens: [rows, n - 1].
    at = length[:, None] - (n - 1) + jnp.arange(n - 1)
    last = jnp.take_along_axis(tokens, jnp.clip(at, 0, room - 1), axis=1)
    # A window counts where its next token is in the output (so a shorter
    # output than n - 1 tokens has none).
    repeats = (jnp.all(windows == last[:, None, :], axis=-1)
               & (jnp.arange(starts)[None, :] + n - 1 < length[:, None]))
    vocab_size = log_probs.shape[-1]
    banned = jnp.zeros((rows, vocab_size), jnp.bool_).at[
        jnp.arange(rows)[:, None],
        jnp.where(repeats, after, vocab_size)].set(True, mode="drop")
    banned = banned & (jnp.arange(vocab_size) != self.eos_id)
    return jnp.where(banned, -jnp.inf, log_probs)


@dataclasses.dataclass(frozen=True)
class Chain:
  """Hooks applied in turn (the settings' order)."""
  hooks: tuple

  def __call__(self, log_probs: jax.Array, tokens: jax.Array,
               length: jax.Array) -> jax.Array:
    for hook in self.hooks:
      log_probs = hook(log_probs, tokens, length)
    return log_probs


def chain(hooks: Sequence) -> "Chain | None":
  """One hook of `hooks` (None without any, the hook itself for one)."""
  hooks = tuple(hooks)
  if not hooks:
    return None
  return hooks[0] if len(hooks) == 1 else Chain(hooks)
