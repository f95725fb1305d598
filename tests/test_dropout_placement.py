"""Dropout where the paper puts it (§5.4), observed in training mode.

The model runs with dropout on; every Bernoulli mask it draws is recorded
(`mha.model.dropout.keep_mask` is wrapped, the one source of masks for the
residual, embedding and attention-weight dropouts) and the same masks, in the
same order, are applied by the hand-written Transformer of
`paper_reference.py` at the paper's places:

* on each sublayer's output before the residual add: LayerNorm(x +
  Dropout(Sublayer(x))), 2 per encoder layer and 3 per decoder layer;
* on the sums of embeddings and positional encodings, encoder and decoder;
* on the attention weights after the softmax, when attention_dropout_rate > 0.

The training-mode logits must equal the hand composition. One-line changes
that this catches (tests/README.md): no residual dropout, dropout after the
add, no dropout on the embedding sums or dropout before the positions are
added, attention dropout dropped or taken from P_drop, the wrong rate. As
the whole model is composed by hand, it also catches a change of the
√d_model scale, the sinusoids, 1/√d_k, the -inf masks, the causal mask, the
shift right, ReLU, the LayerNorm placement or the shared embeddings.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha
from configs import base
from mha.model import dropout
import paper_reference as ref

P_DROP = 0.3
NUM_LAYERS = 1
SRC = np.array([[5, 6, 7, 8, 9, 1], [9, 10, 1, 0, 0, 0],
                [3, 4, 11, 1, 0, 0]], np.int32)
TGT = np.array([[11, 12, 13, 1, 0], [14, 15, 16, 17, 1],
                [2, 1, 0, 0, 0]], np.int32)


def _config(**changes):
  config = base.get_config("tiny")
  config.update(vocab_size=24, num_layers=NUM_LAYERS, d_model=16, d_ff=32,
                num_heads=2, d_k=4, d_v=6, dropout_rate=P_DROP,
                attention_dropout_rate=0.0)
  config.update(changes)
  return config


class RecordedMasks:
  """The masks drawn by `mha.model.dropout.keep_mask`, replayed in order."""

  def __init__(self, records, rates):
    self.records = list(records)
    self.rates = rates  # kind -> the paper's dropout rate for that place

  def __call__(self, x, kind):
    rate = self.rates[kind]
    if rate == 0.0:
      return x
    assert self.records, f"the model drew no mask for this {kind} dropout"
    keep = self.records.pop(0)
    assert keep.shape == x.shape, (kind, keep.shape, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)  # inverted dropout


def _training_logits_and_masks(config, params, monkeypatch, seed=0):
  """Training-mode logits and the masks drawn, in order (one jit)."""
  drawn = []
  keep_mask = dropout.keep_mask

  def recording(key, keep_prob, shape):
    keep = keep_mask(key, keep_prob, shape)
    drawn.append(keep)
    return keep

  model = mha.create_model(config)

  @jax.jit
  def run(params):
    drawn.clear()
    out = model.apply({"params": params}, SRC, TGT,
                      rngs={"dropout": jax.random.key(seed)})
    return out, list(drawn)

  monkeypatch.setattr(dropout, "keep_mask", recording)
  out, masks = run(params)
  monkeypatch.setattr(dropout, "keep_mask", keep_mask)
  return np.asarray(out), [np.asarray(m) for m in masks]


def _hand_logits(params, masks, rates):
  """paper_reference.logits with the recorded masks (jitted)."""
  def run(params, masks):
    replay = RecordedMasks(masks, rates)
    out = ref.logits(params, SRC, TGT, num_layers=NUM_LAYERS, drop=replay)
    assert not replay.records  # every mask applied
    return out
  return np.asarray(jax.jit(run)(params, masks))


def _random_params(config, seed):
  shapes = jax.eval_shape(mha.create_model(config).init, jax.random.key(0),
                          SRC, TGT)["params"]
  return jax.tree.map(jnp.asarray, ref.random_params(shapes, seed))


@pytest.fixture(scope="module")
def params():
  return _random_params(_config(), seed=1)


def test_training_output_applies_dropout_at_the_papers_places(params,
                                                              monkeypatch):
  # Attention dropout on at a rate of its own (0.2, not P_drop 0.3), so a
  # mask applied at the wrong rate or place shows.
  attention_rate = 0.2
  config = _config(attention_dropout_rate=attention_rate)
  out, drawn = _training_logits_and_masks(config, params, monkeypatch)
  # 2 embedding sums, 2 residual dropouts per encoder layer, 3 per decoder
  # layer, and one weight mask per attention layer (1 + 2 per layer pair).
  assert len(drawn) == 2 + 5 * NUM_LAYERS + 3 * NUM_LAYERS
  for keep in drawn:  # real masks at about their rate: not all ones
    rate = 1.0 - keep.mean()
    assert 0.05 < rate < 0.6, rate
  hand = _hand_logits(params, drawn, {"residual": P_DROP,
                                      "embedding": P_DROP,
                                      "attention": attention_rate})
  real = TGT > 0
  np.testing.assert_allclose(out[real], hand[real], atol=2e-4, rtol=1e-4)
