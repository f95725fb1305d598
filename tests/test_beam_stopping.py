"""Beam search's early stop and length penalty (§6.1, Wu et al. 2016).

A correct stopping rule never changes the result: once no live hypothesis
can beat the worst of the `beam` finished ones, running on to the length
limit adds nothing to the finished set. So the search is compared with a
NumPy beam search of the same algorithm that never stops early (it runs
until its sentence's limit or until no live hypothesis is left), on many
small random models, one sentence per search (in a batch the loop runs
until every sentence is done, which hides a sentence stopped too early), and
must return the same hypotheses and scores in every beam slot. A constructed
case shows a rule that stops too early returning a worse translation. Mutations
caught (tests/README.md): the bound `best_live / lp(t + 1)` alone, the best
instead of the worst finished score, lp's 5 or 6 changed, |Y| without its EOS.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha.search import decoding
from mha.search import refill
from mha.search.cache_rows import CacheRows

EOS = 1
VOCAB = 6  # 0 = pad / start (logit -inf), 1 = EOS, 2..5 words
BATCH = 128
MAX_LEN = 30


def lp(length: int, alpha: float) -> float:
  return ((5.0 + length) / 6.0) ** alpha


class RandomModels:
  """One random model per sentence: logits(y_0..y_t) = A[b, t, y_t] + Σ_{j<=t}
  B[b, j, y_j] + eos_bias[b] at EOS (y_0 = 0 the start symbol).

  Each row A[b, t, y] has a random sharpness that depends on the sentence
  and the last token y: some tokens lead to near-certain continuations, so
  a live prefix can run on for many steps at little cost and overtake the
  finished hypotheses through the growing lp(|Y|): the situation the
  stopping bound must get right. The tables are per sentence; the step
  function reads them from `source_` cache leaves (`CacheRows.SENTENCE`:
  repeated per beam, never reordered) and keeps the running sum per row
  (`acc`, `CacheRows.HYPOTHESIS`: reordered with its hypothesis).
  """

  def __init__(self, seed: int):
    rng = np.random.default_rng(seed)
    sharpness = np.exp(rng.uniform(np.log(2.0), np.log(30.0),
                                   size=(BATCH, 1, VOCAB, 1)))
    self.a = rng.normal(size=(BATCH, MAX_LEN, VOCAB, VOCAB)) * sharpness
    self.b = rng.normal(size=(BATCH, MAX_LEN, VOCAB, VOCAB)) * 0.1
    self.eos_bias = rng.uniform(-6.0, 3.0, size=BATCH)

  def init_cache(self, b: int):
    """The cache of a search of sentence b alone."""
    return {'source_a': jnp.asarray(self.a[b:b + 1], jnp.float32),
            'source_b': jnp.asarray(self.b[b:b + 1], jnp.float32),
            'source_eos': jnp.asarray(self.eos_bias[b:b + 1], jnp.float32),
            'acc': jnp.zeros((1, VOCAB), jnp.float32),
            'cache_index': jnp.array(0, jnp.int32)}

  CACHE_ROWS = {'source_a': CacheRows.SENTENCE,
                'source_b': CacheRows.SENTENCE,
                'source_eos': CacheRows.SENTENCE,
                'acc': CacheRows.HYPOTHESIS, 'cache_index': CacheRows.SHARED}

  @staticmethod
  def step(tokens, cache):
    pos = cache['cache_index']
    token = tokens[:, 0]  # [rows]
    rows = jnp.arange(token.shape[0])
    acc = cache['acc'] + cache['source_b'][rows, pos, token]  # [rows, V]
    logits = cache['source_a'][rows, pos, token] + acc
    logits = logits.at[:, EOS].add(cache['source_eos'])
    logits = logits.at[:, 0].set(-jnp.inf)
    return logits, dict(cache, acc=acc, cache_index=pos + 1)

  def log_probs(self, b: int, prefix: tuple[int, ...]) -> np.ndarray:
    """log P(. | prefix) in float64 from the whole prefix."""
    full = (0,) + prefix
    t = len(prefix)
    logits = self.a[b, t, full[t]] + sum(self.b[b, j, y]
                                         for j, y in enumerate(full))
    logits[EOS] += self.eos_bias[b]
    logits[0] = -np.inf
    return logits - np.logaddexp.reduce(logits)


def exhaustive_beam(log_probs, beam: int, alpha: float, limit: int,
                    early_num_best: int | None = None):
  """Beam search without the early stop, in NumPy.

  Each step scores the best 2·beam extensions of the live hypotheses; those
  ending in EOS or at the limit compete for the beam finished slots (score
  log P / lp(|Y|)), the others for the beam live slots. It runs until the
  limit or until no live hypothesis is left. Returns [(score, tokens)] best
  first.

  `early_num_best=n`: the early rule (`stop='early'`) as its words say it:
  after the step that writes the t-th token, stop once the n-th best
  finished score beats the best live prefix's log P / lp(t + 1).
  """
  live = [(0.0, ())]
  finished = []
  for length in range(1, limit + 1):
    candidates = []
    for logprob, seq in live:
      step = log_probs(seq)
      for v in range(1, VOCAB):
        candidates.append((logprob + step[v], seq + (v,)))
    candidates.sort(key=lambda c: -c[0])
    candidates = candidates[:2 * beam]
    ends = [c for c in candidates if c[1][-1] == EOS or length == limit]
    live = [c for c in candidates if not (c[1][-1] == EOS or
                                          length == limit)][:beam]
    finished += [(logprob / lp(length, alpha), seq) for logprob, seq in ends]
    finished = sorted(finished, key=lambda f: -f[0])[:beam]
    if not live:
      break
    n = early_num_best
    if n and len(finished) >= n and (
        finished[n - 1][0] > live[0][0] / lp(length + 1, alpha)):
      break
  return finished


def hypothesis(tokens) -> tuple[int, ...]:
  tokens = [int(t) for t in tokens]
  if EOS in tokens:
    return tuple(tokens[:tokens.index(EOS) + 1])
  while tokens and tokens[-1] == 0:
    tokens.pop()
  return tuple(tokens)


@pytest.mark.parametrize('alpha, beam', [(0.6, 2), (1.0, 3)])
def test_early_stop_returns_what_running_to_the_limit_returns(alpha, beam):
  models = RandomModels(seed=0)
  # Long limits (the paper's is input length + 50): lp(limit) / lp(t + 1)
  # is large, so a wrong bound stops many steps too early.
  limits = np.random.default_rng(1).integers(MAX_LEN // 2, MAX_LEN + 1,
                                             size=BATCH)
  # One sentence per search: in a batch, the loop runs until every sentence
  # is done, and a sentence stopped too early would be searched on anyway.
  search = jax.jit(lambda cache, limit: decoding.beam_search(
      RandomModels.step, cache, 1, beam, alpha, MAX_LEN, EOS, limit,
      cache_rows=RandomModels.CACHE_ROWS))
  longer = 0  # sentences whose best hypothesis is longer than 2 tokens
  for b in range(BATCH):
    tokens, scores = search(models.init_cache(b),
                            jnp.asarray(limits[b:b + 1], jnp.int32))
    tokens, scores = np.asarray(tokens)[0], np.asarray(scores)[0]
    expected = exhaustive_beam(lambda seq: models.log_probs(b, seq), beam,
                               alpha, int(limits[b]))
    got = [hypothesis(t) for t in tokens]
    assert got == [seq for _, seq in expected], b
    np.testing.assert_allclose(scores, [s for s, _ in expected],
                               rtol=1e-5, atol=1e-5, err_msg=str(b))
    longer += len(expected[0][1]) > 2
  assert longer > BATCH // 4  # not a test of one-token outputs


# The constructed case (beam 2, α = 0.6, limit 20; tokens 1 EOS, 2 a, 3 c):
#   first token: EOS 0.39, c 0.41, a 0.20;  after c: EOS (~1);
#   after a: a (~1) until 15 a's are written, then EOS (~1).
# After 2 steps the finished slots hold [EOS] (log 0.39 / lp(1) = -0.942)
# and [c EOS] (log 0.41 / lp(2) = -0.813); the best live prefix is [a a]
# (log 0.2 = -1.609). It can still reach -1.609 / lp(20) = -0.684, so the
# search must go on, and a^15 EOS scores -1.609 / lp(16) = -0.759, the best
# hypothesis. The wrong bound -1.609 / lp(3) = -1.354 < -0.942 stops at
# step 2 with [c EOS].
CHAIN = 15
LIMIT = 20
CERTAIN = -30.0  # logit of the alternatives to a (nearly) certain token


def _constructed_step(tokens, cache):
  pos = cache['cache_index']  # tokens written so far
  last = tokens[:, 0]  # [rows]
  first = jnp.log(jnp.array([1.0, 0.39, 0.20, 0.41]))  # pad, EOS, a, c
  end = jnp.array([0.0, 0.0, CERTAIN, CERTAIN])
  more_a = jnp.array([0.0, CERTAIN, 0.0, CERTAIN])
  after_a = jnp.where(pos < CHAIN, more_a, end)
  logits = jnp.where((last == 3)[:, None], end[None], after_a[None])
  logits = jnp.where(pos == 0, first[None], logits)
  logits = logits.at[:, 0].set(-jnp.inf)  # never the pad token
  return logits, {'cache_index': pos + 1}


def test_stopping_too_early_would_lose_the_best_hypothesis():
  cache = {'cache_index': jnp.array(0, jnp.int32)}
  tokens, scores = jax.jit(lambda c: decoding.beam_search(
      _constructed_step, c, 1, 2, 0.6, LIMIT, EOS))(cache)
  best = hypothesis(np.asarray(tokens)[0, 0])
  assert best == (2,) * CHAIN + (EOS,)
  assert float(scores[0, 0]) == pytest.approx(np.log(0.2) / lp(16, 0.6),
                                              rel=1e-5)
  # The runner-up is [c EOS], the answer of a search stopped at step 2.
  assert hypothesis(np.asarray(tokens)[0, 1]) == (3, EOS)
  assert float(scores[0, 1]) == pytest.approx(np.log(0.41) / lp(2, 0.6),
                                              rel=1e-5)
  assert np.log(0.2) / lp(3, 0.6) < np.log(0.39) / lp(1, 0.6)  # the trap


def test_length_penalty_golden_values():
  # lp(Y) = ((5 + |Y|) / 6)^α, by hand: (6/6)^0.6 = 1, (9/6)^0.6 = 1.5^0.6,
  # (11/6)^0.6, (7/6)^1 and α = 0 gives 1.
  assert float(decoding.length_penalty(1, 0.6)) == pytest.approx(1.0)
  assert float(decoding.length_penalty(4, 0.6)) == pytest.approx(
      1.2754245, rel=1e-6)
  assert float(decoding.length_penalty(6, 0.6)) == pytest.approx(
      1.4386159, rel=1e-6)
  assert float(decoding.length_penalty(2, 1.0)) == pytest.approx(7 / 6)
  assert float(decoding.length_penalty(30, 0.0)) == 1.0


@pytest.mark.parametrize('alpha, beam', [(0.6, 3), (1.0, 4)])
def test_num_best_one_returns_the_full_searchs_best_in_fewer_steps(alpha,
                                                                   beam):
  """num_best=1 (what a translation reads): the best hypothesis and score
  of every sentence are those of the full search (bit for bit), which
  matches the NumPy search that never stops early; the search takes fewer
  steps on some sentences (the step function's calls are counted)."""
  models = RandomModels(seed=2)
  limits = np.random.default_rng(3).integers(MAX_LEN // 2, MAX_LEN + 1,
                                             size=BATCH)
  calls = []

  def counted(tokens, cache):
    jax.debug.callback(lambda: calls.append(1))
    return RandomModels.step(tokens, cache)

  def search(num_best):
    return jax.jit(lambda cache, limit: decoding.beam_search(
        counted, cache, 1, beam, alpha, MAX_LEN, EOS, limit,
        cache_rows=RandomModels.CACHE_ROWS, num_best=num_best))

  full, best = search(None), search(1)
  fewer = 0
  for b in range(0, BATCH, 2):
    cache = models.init_cache(b)
    limit = jnp.asarray(limits[b:b + 1], jnp.int32)
    calls.clear()
    full_tokens, full_scores = jax.block_until_ready(full(cache, limit))
    full_steps = len(calls)
    calls.clear()
    best_tokens, best_scores = jax.block_until_ready(best(cache, limit))
    fewer += len(calls) < full_steps
    assert len(calls) <= full_steps
    np.testing.assert_array_equal(np.asarray(best_tokens)[0, 0],
                                  np.asarray(full_tokens)[0, 0])
    assert float(best_scores[0, 0]) == float(full_scores[0, 0])
    expected = exhaustive_beam(lambda seq: models.log_probs(b, seq), beam,
                               alpha, int(limits[b]))
    assert hypothesis(np.asarray(best_tokens)[0, 0]) == expected[0][1], b
  assert fewer > BATCH // 8


@pytest.mark.parametrize('alpha, beam, num_best', [(0.6, 3, 1), (1.0, 2, 2)])
def test_the_early_rule_stops_where_its_words_say(alpha, beam, num_best):
  """stop='early' on a batch of sentences in one search: each sentence's
  num_best best are those of the NumPy search with the early rule, alone
  (so a done sentence's search ended there, whatever the others did),
  and differ from the exact rule's on some sentences (the trap below, met
  by chance)."""
  models = RandomModels(seed=4)
  limits = np.random.default_rng(5).integers(MAX_LEN // 2, MAX_LEN + 1,
                                             size=BATCH)
  # 32 sentences, two of which (70 and 84) the two rules end differently
  # with alpha 0.6 (a few percent of sentences, as on Multi30k).
  chosen = slice(64, 96)
  sentences = 32
  cache = {'source_a': jnp.asarray(models.a[chosen], jnp.float32),
           'source_b': jnp.asarray(models.b[chosen], jnp.float32),
           'source_eos': jnp.asarray(models.eos_bias[chosen], jnp.float32),
           'acc': jnp.zeros((sentences, VOCAB), jnp.float32),
           'cache_index': jnp.array(0, jnp.int32)}
  limits = limits[chosen]
  tokens, scores = jax.jit(lambda cache: decoding.beam_search(
      RandomModels.step, cache, sentences, beam, alpha, MAX_LEN, EOS,
      jnp.asarray(limits, jnp.int32),
      cache_rows=RandomModels.CACHE_ROWS, num_best=num_best,
      stop='early'))(cache)
  tokens, scores = np.asarray(tokens), np.asarray(scores)
  differ = 0
  for b in range(sentences):
    log_probs = lambda seq, b=b: models.log_probs(64 + b, seq)
    expected = exhaustive_beam(log_probs, beam, alpha, int(limits[b]),
                               early_num_best=num_best)[:num_best]
    assert [hypothesis(t) for t in tokens[b, :num_best]] == [
        seq for _, seq in expected], b
    np.testing.assert_allclose(scores[b, :num_best],
                               [s for s, _ in expected], rtol=1e-5,
                               atol=1e-5, err_msg=str(b))
    exact = exhaustive_beam(log_probs, beam, alpha, int(limits[b]))
    differ += [seq for _, seq in exact[:num_best]] != [
        seq for _, seq in expected]
  assert differ > 0


def test_the_early_rule_falls_into_the_trap_and_equals_exact_at_alpha_0():
  cache = {'cache_index': jnp.array(0, jnp.int32)}

  def search(alpha, stop):
    tokens, scores = jax.jit(lambda c: decoding.beam_search(
        _constructed_step, c, 1, 2, alpha, LIMIT, EOS, stop=stop))(cache)
    return hypothesis(np.asarray(tokens)[0, 0]), float(scores[0, 0])

  # After 2 steps the best live prefix [a a] would score -1.609 / lp(3) if
  # it ended next: below [EOS]'s -0.942, so the early rule stops there,
  # with [c EOS] and without the best hypothesis a^15 EOS.
  assert search(0.6, 'early') == ((3, EOS), pytest.approx(
      np.log(0.41) / lp(2, 0.6), rel=1e-5))
  assert search(0.6, 'exact')[0] == (2,) * CHAIN + (EOS,)
  # Without a length penalty the two bounds are one.
  assert search(0.0, 'early') == search(0.0, 'exact')
  with pytest.raises(ValueError, match="stop must be one of exact, early, "
                     "got 'fast'"):
    search(0.6, 'fast')


class RefilledModels:
  """RandomModels' sentences for `beam_refill`: each slot's sentence id
  stored once per slot (`CacheRows.ONE_PER_SENTENCE`), its position per
  row (`SHARED` among a slot's rows, never reordered), the running sum
  per hypothesis; a slot that starts a sentence starts at position 0 with
  a zero sum."""

  def __init__(self, models: RandomModels, beam: int):
    self.beam = beam
    self.a = jnp.asarray(models.a, jnp.float32)
    self.b = jnp.asarray(models.b, jnp.float32)
    self.eos = jnp.asarray(models.eos_bias, jnp.float32)

  CACHE_ROWS = {'sentence': CacheRows.ONE_PER_SENTENCE,
                'pos': CacheRows.SHARED, 'acc': CacheRows.HYPOTHESIS}

  def init_cache(self, slots: int):
    return {'sentence': jnp.arange(slots, dtype=jnp.int32),
            'pos': jnp.zeros((slots * self.beam,), jnp.int32),
            'acc': jnp.zeros((slots * self.beam, VOCAB), jnp.float32)}

  def step(self, tokens, cache):
    sentence = jnp.repeat(cache['sentence'], self.beam)
    pos, token = cache['pos'], tokens[:, 0]
    acc = cache['acc'] + self.b[sentence, pos, token]
    logits = self.a[sentence, pos, token] + acc
    logits = logits.at[:, EOS].add(self.eos[sentence])
    logits = logits.at[:, 0].set(-jnp.inf)
    return logits, dict(cache, acc=acc, pos=pos + 1)

  def start_rows(self, cache, start, sentence):
    rows = jnp.repeat(start, self.beam)
    return {'sentence': jnp.where(start, sentence, cache['sentence']),
            'pos': jnp.where(rows, 0, cache['pos']),
            'acc': jnp.where(rows[:, None], 0.0, cache['acc'])}


@pytest.mark.parametrize('stop', ['exact', 'early'])
def test_a_refilled_search_stops_each_sentence_by_its_rule(stop):
  """`beam_refill`, 8 slots for 96 sentences: each sentence's best is the
  NumPy search's with the same rule, alone."""
  alpha, beam, sentences = 0.6, 3, 96
  models = RandomModels(seed=4)
  limits = np.random.default_rng(5).integers(MAX_LEN // 2, MAX_LEN + 1,
                                             size=BATCH)[:sentences]
  refilled = RefilledModels(models, beam)
  tokens, scores, _ = jax.jit(lambda cache: refill.beam_refill(
      refilled.step, cache, refilled.start_rows, 8, beam, alpha, MAX_LEN,
      EOS, jnp.asarray(limits, jnp.int32), RefilledModels.CACHE_ROWS,
      stop=stop))(refilled.init_cache(8))
  for b in range(sentences):
    expected = exhaustive_beam(
        lambda seq, b=b: models.log_probs(b, seq), beam, alpha,
        int(limits[b]), early_num_best=1 if stop == 'early' else None)[0]
    assert hypothesis(np.asarray(tokens)[b]) == expected[1], b
    assert float(scores[b]) == pytest.approx(expected[0], rel=1e-5,
                                             abs=1e-5), b
