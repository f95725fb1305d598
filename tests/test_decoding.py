"""Greedy and beam search against independent computations.

The "models" here are small tables whose next-token logits depend on the whole
prefix, the position and the sentence; the step functions see the prefix only
through their cache, so a wrongly gathered cache gives wrong scores. The
references (brute-force enumeration, a NumPy argmax loop) recompute each
prefix from scratch.
"""
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from mha.search import cache_rows
from mha.search import decoding
from mha.model import transformer
from mha.search import batches as batch_search
from mha.search import model_cache
from mha.search.settings import SearchSettings
from mha.search.cache_rows import CacheRows

EOS = 1
VOCAB = 5  # 0 = pad / start (never generated: logit -inf), 1 = EOS, 2, 3, 4


def mask_pad(logits):
  return jnp.where(jnp.arange(logits.shape[-1]) == 0, -jnp.inf, logits)


class TableModel:
  """logits(y_0..y_t) = A[t, y_t] + sum_{j<=t} B[j, y_j] + S[sentence].

  y_0 = 0 is the start symbol; the pad token 0 has logit -inf, so hypotheses
  read unambiguously from the 0-padded outputs (and -inf log-probabilities are
  exercised). The step function carries the running sum in
  its cache (`acc`, per hypothesis), the sentence's bias (`src`, per sentence,
  so the search repeats it per beam) and the position as a scalar
  `cache_index` plus a `[num_layers]` index array, like a flax cache of a
  scanned layer stack; `cache_rows` says so to the search.
  """

  def __init__(self, seed: int, batch_size: int, max_len: int,
               vocab: int = VOCAB, scale: float = 1.5):
    rng = np.random.default_rng(seed)
    self.batch_size = batch_size
    self.a = rng.normal(size=(max_len, vocab, vocab)) * scale  # [pos, tok, V]
    self.b = rng.normal(size=(max_len, vocab, vocab)) * scale / 2
    self.s = rng.normal(size=(batch_size, vocab))  # [batch, V]
    self.calls = []  # (tokens shape, position) of each executed step

  def init_cache(self, rows: int | None = None):
    rows = rows or self.batch_size
    return {
        'acc': jnp.zeros((rows, self.a.shape[-1]), jnp.float32),
        'src': jnp.asarray(self.s, jnp.float32),
        'cache_index': jnp.array(0, jnp.int32),
        'layers': {'cache_index': jnp.zeros((3,), jnp.int32)},
    }

  def cache_rows(self):
    return {'acc': CacheRows.HYPOTHESIS, 'src': CacheRows.SENTENCE,
            'cache_index': CacheRows.SHARED,
            'layers': {'cache_index': CacheRows.SHARED}}

  def step(self, tokens, cache, record: bool = False):
    # Checked while tracing: one position per call.
    assert tokens.ndim == 2 and tokens.shape[1] == 1, tokens.shape
    pos = cache['cache_index']
    token = tokens[:, 0]  # [rows]
    a = jnp.asarray(self.a, jnp.float32)
    b = jnp.asarray(self.b, jnp.float32)
    acc = cache['acc'] + b[pos, token]  # [rows, V]
    logits = mask_pad(a[pos, token] + acc + cache['src'])  # [rows, V]
    if record:
      jax.debug.callback(
          lambda p, shape=tokens.shape: self.calls.append((shape, int(p))),
          pos)
    new_cache = {
        'acc': acc,
        'src': cache['src'],
        'cache_index': pos + 1,
        'layers': {'cache_index': cache['layers']['cache_index'] + 1},
    }
    return logits, new_cache

  # NumPy references, from the full prefix.

  def np_log_probs(self, sentence: int, prefix) -> np.ndarray:
    """log P(. | prefix) with prefix = (y_1, ..., y_t) (start symbol added)."""
    full = (0,) + tuple(prefix)
    t = len(full) - 1
    logits = self.a[t, full[t]] + self.s[sentence]
    logits = logits + sum(self.b[j, y] for j, y in enumerate(full))
    logits[0] = -np.inf
    return logits - np.logaddexp.reduce(logits)

  def np_logprob(self, sentence: int, seq) -> float:
    return sum(self.np_log_probs(sentence, seq[:i])[y]
               for i, y in enumerate(seq))


def lp(length, alpha):
  return ((5.0 + length) / 6.0)**alpha


