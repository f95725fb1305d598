"""Dropout masks (mha/model/dropout.py): the keyed hash against a NumPy version
of its definition, P_drop to the config's value, and masks without visible
structure: neighbours, entries a row apart and masks of other keys are
dropped together as often as independent draws would be."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha.model import dropout

P_DROP = 0.1
SIZE = 1 << 22


def numpy_hash(words, size):
  """The definition, word by word: x = position; then for each key word,
  x ^= word and murmur3's fmix32 (uint64 arithmetic, masked to 32 bits)."""
  x = np.arange(size, dtype=np.uint64)
  full = np.uint64(0xFFFFFFFF)
  for word in np.asarray(words, np.uint64):
    x ^= word
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x85EBCA6B)) & full
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0xC2B2AE35)) & full
    x ^= x >> np.uint64(16)
  return x.astype(np.uint32)


@pytest.fixture(scope="module")
def masks():
  """Masks of 2^22 entries from three keys: two of them one fold_in apart."""
  key = jax.random.key(11)
  keys = [key, jax.random.fold_in(key, 1), jax.random.key(12)]
  return [np.asarray(dropout.keep_mask(k, 1.0 - P_DROP, (SIZE,)))
          for k in keys]


def test_hash_is_its_definition():
  words = jnp.array([0x01234567, 0x89ABCDEF, 0xDEADBEEF], jnp.uint32)
  np.testing.assert_array_equal(
      np.asarray(dropout.hash_bits(words, (4, 8, 32))).ravel(),
      numpy_hash(words, 4 * 8 * 32))
  # The mask: the hash of the key's first three words, and a drop where it
  # falls below round(P_drop * 2^32) = 429496730 (hand computed).
  assert dropout.drop_threshold(P_DROP) == 429_496_730
  key = jax.random.key(5)
  words = np.asarray(jax.random.bits(key, (3,), jnp.uint32))
  np.testing.assert_array_equal(
      np.asarray(dropout.keep_mask(key, 1.0 - P_DROP, (16, 64))).ravel(),
      numpy_hash(words, 16 * 64) >= 429_496_730)


def test_rate_is_p_drop(masks):
  # Over 2^22 draws the dropped fraction has a standard deviation of 1.5e-4:
  # within 6e-4 (4 sd) of 0.1; 0.1's neighbours on a 2^-10 grid (the
  # rounding of a float16 probability) are 6.5 sd away, 0.9 (the wrong
  # polarity) thousands.
  for keep in masks:
    assert abs((1.0 - keep.mean()) - P_DROP) < 6e-4
  assert dropout.drop_threshold(0.0) == 0
  assert np.asarray(dropout.keep_mask(jax.random.key(0), 1.0, (1000,))).all()
  with pytest.raises(ValueError, match="Dropout rate 1.0"):
    dropout.keep_mask(jax.random.key(0), 0.0, (10,))


def _joint_drop_sd(a, b):
  """How far the fraction of positions dropped in both masks is from P_drop²
  (independent masks), in standard deviations of that fraction."""
  both = np.mean(~a & ~b)
  p = P_DROP**2
  return abs(both - p) / np.sqrt(p * (1 - p) / a.size)


def test_entries_and_keys_are_independent(masks):
  first = masks[0]
  # Neighbours, and entries a d_model row (64, 256, 512, 1024) or a head
  # apart: each pair dropped together at P_drop², within 5 sd.
  for lag in (1, 2, 3, 64, 256, 512, 1024, 4096):
    assert _joint_drop_sd(first[:-lag], first[lag:]) < 5, lag
  # Masks of other keys, position by position and shifted (a key that only
  # offset the counter would give the same mask shifted).
  for other in masks[1:]:
    assert _joint_drop_sd(first, other) < 5
    for shift in (1, 7, 1000):
      assert _joint_drop_sd(first[:-shift], other[shift:]) < 5
  # The same key draws the same mask; a mask is not periodic in its rows.
  again = np.asarray(dropout.keep_mask(jax.random.key(11), 1.0 - P_DROP,
                                       (SIZE,)))
  np.testing.assert_array_equal(first, again)
  rows = first.reshape(-1, 1024)
  assert not np.array_equal(rows[0], rows[1])


def test_a_mask_above_2_to_the_32_entries_is_refused():
  with pytest.raises(ValueError, match="at most 2\\^32 - 1"):
    dropout.hash_bits(jnp.zeros(3, jnp.uint32), (1 << 16, 1 << 16))
