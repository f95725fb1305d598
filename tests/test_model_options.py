"""The model options an OPUS-MT (Marian) model needs, beside the paper's
defaults: `ffn_activation`, `attention_bias`, `output_bias` and
`layer_norm_epsilon` (configs/base.py).

Each is checked against its formula in NumPy or in the hand-written model
of tests/paper_reference.py (random parameters: biases not 0, norms not 1
and 0), through the decode cache and the training loss, in checkpoint
averaging and in a workdir's config; and the defaults build the parameter
tree the model had before the options existed.
"""
import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import mha
from configs import base
import paper_reference as ref
from mha import validation
from mha.errors import ConfigError
from mha.model import losses
from mha.model import transformer
from mha.model.transformer import FeedForward
from mha.store import averaging
from mha.store import workdir as workdir_lib

SRC = np.array([[5, 6, 7, 8, 1, 0], [9, 10, 1, 0, 0, 0]], np.int32)
TGT = np.array([[11, 12, 13, 1, 0], [14, 15, 16, 17, 1]], np.int32)
# OPUS-MT's settings (Marian's `transformer`, transformers' MarianConfig).
MARIAN = dict(ffn_activation="swish", attention_bias=True, output_bias=True,
              layer_norm_epsilon=1e-5)


def tiny(**changes):
  config = base.get_config("tiny")
  config.update(changes)
  return config


def random_model(config, seed: int = 0):
  """(deterministic model, paper_reference's random parameters)."""
  model = mha.create_model(config, deterministic=True)
  shapes = jax.eval_shape(model.init, jax.random.key(0), SRC, TGT)["params"]
  return model, ref.random_params(shapes, seed)


def test_the_defaults_are_the_papers():
  config = base.get_config()
  assert (config.ffn_activation, config.attention_bias, config.output_bias,
          config.layer_norm_epsilon) == ("relu", False, False, 1e-6)
  model_config = mha.TransformerConfig(vocab_size=8)
  assert (model_config.ffn_activation, model_config.attention_bias,
          model_config.output_bias, model_config.layer_norm_epsilon) == (
              "relu", False, False, 1e-6)
  assert tuple(transformer.FFN_ACTIVATIONS) == validation.FFN_ACTIVATIONS


def test_the_default_parameter_tree_is_the_one_before_the_options():
  """The names and shapes of the parameters of the tiny model as the code
  before these options made them (written out here): a checkpoint of
  then is a checkpoint of now."""
  model = mha.create_model(tiny(num_layers=1), deterministic=True)
  shapes = jax.eval_shape(model.init, jax.random.key(0), SRC, TGT)["params"]
  found = {jax.tree_util.keystr(path): tuple(leaf.shape)
           for path, leaf in jax.tree_util.tree_leaves_with_path(shapes)}
  attention = {"query_kernel": (32, 4, 8), "key_kernel": (32, 4, 8),
               "value_kernel": (32, 4, 8), "out_kernel": (4, 8, 32)}
  norm = {"scale": (32,), "bias": (32,)}
  ffn = {"w1": {"kernel": (32, 64), "bias": (64,)},
         "w2": {"kernel": (64, 32), "bias": (32,)}}
  before = {
      "source_embed": {"embedding": (64, 32)},
      "encoder_layers_0": {
          "self_attention": attention, "ffn": ffn,
          "attention_block": {"layer_norm": norm},
          "ffn_block": {"layer_norm": norm}},
      "decoder_layers_0": {
          "self_attention": attention, "cross_attention": attention,
          "ffn": ffn, "self_attention_block": {"layer_norm": norm},
          "cross_attention_block": {"layer_norm": norm},
          "ffn_block": {"layer_norm": norm}}}
  expected = {jax.tree_util.keystr(path): leaf for path, leaf in
              jax.tree_util.tree_leaves_with_path(
                  before, is_leaf=lambda x: isinstance(x, tuple))}
  assert found == expected


def _erf_gelu(x):
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


