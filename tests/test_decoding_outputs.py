"""n-best lists, sampling and forced decoding in the search layer, against
independent computations: brute-force enumeration and NumPy re-computation
of every prefix (test_decoding.TableModel), and the exact distribution of a
small bigram model for the sampled frequencies."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha.search import decoding

from test_decoding import EOS, TableModel, brute_force, hypothesis, lp


def run_beam(model, beam, alpha, max_len, limits, **kwargs):
  fn = jax.jit(lambda cache, limits: decoding.beam_search(
      model.step, cache, model.batch_size, beam, alpha, max_len, EOS, limits,
      cache_rows=model.cache_rows(), with_log_probs=True, **kwargs))
  return [np.asarray(x) for x in fn(model.init_cache(), limits)]


@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_nbest_scores_and_log_probs_equal_brute_force(alpha):
  # A beam wide enough to hold every hypothesis: all of them, best first,
  # with log P(Y | X) and the length-penalised score of each.
  limits = np.array([4, 3], np.int32)
  model = TableModel(seed=7, batch_size=2, max_len=4)
  beam = 27  # the best 27 of each sentence's 40 and 121 hypotheses
  tokens, scores, log_probs = run_beam(model, beam, alpha, 4, limits)
  for b, limit in enumerate(limits):
    expected = brute_force(model, b, int(limit), alpha)[:beam]
    assert [hypothesis(t) for t in tokens[b, :len(expected)]] == [
        seq for _, seq in expected]
    np.testing.assert_allclose(scores[b, :len(expected)],
                               [s for s, _ in expected], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        log_probs[b, :len(expected)],
        [model.np_logprob(b, seq) for _, seq in expected], rtol=1e-5,
        atol=1e-5)
    assert np.all(log_probs[b, len(expected):] == -np.inf)


@pytest.mark.parametrize('beam', [1, 4])
def test_nbest_prefix_of_a_narrow_beam_is_the_full_searchs(beam):
  # num_best=n stops a sentence once its n best can no longer change: those
  # n equal the full search's, log-probabilities included (beam 1: greedy).
  limits = np.array([6, 3, 5, 6], np.int32)
  model = TableModel(seed=8, batch_size=4, max_len=6)
  full = run_beam(model, beam, 0.6, 6, limits)
  for n in range(1, beam + 1):
    part = run_beam(model, beam, 0.6, 6, limits, num_best=n)
    for x, y in zip(part, full):
      np.testing.assert_array_equal(x[:, :n], y[:, :n])
  for b in range(4):
    for k in range(beam):
      seq = hypothesis(full[0][b, k])
      np.testing.assert_allclose(full[2][b, k], model.np_logprob(b, seq),
                                 rtol=1e-5)
      np.testing.assert_allclose(full[1][b, k],
                                 full[2][b, k] / lp(len(seq), 0.6), rtol=1e-5)


def test_forced_log_probs_equal_numpy_prefix_recomputation():
  model = TableModel(seed=9, batch_size=3, max_len=6)
  targets = np.array([[2, 3, 4, 2, EOS, 0], [4, EOS, 0, 0, 0, 0],
                      [3, 3, 2, 4, 2, 4]], np.int32)  # the last: no EOS
  got = np.asarray(jax.jit(lambda c, t: decoding.forced_log_probs(
      model.step, c, t, model.cache_rows()))(model.init_cache(), targets))
  for b in range(3):
    seq = hypothesis(targets[b])
    expected = [model.np_log_probs(b, seq[:i])[y] for i, y in enumerate(seq)]
    np.testing.assert_allclose(got[b, :len(seq)], expected, rtol=1e-5,
                               atol=1e-5)
    assert np.all(got[b, len(seq):] == 0)


def test_forced_log_probs_of_the_beams_outputs_are_its_log_probs():
  limits = np.array([6, 4, 5], np.int32)
  model = TableModel(seed=10, batch_size=3, max_len=6)
  tokens, _, log_probs = run_beam(model, 3, 0.6, 6, limits)
  for k in range(3):
    forced = np.asarray(decoding.forced_log_probs(
        model.step, model.init_cache(), tokens[:, k], model.cache_rows()))
    np.testing.assert_allclose(forced.sum(axis=1), log_probs[:, k],
                               rtol=1e-5)


# ------------------------------------------------------------------ sampling


class BigramModel:
  """logits(next | last) = W[last]: the pad id 0 has a finite, large logit
  (the search must never draw it), and a two-token output's probability is
  a product of two rows of softmax(W)."""

  def __init__(self, seed: int, vocab: int = 6):
    self.w = np.random.default_rng(seed).normal(size=(vocab, vocab)) * 1.5
    self.w[:, 0] = 3.0

  def step(self, tokens, cache):
    logits = jnp.asarray(self.w, jnp.float32)[tokens[:, 0]]
    return logits, {'cache_index': cache['cache_index'] + 1}

  def probs(self, last: int, temperature: float, top_k: int) -> np.ndarray:
    """The distribution the sampler must draw from after `last`."""
    logits = self.w[last].copy()
    logits[0] = -np.inf
    if top_k:
      logits[np.argsort(-logits)[top_k:]] = -np.inf
    p = np.exp((logits - logits.max()) / temperature)
    return p / p.sum()


def draw(model, keys, temperature, top_k, max_len=2, eos=EOS):
  n = keys.shape[0]
  fn = jax.jit(lambda keys: decoding.sample(
      model.step, {'cache_index': jnp.array(0, jnp.int32)}, n, max_len, eos,
      keys, temperature, top_k))
  return [np.asarray(x) for x in fn(keys)]


@pytest.mark.parametrize('temperature, top_k', [(1.0, 0), (0.7, 3), (2.0, 1)])
def test_sampled_outputs_follow_the_models_distribution(temperature, top_k):
  model = BigramModel(seed=0)
  n = 20000
  tokens, log_probs = draw(model, jax.random.split(jax.random.PRNGKey(1), n),
                           temperature, top_k)
  assert not np.any(tokens[:, 0] == 0)  # never the pad id
  # The probability of each output (y1, EOS) or (y1, y2): ancestral sampling.
  expected = {}
  first = model.probs(0, temperature, top_k)
  for y1 in range(1, 6):
    if y1 == EOS:
      expected[(EOS,)] = first[EOS]
      continue
    second = model.probs(y1, temperature, top_k)
    for y2 in range(1, 6):
      expected[(y1, y2)] = first[y1] * second[y2]
  counts = {}
  for row in tokens:
    seq = hypothesis(row)
    counts[seq] = counts.get(seq, 0) + 1
  assert set(counts) <= {k for k, p in expected.items() if p > 0}
  for seq, p in expected.items():
    sigma = np.sqrt(n * p * (1 - p)) + 1e-9
    assert abs(counts.get(seq, 0) - n * p) <= 5 * sigma + 1, (seq, p)
  # The log-probabilities returned are the model's (T = 1, every token).
  log_softmax = model.w - np.logaddexp.reduce(model.w, axis=1, keepdims=True)
  for row, lp_row in zip(tokens[:50], log_probs[:50]):
    seq = hypothesis(row)
    want = sum(log_softmax[last, y] for last, y in zip((0,) + seq, seq))
    np.testing.assert_allclose(lp_row, want, rtol=1e-5)


def test_sampling_is_reproducible_and_per_sentence():
  model = TableModel(seed=11, batch_size=16, max_len=6)
  keys = jax.random.split(jax.random.PRNGKey(3), 16)

  def run(keys, rows, temperature=1.0):
    fn = jax.jit(lambda cache, keys: decoding.sample(
        model.step, cache, len(rows), 6, EOS, keys, temperature,
        cache_rows=model.cache_rows()))
    cache = model.init_cache()
    cache = dict(cache, acc=cache['acc'][rows], src=cache['src'][rows])
    return [np.asarray(x) for x in fn(cache, keys[rows])]

  rows = np.arange(16)
  first, again = run(keys, rows), run(keys, rows)
  np.testing.assert_array_equal(first[0], again[0])
  assert len({hypothesis(t) for t in first[0]}) > 4
  other = run(jax.random.split(jax.random.PRNGKey(4), 16), rows)
  assert not np.array_equal(first[0], other[0])
  # A sentence's sample depends on its key alone, not on its batch.
  subset = np.array([5, 2, 11])
  np.testing.assert_array_equal(run(keys, subset)[0], first[0][subset])
  for b in range(16):
    seq = hypothesis(first[0][b])
    np.testing.assert_allclose(first[1][b], model.np_logprob(b, seq),
                               rtol=1e-5)


def test_temperature_zero_and_near_zero_is_greedy():
  model = TableModel(seed=12, batch_size=6, max_len=7)
  greedy = np.asarray(decoding.greedy_search(
      model.step, model.init_cache(), 6, 7, EOS,
      cache_rows=model.cache_rows()))
  keys = jax.random.split(jax.random.PRNGKey(0), 6)
  for temperature in (0.0, 1e-4):
    tokens, _ = decoding.sample(model.step, model.init_cache(), 6, 7, EOS,
                                keys, temperature,
                                cache_rows=model.cache_rows())
    np.testing.assert_array_equal(np.asarray(tokens), greedy)
  with pytest.raises(ValueError, match='temperature'):
    decoding.sample(model.step, model.init_cache(), 6, 7, EOS, keys, -1.0)