def hypothesis(tokens: np.ndarray) -> tuple[int, ...]:
  """Tokens up to and including EOS, or up to the padding."""
  tokens = list(np.asarray(tokens))
  if EOS in tokens:
    return tuple(tokens[:tokens.index(EOS) + 1])
  while tokens and tokens[-1] == 0:
    tokens.pop()
  return tuple(tokens)


def brute_force(model: TableModel, sentence: int, limit: int, alpha: float):
  """Every complete hypothesis of at most `limit` tokens, best first."""
  others = [v for v in range(VOCAB) if v not in (0, EOS)]
  results = []
  for n in range(1, limit + 1):
    for body in itertools.product(others, repeat=n - 1):
      ends = [body + (EOS,)]
      if n == limit:  # forced end at the limit, with any last token
        ends += [body + (v,) for v in others]
      for seq in ends:
        results.append((model.np_logprob(sentence, seq) / lp(n, alpha), seq))
  results.sort(key=lambda r: -r[0])
  return results


def run_beam(model, beam_size, alpha, max_decode_len, max_lengths=None,
             rows=None):
  fn = jax.jit(lambda cache, max_lengths: decoding.beam_search(
      model.step, cache, model.batch_size, beam_size, alpha, max_decode_len,
      EOS, max_lengths, cache_rows=model.cache_rows()))
  tokens, scores = fn(model.init_cache(rows), max_lengths)
  return np.asarray(tokens), np.asarray(scores)


@pytest.mark.parametrize('alpha', [0.0, 0.6, 1.5])
def test_wide_beam_equals_brute_force(alpha):
  # Limits 5, 3 and 4: the widest needs 3^4 = 81 live prefixes at length 4.
  limits = np.array([5, 3, 4], np.int32)
  model = TableModel(seed=0, batch_size=3, max_len=6)
  beam = 81
  tokens, scores = run_beam(model, beam, alpha, max_decode_len=6,
                            max_lengths=limits, rows=3 * beam)
  assert tokens.shape == (3, beam, 6) and scores.shape == (3, beam)
  lengths = []
  for b, limit in enumerate(limits):
    expected = brute_force(model, b, int(limit), alpha)[:beam]
    got = [hypothesis(t) for t in tokens[b]]
    # Every hypothesis, best first; slots left empty score -inf.
    assert got[:len(expected)] == [seq for _, seq in expected]
    np.testing.assert_allclose(scores[b, :len(expected)],
                               [s for s, _ in expected], rtol=1e-5, atol=1e-5)
    assert np.all(scores[b, len(expected):] == -np.inf)
    assert np.all(tokens[b, :, limit:] == 0)
    lengths.append(len(expected[0][1]))
  assert max(lengths) > 1  # the test is not about [EOS] alone


@pytest.mark.parametrize('beam', [2, 3])
def test_narrow_beam_is_consistent_and_never_beats_the_optimum(beam):
  limits = np.array([5, 2, 4, 5], np.int32)
  model = TableModel(seed=1, batch_size=4, max_len=5)
  alpha = 0.6
  tokens, scores = run_beam(model, beam, alpha, max_decode_len=5,
                            max_lengths=limits)
  for b, limit in enumerate(limits):
    optimum = brute_force(model, b, int(limit), alpha)[0][0]
    assert scores[b, 0] <= optimum + 1e-5
    assert np.all(np.diff(scores[b]) <= 0)  # best first
    for k in range(beam):
      seq = hypothesis(tokens[b, k])
      assert 1 <= len(seq) <= limit
      assert EOS not in seq[:-1]
      assert seq[-1] == EOS or len(seq) == limit
      expected = model.np_logprob(b, seq) / lp(len(seq), alpha)
      np.testing.assert_allclose(scores[b, k], expected, rtol=1e-5, atol=1e-5)


def np_greedy(model: TableModel, sentence: int, limit: int):
  seq = []
  while len(seq) < limit:
    seq.append(int(np.argmax(model.np_log_probs(sentence, seq))))
    if seq[-1] == EOS:
      break
  return tuple(seq)


