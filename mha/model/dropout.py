"""Dropout masks (§5.4) from a keyed counter hash.

A mask entry is dropped when a 32-bit hash of its position, keyed by three
words drawn from the layer's PRNG key, falls below round(P_drop · 2^32):
P_drop is the config's to within 2^-33 (0.1 -> 0.1000000001), closer than
a float32 uniform draw's grid of 2^-23. The hash is three rounds of `x ^=
key word, then murmur3's 32-bit finalizer` (a bijection of the 2^32
positions for each key), a few integer operations an entry that XLA fuses
into the dropout itself. jax.random's generators (threefry, or XLA's
RngBitGenerator) cost many times more per entry on CPU, a large part of a
train step (bench/README.md); the hash is elementwise integer arithmetic
on every backend.

Masks of different layers, steps, micro-batches and devices differ through
their keys (flax's `make_rng`, then `train_step._dropout_rng`'s fold-ins);
within a mask, the entries are the hash of consecutive positions. A mask is
a function of its key and shape alone, so a resumed run draws the same
masks.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

# murmur3's fmix32 multipliers.
_MULTIPLIERS = (0x85EBCA6B, 0xC2B2AE35)
ROUNDS = 3  # key words, one per round


# The hash is written in `lax`'s operations: each of `jnp`'s operators is
# a jitted function, whose every call in a trace is a call of `jit` (what
# that cost the train step's trace: bench/README.md); the program XLA gets
# is the same.


def _xor_shifted(x: jax.Array, shift: int) -> jax.Array:
  """x ^ (x >> shift), logical shift of uint32."""
  return lax.bitwise_xor(x, lax.shift_right_logical(x, np.uint32(shift)))


def _fmix32(x: jax.Array) -> jax.Array:
  x = lax.mul(_xor_shifted(x, 16), np.uint32(_MULTIPLIERS[0]))
  x = lax.mul(_xor_shifted(x, 13), np.uint32(_MULTIPLIERS[1]))
  return _xor_shifted(x, 16)


def hash_bits(words: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """uint32 `shape`: the keyed hash of each entry's row-major position.

  Args:
    words: uint32 `[ROUNDS]`, the key.
    shape: the mask's shape, fewer than 2^32 entries.
  """
  size = math.prod(shape)
  if size >= 2**32:
    raise ValueError(f"A dropout mask of {size} entries: at most 2^32 - 1.")
  x = lax.iota(jnp.uint32, size)
  for i in range(ROUNDS):
    x = _fmix32(lax.bitwise_xor(x, words[i]))
  return x.reshape(shape)


def drop_threshold(rate: float) -> int:
  """The hashes below this are dropped: round(rate · 2^32)."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"Dropout rate {rate}: it must be in [0, 1).")
  return min(round(rate * 2**32), 2**32 - 1)


def keep_mask(rng: jax.Array, keep_prob: float,
              shape: tuple[int, ...]) -> jax.Array:
  """Boolean `shape` mask, each entry True with probability `keep_prob`
  (a Python float: 1 - P_drop, rounded to a multiple of 2^-32)."""
  words = jax.random.bits(rng, (ROUNDS,), jnp.uint32)
  threshold = drop_threshold(1.0 - keep_prob)
  return hash_bits(words, shape) >= jnp.uint32(threshold)
