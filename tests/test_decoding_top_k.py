"""`fast_top_k._top_k`, the searches' top k over the vocabulary by chunks,
must give `lax.top_k`'s values and indices, ties (lower index first) and
-inf included."""
import jax
from jax import lax
import numpy as np
import pytest

from mha.search import fast_top_k


@pytest.mark.parametrize('vocab', [200, 64 * 5, 1000])
def test_top_k_by_chunks_equals_lax_top_k(vocab):
  rng = np.random.default_rng(vocab)
  ours = jax.jit(fast_top_k._top_k, static_argnums=1)  # pylint: disable=protected-access
  theirs = jax.jit(lax.top_k, static_argnums=1)
  for kind in range(5):
    x = [rng.normal(size=(6, 3, vocab)),  # no ties
         -np.abs(rng.normal(size=(6, 3, vocab))),  # all below 0
         rng.integers(0, 3, size=(6, 3, vocab)),  # ties everywhere
         # a few large entries, ties below them in other chunks
         rng.choice(3, size=(6, 3, vocab), p=[0.97, 0.025, 0.005]),
         np.where(rng.random((6, 3, vocab)) < 0.9, -np.inf,
                  rng.integers(0, 2, size=(6, 3, vocab)))][kind]
    x = x.astype(np.float32)
    for k in (1, 2, 8):
      values, index = ours(x, k)
      want_values, want_index = theirs(x, k)
      np.testing.assert_array_equal(np.asarray(values),
                                    np.asarray(want_values))
      np.testing.assert_array_equal(np.asarray(index),
                                    np.asarray(want_index))