def test_greedy_equals_numpy_argmax_loop():
  limits = np.array([7, 3, 1, 7, 5], np.int32)
  model = TableModel(seed=2, batch_size=5, max_len=8, scale=1.0)
  fn = jax.jit(lambda cache, limits: decoding.greedy_search(
      model.step, cache, 5, 8, EOS, limits, cache_rows=model.cache_rows()))
  tokens = np.asarray(fn(model.init_cache(), limits))
  assert tokens.shape == (5, 8)
  for b, limit in enumerate(limits):
    expected = np_greedy(model, b, int(limit))
    assert hypothesis(tokens[b]) == expected
    assert np.all(tokens[b, len(expected):] == 0)


def test_beam_size_one_is_greedy_with_its_score():
  model = TableModel(seed=3, batch_size=4, max_len=6)
  alpha = 0.6
  tokens, scores = run_beam(model, 1, alpha, max_decode_len=6)
  greedy = np.asarray(jax.jit(lambda c: decoding.greedy_search(
      model.step, c, 4, 6, EOS, cache_rows=model.cache_rows()))(
          model.init_cache()))
  np.testing.assert_array_equal(tokens[:, 0], greedy)
  for b in range(4):
    seq = hypothesis(greedy[b])
    assert seq == np_greedy(model, b, 6)
    np.testing.assert_allclose(
        scores[b, 0], model.np_logprob(b, seq) / lp(len(seq), alpha),
        rtol=1e-5)


def test_steps_take_one_token_and_stop_when_all_finished():
  model = TableModel(seed=4, batch_size=3, max_len=10)
  step = lambda tokens, cache: model.step(tokens, cache, record=True)
  tokens = decoding.greedy_search(step, model.init_cache(), 3, 10, EOS,
                                  cache_rows=model.cache_rows())
  jax.effects_barrier()
  longest = max(len(hypothesis(t)) for t in np.asarray(tokens))
  assert longest < 10  # stopped early: every sentence reached EOS
  assert model.calls == [((3, 1), t) for t in range(longest)]



def test_beam_search_stops_early_with_the_best_hypothesis():
  # The same next-token distribution at every step: the best hypothesis of
  # length n is (n - 1) times the likeliest non-EOS token, then EOS.
  log_probs = np.array([-np.inf, *np.log([0.4, 0.3, 0.2, 0.1])])  # 0 = pad
  calls = []

  def step(tokens, cache):
    assert tokens.shape == (6 * 4, 1)
    jax.debug.callback(lambda p: calls.append(int(p)), cache['cache_index'])
    logits = jnp.broadcast_to(jnp.asarray(log_probs, jnp.float32),
                              (tokens.shape[0], VOCAB))
    return logits, {'cache_index': cache['cache_index'] + 1,
                    'rows': cache['rows'] + tokens}

  cache = {'cache_index': jnp.array(0, jnp.int32),
           'rows': jnp.zeros((6, 1), jnp.int32)}
  # (A large alpha weakens the bound: lp(40) / lp(t) grows with alpha.)
  for alpha in (0.0, 1.0):
    calls.clear()
    tokens, scores = decoding.beam_search(step, cache, 6, 4, alpha, 40, EOS)
    jax.effects_barrier()
    assert calls == list(range(len(calls))) and len(calls) < 40
    n = np.arange(1, 41)
    best = ((n - 1) * log_probs[2] + log_probs[EOS]) / lp(n, alpha)
    expected = (2,) * int(np.argmax(best)) + (EOS,)
    for b in range(6):
      assert hypothesis(np.asarray(tokens)[b, 0]) == expected
    np.testing.assert_allclose(np.asarray(scores)[:, 0], best.max(),
                               rtol=1e-6)


class HistoryModel(TableModel):
  """The same logits, recomputed from a token history kept in the cache."""

  def init_cache(self, rows=None):
    rows = rows or self.batch_size
    return {
        'history': jnp.zeros((rows, self.a.shape[0]), jnp.int32),
        'src': jnp.asarray(self.s, jnp.float32),
        'cache_index': jnp.array(0, jnp.int32),
    }

  def cache_rows(self):
    return {'history': CacheRows.HYPOTHESIS, 'src': CacheRows.SENTENCE,
            'cache_index': CacheRows.SHARED}

  def step(self, tokens, cache, record=False):
    assert tokens.shape[1:] == (1,)
    pos = cache['cache_index']
    history = cache['history'].at[:, pos].set(tokens[:, 0])  # [rows, L]
    a = jnp.asarray(self.a, jnp.float32)
    b = jnp.asarray(self.b, jnp.float32)
    positions = jnp.arange(history.shape[1])
    terms = b[positions[None, :], history]  # [rows, L, V]
    terms = jnp.where((positions <= pos)[None, :, None], terms, 0.0)
    logits = mask_pad(a[pos, tokens[:, 0]] + terms.sum(axis=1) + cache['src'])
    return logits, {'history': history, 'src': cache['src'],
                    'cache_index': pos + 1}