@pytest.mark.parametrize("name, formula", [
    ("relu", lambda x: np.maximum(x, 0.0)),
    ("swish", lambda x: x / (1.0 + np.exp(-x))),
    ("gelu", _erf_gelu),
])
def test_ffn_activation_is_its_formula(name, formula):
  """FFN(x) = act(x W₁ + b₁) W₂ + b₂ in NumPy float64; gelu is the exact
  erf form (torch's default), which differs from flax's tanh form."""
  cfg = mha.TransformerConfig.from_config(tiny(ffn_activation=name))
  ffn = FeedForward(cfg)
  x = np.random.default_rng(1).normal(size=(2, 5, 32)).astype(np.float32)
  params = ref.random_params(
      jax.eval_shape(ffn.init, jax.random.key(0), x)["params"], 2)
  w1, w2 = params["w1"], params["w2"]
  hidden = x.astype(np.float64) @ w1["kernel"] + w1["bias"]
  expected = formula(hidden) @ w2["kernel"] + w2["bias"]
  np.testing.assert_allclose(ffn.apply({"params": params}, x), expected,
                             rtol=1e-5, atol=1e-5)
  if name == "gelu":  # the tanh approximation is off by more than that
    tanh_form = np.asarray(jax.nn.gelu(hidden, approximate=True))
    assert np.max(np.abs(tanh_form - formula(hidden))) > 1e-4


