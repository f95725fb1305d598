"""Step hooks (mha/search/hooks.py, `step_hook` of mha/search/decoding.py)
against independent computations: a plain Python n-gram ban, brute-force
enumeration and a NumPy greedy loop over the table models of
test_decoding.py, which recompute each prefix from scratch.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha.search import decoding
from mha.search import hooks
from mha.search import refill
from test_decoding import EOS, TableModel, VOCAB, brute_force, hypothesis


def identity(log_probs, tokens, length):
  del tokens, length
  return log_probs


def python_banned(tokens, length, n, eos_id, vocab):
  """The tokens an n-gram ban forbids after `tokens[:length]`."""
  out = list(tokens[:length])
  banned = set()
  if n == 1:
    banned = set(out)
  elif len(out) >= n - 1:
    last = out[len(out) - (n - 1):]
    for s in range(len(out) - (n - 1)):
      if out[s:s + n - 1] == last:
        banned.add(out[s + n - 1])
  banned.discard(eos_id)
  return {t for t in banned if t < vocab}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_bans_what_a_python_loop_bans(n):
  rng = np.random.default_rng(n)
  rows, room, vocab = 64, 9, 6
  tokens = rng.integers(1, 4, size=(rows, room)).astype(np.int32)
  length = rng.integers(0, room + 1, size=(rows,)).astype(np.int32)
  tokens[np.arange(room)[None, :] >= length[:, None]] = 0  # as the searches
  log_probs = jax.nn.log_softmax(
      jnp.asarray(rng.normal(size=(rows, vocab)), jnp.float32))
  hooked = np.asarray(hooks.NoRepeatNGram(n, eos_id=2)(
      log_probs, jnp.asarray(tokens), jnp.asarray(length)))
  some_banned = 0
  for r in range(rows):
    banned = python_banned(tokens[r], length[r], n, 2, vocab)
    some_banned += bool(banned)
    for t in range(vocab):
      want = -np.inf if t in banned else float(log_probs[r, t])
      assert hooked[r, t] == want, (r, t, tokens[r], length[r])
  assert some_banned > rows // 8  # the rows exercise the ban


def run(model, beam, max_decode_len, limits, hook):
  fn = jax.jit(lambda cache, limits: decoding.beam_search(
      model.step, cache, model.batch_size, beam, 0.6, max_decode_len, EOS,
      limits, cache_rows=model.cache_rows(), with_log_probs=True,
      step_hook=hook))
  return [np.asarray(x) for x in fn(model.init_cache(model.batch_size * beam),
                                    limits)]


@pytest.mark.parametrize("beam", [1, 2, 4])
def test_an_identity_hook_gives_the_fast_paths_results_bit_for_bit(beam):
  """The hooked path (a log-softmax of every row) and the fast paths (the
  best raw logits) choose, score and end alike."""
  model = TableModel(seed=5, batch_size=4, max_len=7)
  limits = np.array([7, 3, 5, 6], np.int32)
  plain = run(model, beam, 7, limits, None)
  hooked = run(model, beam, 7, limits, identity)
  for a, b in zip(plain, hooked):
    np.testing.assert_array_equal(a, b)


def _repeats(seq, n):
  grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
  return len(grams) != len(set(grams))


def test_a_wide_beam_with_a_bigram_ban_equals_brute_force_without_repeats():
  """Every hypothesis without a repeated bigram (an EOS is never banned),
  best first, with its unchanged score: a ban removes tokens, nothing
  else."""
  limits = np.array([5, 4, 5], np.int32)
  model = TableModel(seed=3, batch_size=3, max_len=6)
  beam = 81
  tokens, scores, _ = run(model, beam, 6, limits,
                          hooks.NoRepeatNGram(2, eos_id=EOS))
  for b, limit in enumerate(limits):
    expected = [(score, seq)
                for score, seq in brute_force(model, b, int(limit), 0.6)
                if not _repeats(seq, 2)][:beam]
    got = [hypothesis(t) for t in tokens[b]]
    assert got[:len(expected)] == [seq for _, seq in expected]
    np.testing.assert_allclose(scores[b, :len(expected)],
                               [s for s, _ in expected], rtol=1e-5, atol=1e-5)
    assert np.all(scores[b, len(expected):] == -np.inf)
  unbanned = run(model, beam, 6, limits, None)[0]
  assert any(_repeats(hypothesis(t), 2) for t in unbanned.reshape(-1, 6))


def test_greedy_with_a_unigram_ban_equals_a_numpy_loop():
  model = TableModel(seed=4, batch_size=5, max_len=8, scale=1.0)
  limits = np.array([7, 3, 1, 7, 5], np.int32)
  tokens = np.asarray(jax.jit(lambda cache, limits: decoding.greedy_search(
      model.step, cache, 5, 8, EOS, limits, cache_rows=model.cache_rows(),
      step_hook=hooks.NoRepeatNGram(1, eos_id=EOS)))(model.init_cache(),
                                                      limits))
  for b, limit in enumerate(limits):
    seq = []
    while len(seq) < limit:
      log_probs = model.np_log_probs(b, seq)
      log_probs[[t for t in set(seq) if t != EOS]] = -np.inf
      seq.append(int(np.argmax(log_probs)))
      if seq[-1] == EOS:
        break
    assert hypothesis(tokens[b]) == tuple(seq)


def test_samples_under_a_ban_repeat_no_bigram_and_keep_their_keys():
  model = TableModel(seed=6, batch_size=16, max_len=8, scale=0.5)
  keys = jax.random.split(jax.random.key(0), 16)

  def draw(hook):
    return np.asarray(jax.jit(lambda cache: decoding.sample(
        model.step, cache, 16, 8, EOS, keys, 1.0,
        cache_rows=model.cache_rows(), step_hook=hook)[0])(
            model.init_cache()))

  banned = draw(hooks.NoRepeatNGram(2, eos_id=EOS))
  assert not any(_repeats(hypothesis(t), 2) for t in banned)
  assert any(_repeats(hypothesis(t), 2) for t in draw(None))
  np.testing.assert_array_equal(draw(None), draw(identity))


def test_a_chain_applies_its_hooks_in_turn():
  log_probs = jnp.log(jnp.full((1, VOCAB), 1.0 / VOCAB))
  tokens = jnp.array([[2, 3, 2, 0]], jnp.int32)
  length = jnp.array([3], jnp.int32)
  both = hooks.chain([hooks.NoRepeatNGram(1, EOS),
                      hooks.NoRepeatNGram(2, EOS)])
  assert isinstance(both, hooks.Chain)
  out = np.asarray(both(log_probs, tokens, length))[0]
  assert [t for t in range(VOCAB) if out[t] == -np.inf] == [2, 3]
  assert hooks.chain([]) is None
  one = hooks.NoRepeatNGram(2, EOS)
  assert hooks.chain([one]) is one
  # Equal settings, equal hooks: a compiled search is found again.
  assert hash(hooks.NoRepeatNGram(2, EOS)) == hash(one)


def test_refilled_searches_under_a_ban_equal_the_whole_batchs():
  """A hook sees each row's own tokens and length in the refilled searches
  too (rows at their own positions, slots taking new sentences)."""
  from test_translate_refill import (  # pylint: disable=import-outside-toplevel
      EOS as TOY_EOS, ToyBeamModel, ToyModel)
  num_sentences, max_len = 11, 9
  hook = hooks.NoRepeatNGram(2, eos_id=TOY_EOS)
  limits = jnp.asarray(np.random.default_rng(2).integers(
      2, max_len + 1, num_sentences), jnp.int32)

  greedy = ToyModel(num_sentences, max_len, seed=3)
  unigrams = hooks.NoRepeatNGram(1, eos_id=TOY_EOS)
  search = jax.jit(lambda cache, hook: decoding.greedy_search(
      greedy.step, cache, num_sentences, max_len, TOY_EOS, limits,
      step_hook=hook), static_argnums=1)
  whole = np.asarray(search(greedy.init_cache(num_sentences, max_len),
                            unigrams))
  refilled = jax.jit(lambda cache: refill.greedy_refill(
      greedy.step, cache, greedy.start_rows, 4, max_len, TOY_EOS, limits,
      step_hook=unigrams))(greedy.init_cache(4, max_len))
  np.testing.assert_array_equal(np.asarray(refilled[0]), whole)
  assert not any(_repeats(hypothesis(t), 1) for t in whole)
  assert any(_repeats(hypothesis(t), 1) for t in np.asarray(
      search(greedy.init_cache(num_sentences, max_len), None)))

  beamy = ToyBeamModel(num_sentences, max_len, seed=4)
  beam = beamy.beam_size
  whole = jax.jit(lambda cache: decoding.beam_search(
      beamy.step, cache, num_sentences, beam, 0.6, max_len, TOY_EOS, limits,
      cache_rows=beamy.cache_rows(), num_best=1, with_log_probs=True,
      step_hook=hook))(beamy.init_cache(num_sentences * beam, max_len))
  found = jax.jit(lambda cache: refill.beam_refill(
      beamy.step, cache, beamy.start_rows, 3, beam, 0.6, max_len, TOY_EOS,
      limits, beamy.cache_rows(), step_hook=hook))(
          beamy.init_cache(3 * beam, max_len))
  for ours, theirs in zip(found, whole):
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs[:, 0]))
  best = np.asarray(whole[0][:, 0])
  assert not any(_repeats(hypothesis(t), 2) for t in best)
  unhooked = jax.jit(lambda cache: decoding.beam_search(
      beamy.step, cache, num_sentences, beam, 0.6, max_len, TOY_EOS, limits,
      cache_rows=beamy.cache_rows(), num_best=1))(
          beamy.init_cache(num_sentences * beam, max_len))
  assert any(_repeats(hypothesis(t), 2)
             for t in np.asarray(unhooked[0][:, 0]))


@pytest.mark.parametrize("beam", [1, 2])
def test_the_transformers_searches_take_the_settings_hook(beam):
  """`no_repeat_ngram_size` from the settings to the Transformer's search:
  no output repeats a token, and the refilled search of two batches gives
  each batch's own search's outputs under the hook too."""
  from conftest import random_tiny_transformer  # pylint: disable=import-outside-toplevel
  from mha.search import texts  # pylint: disable=import-outside-toplevel
  from mha.search.settings import SearchSettings  # pylint: disable=import-outside-toplevel
  # max_len 48: a model of its own, whose searches no other test's share
  # (test_translate_refill.py counts the programs of its own).
  model_config, params = random_tiny_transformer(16, 48, seed=5)
  rng = np.random.default_rng(0)
  encoded = [list(rng.integers(3, 16, n - 1)) + [EOS]
             for n in rng.integers(5, 9, 2 * 64)]
  batches = texts.make_batches(encoded, batch_size=64, max_len=48,
                               max_decode_extra=12)
  device = jax.local_devices()[:1]
  assert texts._refill_groups(batches, tuple(device), beam) == [[0, 1]]  # pylint: disable=protected-access
  settings = SearchSettings(beam_size=beam, max_decode_extra=12,
                            no_repeat_ngram_size=1)

  def outputs(settings, num_best=0):
    found = texts.decode_batches(model_config, params, batches, settings,
                                 devices=device, num_best=num_best)
    return [np.asarray(f[0])[:, 0] if num_best else np.asarray(f)
            for f in found]  # per batch, [rows, len]

  refilled = outputs(settings)
  for ours, alone in zip(refilled, outputs(settings, num_best=1)):
    np.testing.assert_array_equal(ours, alone)
  assert not any(_repeats(hypothesis(t), 1)
                 for batch in refilled for t in batch)
  plain = outputs(settings.given(no_repeat_ngram_size=0))
  assert any(_repeats(hypothesis(t), 1) for batch in plain for t in batch)
