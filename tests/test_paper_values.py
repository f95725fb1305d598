"""The paper's numbers, written here from the paper, against the configs.

Table 3 of Vaswani et al. (2017) and the text of §5-§6 are copied into this
file by hand (not read from configs/): the base and big models, every row
A1-A4, B1-B2, C1-C7, D1-D4 and E as `configs/base.py:<row>`, the training
recipe (§5.3: warmup 4000, Adam β1 0.9, β2 0.98, ε 1e-9; 100k / 300k steps;
§5.1 batches of about 25000 source and target tokens, a shared vocabulary
of about 37000 tokens) and decoding (§6.1: beam 4, α 0.6, output at most
input + 50; the last 5 / 20 checkpoints averaged). Adam's constants are also
observed in the updates the optimizer makes, and the exact parameter count
of the built model is pinned by a formula written from the paper's shapes
(`paper_reference.param_count`).
"""
import json

import jax.numpy as jnp
import numpy as np
import pytest

import mha
import paper_reference as ref
from configs import base
from configs import big
from scripts import table3 as script

# Table 3: N, d_model, d_ff, h, d_k, d_v, P_drop, ε_ls, train steps; and the
# position encoding (row E). Blank cells of the paper repeat the base row.
BASE = dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, d_k=64,
            d_v=64, dropout_rate=0.1, label_smoothing=0.1,
            num_train_steps=100_000, position_encoding="sinusoidal")
BIG = dict(BASE, d_model=1024, d_ff=4096, num_heads=16, d_k=64, d_v=64,
           dropout_rate=0.3, num_train_steps=300_000)
TABLE3 = {
    "A1": dict(num_heads=1, d_k=512, d_v=512),
    "A2": dict(num_heads=4, d_k=128, d_v=128),
    "A3": dict(num_heads=16, d_k=32, d_v=32),
    "A4": dict(num_heads=32, d_k=16, d_v=16),
    "B1": dict(d_k=16),
    "B2": dict(d_k=32),
    "C1": dict(num_layers=2),
    "C2": dict(num_layers=4),
    "C3": dict(num_layers=8),
    "C4": dict(d_model=256, d_k=32, d_v=32),
    "C5": dict(d_model=1024, d_k=128, d_v=128),
    "C6": dict(d_ff=1024),
    "C7": dict(d_ff=4096),
    "D1": dict(dropout_rate=0.0),
    "D2": dict(dropout_rate=0.2),
    "D3": dict(label_smoothing=0.0),
    "D4": dict(label_smoothing=0.2),
    "E": dict(position_encoding="learned"),
}
# The recipe shared by every model (§3, §5, §6).
RECIPE = dict(
    learning_rate_schedule="noam",
    warmup_steps=4000, learning_rate_scale=1.0, adam_b1=0.9, adam_b2=0.98,
    adam_eps=1e-9, grad_clip_norm=0.0, grad_accum_steps=1,
    attention_type="scaled_dot", attention_dropout_rate=0.0,
    layer_norm="post", share_embeddings=True, vocab_size=37000,
    ffn_activation="relu", attention_bias=False, output_bias=False,
    layer_norm_epsilon=1e-6,
    max_tokens=25_000, beam_size=4, alpha=0.6, max_decode_extra=50)
CHECKPOINTS_AVERAGED = {"base": 5, "big": 20}


def resolved(config) -> dict:
  """The Table 3 columns of a config, d_k / d_v = d_model / h where unset."""
  h = config.num_heads
  values = {k: config[k] for k in BASE}
  values["d_k"] = config.d_k or config.d_model // h
  values["d_v"] = config.d_v or config.d_model // h
  for side in ("num_encoder_layers", "num_decoder_layers"):
    assert config[side] in (None, config.num_layers)
  return values


def as_dict(config) -> dict:
  return json.loads(config.to_json())


def test_base_and_big_are_the_papers_models():
  assert resolved(base.get_config()) == BASE
  assert resolved(big.get_config()) == BIG
  for name, config in [("base", base.get_config()),
                       ("big", big.get_config())]:
    assert {k: config[k] for k in RECIPE} == RECIPE, name
    assert config.keep_checkpoints == CHECKPOINTS_AVERAGED[name], name