def test_running_cache_equals_full_prefix_recomputation():
  # Same tables: the running-sum cache and the re-read token history must
  # give the same search, beam reordering included.
  running = TableModel(seed=5, batch_size=3, max_len=7)
  history = HistoryModel(seed=5, batch_size=3, max_len=7)
  limits = np.array([7, 4, 6], np.int32)
  a = run_beam(running, 5, 0.6, 7, limits)
  b = run_beam(history, 5, 0.6, 7, limits, rows=15)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_allclose(a[1], b[1], rtol=1e-6)


def test_bad_cache_leaf_is_named():
  model = TableModel(seed=0, batch_size=2, max_len=4)
  cache = model.init_cache()
  cache['extra'] = jnp.zeros((5, 2))
  rows = dict(model.cache_rows(), extra=CacheRows.HYPOTHESIS)
  with pytest.raises(ValueError, match=r"\['extra'\].*\(5, 2\)"):
    decoding.beam_search(model.step, cache, 2, 3, 0.6, 4, EOS,
                         cache_rows=rows)


def test_no_retrace_for_same_shapes():
  model = TableModel(seed=6, batch_size=2, max_len=6)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def search(cache, limits):
    return decoding.beam_search(model.step, cache, 2, 3, 0.6, 6, EOS, limits,
                                cache_rows=model.cache_rows())

  first = search(model.init_cache(), jnp.array([6, 4], jnp.int32))
  second = search(model.init_cache(), jnp.array([3, 6], jnp.int32))
  assert np.all(np.asarray(second[0])[0, :, 3:] == 0)
  assert not np.array_equal(np.asarray(first[0]), np.asarray(second[0]))


# ------------------------------------------------ with the real Transformer


def _random_params(shapes, seed):
  """Random parameters from NumPy: no compilation of the initialisers.

  Larger than the initialisers' (unit-variance embeddings, untied output
  projection) so that a random model emits varied tokens, not one token
  repeated, and here also an EOS.
  """
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    name = getattr(path[-1], 'key', '')
    x = rng.normal(size=shape.shape)
    if name == 'scale':
      x = 1.0 + 0.1 * x
    elif 'bias' in name:
      x = 0.1 * x
    elif name != 'embedding':
      x = x / np.sqrt(shape.shape[0])
    return x.astype(shape.dtype)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


@pytest.fixture(scope='module')
def tiny_transformer():
  # One layer per side keeps the compilations short.
  model_config = transformer.TransformerConfig.from_config(
      base.get_config('tiny'), deterministic=True, share_embeddings=False,
      position_encoding='learned', num_encoder_layers=1,
      num_decoder_layers=1)
  model = transformer.Transformer(model_config)
  inputs = np.array([[5, 6, 7, 8, 9, 1], [9, 10, 1, 0, 0, 0],
                     [3, 1, 0, 0, 0, 0]], np.int32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), inputs,
                          np.ones((3, 4), np.int32))['params']
  return model_config, model, _random_params(shapes, seed=2), inputs


def test_translate_greedy_equals_full_model_on_growing_prefix(
    tiny_transformer):
  model_config, model, params, inputs = tiny_transformer
  extra = 4
  out = np.asarray(batch_search.translate_batch(
      model_config, params, inputs, beam_size=1, alpha=0.6,
      max_decode_extra=extra, eos_id=EOS))
  assert out.shape == (3, 16)  # longest limit 6 + 4, rounded up to 8

  @jax.jit
  def full_logits(source, prefix):
    # One sentence per row, with segment ids: a generated 0 inside the
    # prefix is then a token, not padding, as in the cached decoder.
    return model.apply({'params': params}, source, prefix,
                       inputs_segmentation=(source > 0).astype(jnp.int32),
                       targets_segmentation=jnp.ones_like(prefix))

  for b in range(3):
    limit = int((inputs[b] > 0).sum()) + extra
    seq = []
    while len(seq) < limit:
      prefix = np.array([seq + [2] * (16 - len(seq))], np.int32)  # [1, 16]
      logits = full_logits(inputs[b:b + 1], prefix)  # [1, T, V]
      seq.append(int(np.argmax(logits[0, len(seq)])))
      if seq[-1] == EOS:
        break
    np.testing.assert_array_equal(out[b], seq + [0] * (16 - len(seq)))


