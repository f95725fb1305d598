"""n-best lists, sampling and forced scores of the Transformer's translation
layer (`mha.search.texts`), against independent computations: the teacher-forced
full forward pass of the model (no cache), the search's own log-probabilities,
the exact next-token distribution, and the outputs on one device."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha.search import batches as batch_search

from test_decoding import EOS, hypothesis, lp
from test_decoding import tiny_transformer  # noqa: F401  pylint: disable=unused-import


def full_log_probs(model, params, inputs, targets):
  """log_softmax of the full forward pass (no cache), teacher-forced:
  [batch, T, V]. Segment ids make a 0 inside a target a token, as in the
  cached decoder."""

  @jax.jit
  def forward(params, inputs, targets):
    logits = model.apply({'params': params}, inputs, targets,
                         inputs_segmentation=(inputs > 0).astype(jnp.int32),
                         targets_segmentation=jnp.ones_like(targets))
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

  return forward(params, inputs, targets)


def test_forced_scores_equal_the_full_forward_pass(
    tiny_transformer):  # noqa: F811
  model_config, model, params, inputs = tiny_transformer
  rng = np.random.default_rng(0)
  targets = rng.integers(2, model_config.vocab_size, size=(3, 8)).astype(
      np.int32)
  targets[0, 5], targets[0, 6:] = EOS, 0  # ends with EOS, then padding
  targets[1, 2:] = 0  # ends without EOS
  got = np.asarray(batch_search.score_batch(model_config, params, inputs,
                                         targets))
  full = np.asarray(full_log_probs(model, params, inputs,
                                   np.where(targets > 0, targets, 2)))
  for b in range(3):
    n = len(hypothesis(targets[b]))
    want = full[b, np.arange(n), targets[b, :n]]
    np.testing.assert_allclose(got[b, :n], want, rtol=2e-5, atol=2e-5)
    assert np.all(got[b, n:] == 0)


def test_nbest_is_the_searchs_hypotheses_with_their_log_probs(
    tiny_transformer):  # noqa: F811
  model_config, _, params, inputs = tiny_transformer
  kwargs = dict(alpha=0.6, max_decode_extra=5, eos_id=EOS, max_decode_len=16)
  best = np.asarray(batch_search.translate_batch(model_config, params, inputs,
                                              beam_size=3, **kwargs))
  # (num_best = n exact for every n <= beam: test_decoding_outputs.py.)
  tokens, scores, log_probs = [np.asarray(x) for x in
                               batch_search.translate_batch(
                                   model_config, params, inputs,
                                   beam_size=3, num_best=3, **kwargs)]
  assert tokens.shape == (3, 3, 16)
  # The first of the n best: today's translation.
  np.testing.assert_array_equal(tokens[:, 0], best)
  assert np.all(np.diff(scores, axis=1) <= 0)
  assert len({hypothesis(t) for t in tokens.reshape(9, 16)}) == 9
  # The search's log P(Y | X) of each hypothesis is its forced score.
  forced = np.asarray(batch_search.score_batch(
      model_config, params, np.repeat(inputs, 3, axis=0),
      tokens.reshape(9, 16))).sum(axis=1).reshape(3, 3)
  np.testing.assert_allclose(forced, log_probs, rtol=1e-5, atol=1e-5)
  lengths = np.array([[len(hypothesis(t)) for t in row] for row in tokens])
  np.testing.assert_allclose(scores, log_probs / lp(lengths, 0.6), rtol=1e-5)
  with pytest.raises(ValueError, match='num_best'):
    batch_search.translate_batch(model_config, params, inputs, beam_size=3,
                              num_best=4, **kwargs)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_row_of_padding_alone_ends_at_once_beside_the_same_outputs(
    tiny_transformer, beam_size):  # noqa: F811
  # A batch's spare rows (texts.make_batches fills the last batch up to a
  # full one's rows) have no source token: one output position, not the
  # search's steps up to max_decode_extra; the sentences beside them are
  # translated as without them.
  model_config, _, params, inputs = tiny_transformer
  kwargs = dict(beam_size=beam_size, alpha=0.6, max_decode_extra=5,
                eos_id=EOS, max_decode_len=16)
  alone = np.asarray(batch_search.translate_batch(model_config, params,
                                                  inputs, **kwargs))
  padded = np.concatenate([inputs, np.zeros_like(inputs[:1])])
  out = np.asarray(batch_search.translate_batch(model_config, params, padded,
                                                **kwargs))
  np.testing.assert_array_equal(out[:3], alone)
  assert len(hypothesis(out[3])) <= 1 and not out[3, 1:].any()
  assert min(len(hypothesis(row)) for row in alone) > 1


def test_sampled_first_tokens_follow_softmax_over_top_k(
    tiny_transformer):  # noqa: F811
  model_config, model, params, inputs = tiny_transformer
  n, temperature, top_k = 2048, 0.8, 5
  batch = np.repeat(inputs[:1], n, axis=0)  # one sentence, n keys
  tokens, _ = batch_search.sample_batch(
      model_config, params, batch, np.arange(n), temperature=temperature,
      top_k=top_k, seed=7, max_decode_extra=0, eos_id=EOS, max_decode_len=1)
  first = np.asarray(tokens)[:, 0]
  logits = np.asarray(full_log_probs(model, params, inputs[:1],
                                     np.ones((1, 1), np.int32)))[0, 0].copy()
  logits[0] = -np.inf  # the pad id is never drawn
  top = np.argsort(-logits)[:top_k]
  p = np.exp((logits[top] - logits[top].max()) / temperature)
  p /= p.sum()
  assert set(first) <= set(top)
  for token, prob in zip(top, p):
    sigma = np.sqrt(n * prob * (1 - prob))
    assert abs(np.sum(first == token) - n * prob) <= 5 * sigma + 1


def test_sampling_on_four_devices_equals_one_and_scores_itself(
    tiny_transformer):  # noqa: F811
  model_config, _, params, inputs = tiny_transformer
  batch = np.concatenate([inputs, inputs[::-1], inputs, inputs[:1]])  # 10
  batch = np.concatenate([batch, np.zeros((2, batch.shape[1]), np.int32)])
  ids = np.arange(12) + 100
  kwargs = dict(temperature=1.0, top_k=0, seed=3, max_decode_extra=6,
                eos_id=EOS, max_decode_len=16)
  devices = jax.local_devices()
  four = batch_search.sample_batch(model_config, params, batch, ids,
                                devices=devices, **kwargs)
  assert four[0].sharding.device_set == set(devices)
  one = batch_search.sample_batch(model_config, params, batch, ids,
                               devices=devices[:1], **kwargs)
  # The same tokens; their log-probabilities to rounding (3 rows of a
  # device against 12: XLA:CPU's products may round differently).
  np.testing.assert_array_equal(np.asarray(four[0]), np.asarray(one[0]))
  np.testing.assert_allclose(np.asarray(four[1]), np.asarray(one[1]),
                             rtol=1e-6)
  tokens, log_probs = [np.asarray(x) for x in one]
  assert len({hypothesis(t) for t in tokens[:10]}) > 5
  forced = np.asarray(batch_search.score_batch(model_config, params, batch,
                                            tokens))
  np.testing.assert_allclose(forced.sum(axis=1)[:10], log_probs[:10],
                             rtol=1e-5, atol=1e-5)
  # The same ids in other rows (the batch reordered): the same samples.
  order = np.random.default_rng(0).permutation(12)
  again = batch_search.sample_batch(model_config, params, batch[order],
                                 ids[order], devices=devices[:1], **kwargs)
  np.testing.assert_array_equal(np.asarray(again[0]), tokens[order])
  # (Temperature 0 = greedy search: test_decoding_outputs.py.)