@pytest.mark.parametrize("row", sorted(TABLE3))
def test_table3_row_is_the_papers_row(row):
  config = base.get_config(row)
  assert resolved(config) == dict(BASE, **TABLE3[row])
  # Nothing else changes: the recipe, the loop and the data stay the base's.
  changed = {k for k, v in as_dict(config).items()
             if as_dict(base.get_config())[k] != v}
  assert changed <= set(TABLE3[row]) | {"d_k", "d_v"}, changed


def test_rows_apply_to_big_too():
  # A row applied to the big model changes only its own column.
  config = big.get_config("D1")
  assert resolved(config) == dict(BIG, dropout_rate=0.0)
  assert config.keep_checkpoints == 20


@pytest.mark.parametrize("module, row, expected", [
    (base, None, 63_045_632), (big, None, 214_171_648)])
def test_parameter_count_is_exactly_the_formula(module, row, expected):
  # base: 37000·512 + 6·(3,150,336 + 4,199,936) = 63,045,632 (the paper
  # gives 65M); big: 37000·1024 + 6·(12,592,128 + 16,788,480) = 214,171,648
  # (the paper: 213M).
  config = module.get_config(row)
  values = resolved(config)
  assert ref.param_count(values["num_layers"], values["d_model"],
                       values["d_ff"], values["num_heads"], values["d_k"],
                       values["d_v"], config.vocab_size) == expected
  assert script.count_params(config) == expected


def test_parameter_count_of_rows_b_and_e():
  # d_k != d_v (row B1) and learned positions (row E, max_len per side).
  b1 = base.get_config("B1,tiny")
  assert script.count_params(b1) == ref.param_count(2, 32, 64, 4, 16, 8, 64)
  e = base.get_config("E,tiny")
  assert script.count_params(e) == ref.param_count(2, 32, 64, 4, 8, 8, 64,
                                         learned_positions=e.max_len)


def np_adam(grads, lrs, b1=0.9, b2=0.98, eps=1e-9):
  """Adam (Kingma & Ba) in float64 with the paper's β1, β2, ε."""
  m = v = 0.0
  updates = []
  for k, (g, lr) in enumerate(zip(grads, lrs), start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1 ** k), v / (1 - b2 ** k)
    updates.append(-lr * m_hat / (np.sqrt(v_hat) + eps))
  return updates


def test_adam_constants_are_visible_in_the_updates():
  # Coordinates with gradients of 1e-9 .. 1: where |g| is near ε = 1e-9 the
  # update is lr·g/(|g| + ε), so ε = 1e-6 or 1e-8 shows; a gradient whose
  # sign and size change over three steps shows β1 and β2.
  config = base.get_config()
  tx = mha.create_optimizer(config)
  scales = np.array([1e-9, 3e-9, 1e-8, 1e-7, 1e-3, 1.0])
  pattern = np.array([[1.0, 1.0, 1.0], [1.0, -1.0, 2.0], [1.0, 3.0, -0.5],
                      [-2.0, 0.5, 4.0], [1.0, -1.0, 1.0], [0.5, 2.0, -3.0]])
  grads = [scales * pattern[:, k] for k in range(3)]  # [step][coordinate]
  params = jnp.zeros(len(scales))
  state = tx.init(params)
  lrs = [512 ** -0.5 * k * 4000 ** -1.5 for k in (1, 2, 3)]  # warming up
  expected = np_adam(np.array(grads), lrs)
  for g, want in zip(grads, expected):
    update, state = tx.update(jnp.asarray(g, jnp.float32), state, params)
    np.testing.assert_allclose(np.asarray(update, np.float64), want,
                               rtol=2e-4)
  # The test can see ε: with 1e-6 the smallest coordinates would move ~1000x
  # less.
  other = np_adam(np.array(grads), lrs, eps=1e-6)
  assert abs(other[-1][0] / expected[-1][0]) < 0.01