def test_translate_beam_search_compiles_once_per_shape(tiny_transformer):
  model_config, _, params, inputs = tiny_transformer
  kwargs = dict(beam_size=3, alpha=0.6, max_decode_extra=4, eos_id=EOS)
  first = np.asarray(batch_search.translate_batch(model_config, params, inputs,
                                        **kwargs))
  # The second call (same shapes, same longest source) compiles nothing,
  # whatever other tests compiled before with the same search function.
  search = batch_search.translate_fn(model_config, SearchSettings(beam_size=3),
                                     EOS)
  compiled = search._cache_size()
  other = inputs[::-1].copy()
  second = np.asarray(batch_search.translate_batch(model_config, params, other,
                                         **kwargs))
  assert search._cache_size() == compiled >= 1
  np.testing.assert_array_equal(first, second[::-1])
  for b, tokens in enumerate(first):
    seq = hypothesis(tokens)
    assert len(seq) <= (inputs[b] > 0).sum() + 4
    assert EOS not in seq[:-1]


def test_sentence_leaves_are_repeated_per_beam_but_never_gathered():
  # SENTENCE leaves given per sentence are repeated per beam.
  batch, beam = 2, 3
  cache = {'layer': {'source_key': jnp.arange(batch * 4).reshape(batch, 4),
                     'cached_key': jnp.arange(batch * beam * 2).reshape(
                         batch * beam, 2),
                     'cache_index': jnp.array(3, jnp.int32)}}
  kinds = {'layer': {'source_key': CacheRows.SENTENCE,
                     'cached_key': CacheRows.HYPOTHESIS,
                     'cache_index': CacheRows.SHARED}}
  expanded = cache_rows._expand_cache(cache, kinds, batch, beam)
  np.testing.assert_array_equal(
      expanded['layer']['source_key'],
      np.repeat(np.arange(batch * 4).reshape(batch, 4), beam, axis=0))
  parents = jnp.array([[2, 2, 0], [0, 2, 1]])  # within each sentence
  first = cache_rows._first_rows(batch, beam)
  _, moved = cache_rows._move_rows(expanded, kinds, first, parents,
                                 jnp.ones((batch, beam), bool))
  assert moved['layer']['source_key'] is expanded['layer']['source_key']
  assert int(moved['layer']['cache_index']) == 3
  # ONE_PER_SENTENCE: kept at one row per sentence, never copied.
  kinds['layer']['source_key'] = CacheRows.ONE_PER_SENTENCE
  expanded = cache_rows._expand_cache(cache, kinds, batch, beam)
  assert expanded['layer']['source_key'] is cache['layer']['source_key']
  _, moved = cache_rows._move_rows(expanded, kinds, first, parents,
                                 jnp.ones((batch, beam), bool))
  assert moved['layer']['source_key'] is cache['layer']['source_key']
  cache['layer']['source_key'] = jnp.zeros((batch * beam, 4))
  with pytest.raises(ValueError, match=r"source_key.*batch_size = 2"):
    cache_rows._expand_cache(cache, kinds, batch, beam)


@pytest.mark.parametrize('beam', [4, 40])
def test_rows_in_place_hold_each_hypothesis_parents_row(beam):
  # Hypotheses keep their rows; a new one's row must hold its parent's
  # (NumPy: the old cache row of the parent's row), for every hypothesis
  # alive, with as few copies as a parent's children beyond its first.
  rng = np.random.default_rng(beam)
  batch, steps = 3, 6
  rows = cache_rows._first_rows(batch, beam)
  cache = {'h': jnp.asarray(rng.normal(size=(batch * beam, 2, 3)),
                            jnp.float32)}
  kinds = {'h': CacheRows.HYPOTHESIS}
  move = jax.jit(lambda cache, rows, parent, needed: cache_rows._move_rows(
      cache, kinds, rows, parent, needed))
  for _ in range(steps):
    parent = rng.choice(rng.integers(0, beam, 2), size=(batch, beam))
    needed = rng.random((batch, beam)) < 0.8
    old, old_rows = np.asarray(cache['h']), np.asarray(rows)
    rows, cache = move(cache, rows, jnp.asarray(parent),
                       jnp.asarray(needed))
    new, new_rows = np.asarray(cache['h']), np.asarray(rows)
    for b in range(batch):
      assert sorted(new_rows[b]) == list(range(beam))  # a permutation
      for k in np.flatnonzero(needed[b]):
        np.testing.assert_array_equal(
            new[b * beam + new_rows[b, k]],
            old[b * beam + old_rows[b, parent[b, k]]])
      moved = sum(not np.array_equal(new[b * beam + r], old[b * beam + r])
                  for r in range(beam))
      assert moved <= needed[b].sum() - len(set(parent[b][needed[b]]))
    # Rows of no needed hypothesis may hold anything: scramble them.
    free = np.ones((batch, beam), bool)
    for b, k in zip(*np.nonzero(needed)):
      free[b, new_rows[b, k]] = False
    cache = {'h': jnp.where(free.reshape(-1)[:, None, None], -7.0,
                            cache['h'])}