def test_attention_biases_are_added_to_each_projection():
  """With use_bias: (x W^Q + b^Q), (x W^K + b^K), (x W^V + b^V) per head,
  and Concat(heads) W^O + b^O, in NumPy."""
  module = mha.MultiHeadAttention(num_heads=4, use_bias=True)
  rng = np.random.default_rng(3)
  x_q = rng.normal(size=(2, 3, 32)).astype(np.float32)
  x_kv = rng.normal(size=(2, 5, 32)).astype(np.float32)
  params = ref.random_params(jax.eval_shape(
      module.init, jax.random.key(0), x_q, x_kv)["params"], 4)
  assert {k: params[k].shape for k in params if k.endswith("_bias")} == {
      "query_bias": (4, 8), "key_bias": (4, 8), "value_bias": (4, 8),
      "out_bias": (32,)}
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  project = lambda x, name: (np.einsum("blm,mhd->blhd", x, p[f"{name}_kernel"])
                             + p[f"{name}_bias"])
  q, k, v = project(x_q, "query"), project(x_kv, "key"), project(x_kv, "value")
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = np.einsum("bhqk,bkhd->bqhd", weights, v)
  expected = np.einsum("bqhd,hdm->bqm", heads, p["out_kernel"]) + p["out_bias"]
  np.testing.assert_allclose(module.apply({"params": params}, x_q, x_kv),
                             expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("changes", [
    MARIAN,
    dict(ffn_activation="gelu", layer_norm="pre", layer_norm_epsilon=0.25,
         attention_bias=True),
    dict(output_bias=True, layer_norm_epsilon=0.5),
], ids=["marian", "gelu_pre_ln", "output_bias"])
def test_model_equals_the_hand_written_one(changes):
  """The whole teacher-forced model against paper_reference's, which reads
  each bias where the parameters hold it and takes the activation and ε
  from the options."""
  config = tiny(**changes)
  model, params = random_model(config, seed=5)
  names = {jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_leaves_with_path(params)}
  assert any("query_bias" in n for n in names) == config.attention_bias
  assert ("['output_bias']" in names) == config.output_bias
  expected = ref.logits(params, SRC, TGT, num_layers=config.num_layers,
                        layer_norm_kind=config.layer_norm,
                        activation=config.ffn_activation,
                        eps=config.layer_norm_epsilon)
  real = TGT > 0  # padded queries: masked here, not in the reference
  np.testing.assert_allclose(
      np.asarray(model.apply({"params": params}, SRC, TGT))[real],
      np.asarray(expected)[real], rtol=1e-4, atol=1e-4)


def test_decode_cache_with_biases_equals_the_full_pass():
  """Step by step with the cache (cross-attention's keys and values
  projected once, with their biases) gives the full pass's logits."""
  config = tiny(**MARIAN)
  model, params = random_model(config, seed=6)
  full = model.apply({"params": params}, SRC, TGT)
  decoder = mha.create_model(config, deterministic=True, decode=True)
  cache = decoder.init(jax.random.key(0), SRC,
                       np.ones(TGT.shape, np.int32))["cache"]
  encoded = decoder.apply({"params": params}, SRC, method="encode")
  previous = np.zeros((2, 1), np.int32)
  for t in range(TGT.shape[1]):
    logits, mutated = decoder.apply(
        {"params": params, "cache": cache}, encoded, SRC, previous,
        mutable=["cache"], method="decode")
    cache = mutated["cache"]
    real = (TGT[:, t] > 0) | (t == 0)
    np.testing.assert_allclose(np.asarray(logits[:, 0])[real],
                               np.asarray(full[:, t])[real], atol=1e-4)
    previous = TGT[:, t:t + 1]


def test_training_loss_reads_the_output_bias():
  """The loss projects the decoder output in chunks with (kernel, bias)
  from `output_weights`: the same sums as the full logits', which hold the
  output bias."""
  model, params = random_model(tiny(output_bias=True), seed=7)
  hidden, (kernel, bias) = model.apply({"params": params}, SRC, TGT,
                                       method="hidden_and_output_weights")
  np.testing.assert_array_equal(bias, params["output_bias"])
  chunked = losses.projected_token_sums(hidden, kernel, jnp.asarray(TGT),
                                        0.1, bias=bias)
  full = losses.token_sums(model.apply({"params": params}, SRC, TGT),
                           jnp.asarray(TGT), 0.1)
  assert set(chunked) == set(full)
  for key, value in full.items():
    np.testing.assert_allclose(chunked[key], value, rtol=1e-5)


def test_averaging_takes_the_mean_of_the_new_parameters():
  config = tiny(**MARIAN)
  _, first = random_model(config, seed=1)
  _, second = random_model(config, seed=2)
  mean = averaging.average_params([first, second])
  for name in ("output_bias",):
    np.testing.assert_allclose(mean[name], (first[name] + second[name]) / 2,
                               rtol=1e-6)
  layer = "decoder_layers_1"
  for name in ("query_bias", "out_bias"):
    a = first[layer]["cross_attention"][name]
    b = second[layer]["cross_attention"][name]
    np.testing.assert_allclose(mean[layer]["cross_attention"][name],
                               (a + b) / 2, rtol=1e-6)


@pytest.mark.parametrize("field, value, message", [
    ("ffn_activation", "tanh",
     "config.ffn_activation must be one of relu, swish, gelu, got 'tanh'."),
    ("attention_bias", 1, "config.attention_bias must be True or False"),
    ("output_bias", "yes", "config.output_bias must be True or False"),
    ("layer_norm_epsilon", 0.0,
     "config.layer_norm_epsilon must be a finite number > 0, got 0.0."),
])
def test_bad_values_are_refused_naming_the_field(field, value, message):
  """By the model config and by the training's checks of a config (read
  from JSON: a ConfigDict of configs/base.py refuses a mistyped value
  itself)."""
  with pytest.raises(ConfigError) as e:
    mha.create_model(mha.TransformerConfig.from_config(tiny()),
                     **{field: value})
  assert str(e.value).startswith(message)
  from mha.train import config_check  # pylint: disable=g-import-not-at-top
  edited = ml_collections.ConfigDict(
      dict(json.loads(tiny().to_json()), **{field: value}))
  with pytest.raises(ConfigError) as e:
    config_check.validate(edited)
  assert str(e.value).startswith(message)


def test_output_bias_needs_shared_embeddings():
  with pytest.raises(ConfigError, match="config.output_bias=True .* "
                     "config.share_embeddings=False"):
    mha.create_model(tiny(output_bias=True, share_embeddings=False))


def test_a_workdir_of_before_the_options_loads_as_the_papers(tmp_path):
  """An older config.json lacks the four fields: it is resumed by today's
  defaults and builds the paper's model; a workdir written with another
  value is not resumed with the default."""
  config = tiny()
  older = json.loads(config.to_json())
  for field in MARIAN:
    del older[field]
  (tmp_path / workdir_lib.CONFIG_FILE).write_text(json.dumps(older))
  workdir_lib.check_config(config, str(tmp_path))
  loaded = workdir_lib.load_config(str(tmp_path))
  model_config = mha.TransformerConfig.from_config(loaded)
  assert model_config == mha.TransformerConfig.from_config(config)
  for field, value in MARIAN.items():
    (tmp_path / workdir_lib.CONFIG_FILE).write_text(
        json.dumps(dict(older, **{field: value})))
    with pytest.raises(ConfigError, match=f"written with {field}="):
      workdir_lib.check_config(config, str(tmp_path))