def test_transformer_caches_cross_attention_as_sentence_leaves(
    tiny_transformer):
  model_config, _, params, inputs = tiny_transformer
  model = transformer.Transformer(model_config.replace(decode=True))
  _, cache, _ = model_cache._model_fns(model, params, jnp.asarray(inputs), 2, 8)
  names = {jax.tree_util.keystr(path)
           for path, _ in jax.tree_util.tree_flatten_with_path(cache)[0]}
  source = {n for n in names if "'source_" in n}
  assert source and all('cross_attention' in n for n in source)
  assert not any('cross_attention' in n and 'cached_' in n for n in names)
  assert any('self_attention' in n and 'cached_key' in n for n in names)
  kinds = {jax.tree_util.keystr(path): kind for path, kind in
           jax.tree_util.tree_flatten_with_path(
               model_cache.cache_rows(cache))[0]}
  # The search's per-sentence inputs (encoder output, source ids) beside
  # the decoder's cache, so that the step function takes any batch.
  assert {n for n, k in kinds.items() if k is CacheRows.ONE_PER_SENTENCE
         } == source | {"['encoded']", "['inputs']"}
  assert cache['encoded'].shape[0] == cache['inputs'].shape[0] == 3
  assert all(kinds[n] is CacheRows.HYPOTHESIS for n in names
             if 'cached_' in n)
  # Encoder-decoder keys and values once per sentence (3), the
  # self-attention cache once per hypothesis (3 sentences x beam 2).
  rows = {jax.tree_util.keystr(path): x.shape[0] for path, x in
          jax.tree_util.tree_flatten_with_path(cache)[0] if x.ndim}
  assert {rows[n] for n in source} == {3}
  assert {r for n, r in rows.items() if 'cached_' in n} == {6}
  with pytest.raises(ValueError, match='new_variable'):
    model_cache.cache_rows({'layer': {'new_variable': jnp.zeros((2,))}})


class GrowingHistoryModel(HistoryModel):
  """HistoryModel whose token history has one column per output position of
  the search's current stage: a cache that grows between stages."""

  def init_cache(self, rows=None, length=None):
    cache = super().init_cache(rows)
    cache['history'] = cache['history'][:, :length]
    return cache

  def step(self, tokens, cache, record=False):
    # EOS made unlikely, so that hypotheses run past the first stages.
    logits, cache = super().step(tokens, cache, record)
    return logits.at[:, EOS].add(-3.0), cache

  def grow_cache(self, cache, length):
    history = cache['history']
    return dict(cache, history=jnp.pad(
        history, ((0, 0), (0, length - history.shape[1]))))


@pytest.mark.parametrize('beam', [1, 3])
def test_staged_search_equals_one_stage(beam):
  model = GrowingHistoryModel(seed=11, batch_size=4, max_len=9)
  limits = np.array([9, 5, 7, 3], np.int32)
  one = run_beam(model, beam, 0.6, 9, limits)
  longest = max(len(hypothesis(t)) for t in one[0][:, 0])
  assert longest > 2  # the searches below need their later stages
  for stages in [(1,), (2, 5), (4,), (8,)]:
    fn = jax.jit(lambda cache, max_lengths, stages=stages:
                 decoding.beam_search(
                     model.step, cache, model.batch_size, beam, 0.6, 9, EOS,
                     max_lengths, stage_lengths=stages,
                     grow_cache=model.grow_cache,
                     cache_rows=model.cache_rows()))
    tokens, scores = fn(model.init_cache(length=stages[0]), limits)
    np.testing.assert_array_equal(np.asarray(tokens), one[0])
    np.testing.assert_allclose(np.asarray(scores), one[1], rtol=1e-6)
  # Every sentence ends within the first stage: the search stops there (the
  # later stage and its cache are skipped) and still returns the outputs of
  # one stage, padded to the full length.
  short = np.array([4, 2, 3, 4], np.int32)
  one = run_beam(model, beam, 0.6, 9, short)
  positions, grown = [], []

  def step(tokens, cache):
    jax.debug.callback(lambda p: positions.append(int(p)),
                       cache['cache_index'])
    return model.step(tokens, cache)

  def grow_cache(cache, length):
    jax.debug.callback(lambda: grown.append(length))
    return model.grow_cache(cache, length)

  tokens, scores = jax.jit(lambda cache: decoding.beam_search(
      step, cache, model.batch_size, beam, 0.6, 9, EOS, short,
      stage_lengths=(4,), grow_cache=grow_cache,
      cache_rows=model.cache_rows()))(model.init_cache(length=4))
  jax.effects_barrier()
  assert positions and max(positions) < 4 and grown == []
  assert tokens.shape[-1] == 9
  np.testing.assert_array_equal(np.asarray(tokens), one[0])
  np.testing.assert_allclose(np.asarray(scores), one[1], rtol=1e-6)


def test_stages_without_grow_cache_are_refused():
  model = GrowingHistoryModel(seed=0, batch_size=2, max_len=4)
  with pytest.raises(ValueError, match='grow_cache'):
    decoding.beam_search(model.step, model.init_cache(length=2), 2, 2, 0.6,
                         4, EOS, stage_lengths=(2,))


@pytest.mark.parametrize('beam', [1, 3])
def test_translate_in_two_stages_equals_one_stage(tiny_transformer, beam):
  model_config, _, params, inputs = tiny_transformer
  kwargs = dict(beam_size=beam, alpha=0.6, max_decode_extra=12, eos_id=EOS)
  one = np.asarray(batch_search.translate_batch(model_config, params, inputs,
                                      first_stage_extra=None, **kwargs))
  lengths = [len(hypothesis(t)) for t in one]
  assert max(lengths) > inputs.shape[1] + 1  # past the first stage below
  two = np.asarray(batch_search.translate_batch(model_config, params, inputs,
                                      first_stage_extra=1, **kwargs))
  np.testing.assert_array_equal(two, one)


def test_translate_beam_batch_equals_one_sentence_at_a_time(tiny_transformer):
  # The encoder-decoder keys and values are cached once per sentence and
  # attended to from the sentence's beam rows: a batch must give each
  # sentence the search it gets alone (a row mix-up would not).
  model_config, _, params, inputs = tiny_transformer
  kwargs = dict(beam_size=3, alpha=0.6, max_decode_extra=6, eos_id=EOS,
                max_decode_len=16)
  batch = np.asarray(batch_search.translate_batch(model_config, params, inputs,
                                               **kwargs))
  assert len({hypothesis(t) for t in batch}) == 3
  for b in range(3):
    alone = batch_search.translate_batch(model_config, params, inputs[b:b + 1],
                                      **kwargs)
    np.testing.assert_array_equal(np.asarray(alone)[0], batch[b])


def test_the_names_callers_use_reach_the_moved_code():
  """Since the search's split by concern, `mha.decoding` (the old path) is
  still mha.search.decoding with the searches' public names, and
  `mha.search.batches` still gives the Transformer's cache contract, now
  at home in `mha.search.model_cache`."""
  # pylint: disable=import-outside-toplevel,protected-access
  import mha.batch_search
  import mha.decoding
  assert mha.decoding is decoding and mha.batch_search is batch_search
  public = {'beam_search', 'greedy_search', 'sample', 'forced_log_probs',
            'CacheRows', 'length_penalty', 'StepHook'}
  assert public <= set(decoding.__all__)
  assert all(hasattr(decoding, name) for name in decoding.__all__)
  assert decoding.CacheRows is CacheRows is cache_rows.CacheRows
  for name in ('CACHE_ROWS', 'cache_rows', '_model_fns'):
    assert getattr(batch_search, name) is getattr(model_cache, name)
