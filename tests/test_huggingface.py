"""The mapping onto Hugging Face's MarianMT (mha/huggingface/marian.py) and
the export folder (mha/huggingface/export.py), without torch.

Marian's computation is written out here in numpy from its equations
(transformers' modeling_marian: [sin | cos] positions, biases on every
projection, post-LN with ε = 1e-5): fed the exported state dict, it
computes mha's log-probabilities, which shows that the permutation of the
model dimension is exact (with flax's ε it agrees to float32 rounding) and
measures what Marian's ε changes. tests/test_huggingface_torch.py checks the
same folder against transformers itself.
"""
import json
import math
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import file_hashes
from conftest import REPO_ROOT
from conftest import tiny_config
# The CTranslate2 export's fixtures and helpers: its copy-trained workdir.
# pylint: disable=unused-import  (fixtures, found by name)
from test_export import copy_model  # noqa: F401
from test_export import copy_workdir  # noqa: F401
from test_export import mha_log_probs
from test_export import random_params
from mha import export as export_lib
from mha.errors import ExportError
from mha.huggingface import export as hf_export
from mha.huggingface import marian
from mha.model.positional import sinusoidal_encoding
from mha.model.transformer import TransformerConfig

EOS = 1


def marian_positions(n_pos: int, dim: int) -> np.ndarray:
  """Marian's table, from its create_weight: column j's angle is
  pos / 10000^(2·(j//2)/dim); sines of the even j, then cosines of the odd
  j."""
  angle = np.array([[pos / np.power(10000, 2 * (j // 2) / dim)
                     for j in range(dim)] for pos in range(n_pos)])
  sentinel = (dim + 1) // 2
  out = np.empty((n_pos, dim), np.float32)
  out[:, :sentinel] = np.sin(angle[:, 0::2])
  out[:, sentinel:] = np.cos(angle[:, 1::2])
  return out


@pytest.mark.parametrize("d_model", [32, 33, 512])
def test_marian_positions_are_ours_permuted_exactly(d_model):
  ours = sinusoidal_encoding(64, d_model)
  np.testing.assert_array_equal(
      ours[:, marian.model_permutation(d_model)],
      marian_positions(64, d_model))


# ------------------------------------------- Marian's equations in numpy


def _layer_norm(x, state, name, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return ((x - mean) / np.sqrt(var + eps) * state[f"{name}.weight"]
          + state[f"{name}.bias"])


def _linear(x, state, name):
  return x @ state[f"{name}.weight"].T + state[f"{name}.bias"]


def _attention(x, memory, mask, state, name, heads):
  """nn.Linear q/k/v/out with biases; scores · (M/h)^-0.5; mask: [B,Q,K]."""
  def split(y):
    return y.reshape(y.shape[0], y.shape[1], heads, -1).transpose(0, 2, 1, 3)
  q = split(_linear(x, state, f"{name}.q_proj"))
  k = split(_linear(memory, state, f"{name}.k_proj"))
  v = split(_linear(memory, state, f"{name}.v_proj"))
  scores = q @ k.transpose(0, 1, 3, 2) * q.shape[-1] ** -0.5
  scores = np.where(mask[:, None], scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads_out = (weights @ v).transpose(0, 2, 1, 3)
  return _linear(heads_out.reshape(x.shape), state, f"{name}.out_proj")


# transformers' ACT2FN of config.json's activation_function, in numpy.
_ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "swish": lambda x: x / (1.0 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(
        x / math.sqrt(2.0))),
}


def _ffn(x, state, prefix, activation="relu"):
  h = _ACTIVATIONS[activation](_linear(x, state, f"{prefix}.fc1"))
  return _linear(h, state, f"{prefix}.fc2")


def marian_log_probs(state, cfg, source, decoder_input, eps):
  """log_softmax of MarianMTModel's logits (float64), `source` and
  `decoder_input` `[B, L]` (0 = padding / the start token)."""
  state = {k: v.astype(np.float64) for k, v in state.items()}
  shared = cfg.share_embeddings
  encoder_embed = state["model.shared.weight" if shared else
                        "model.encoder.embed_tokens.weight"]
  decoder_embed = state["model.shared.weight" if shared else
                        "model.decoder.embed_tokens.weight"]
  table = marian_positions(cfg.max_len, cfg.d_model).astype(np.float64)
  scale = np.sqrt(cfg.d_model)
  x = encoder_embed[source] * scale + table[:source.shape[1]]
  keys = (source > 0)[:, None, :]
  for i in range(cfg.num_encoder_layers):
    p = f"model.encoder.layers.{i}"
    x = _layer_norm(x + _attention(x, x, keys, state, f"{p}.self_attn",
                                   cfg.num_heads),
                    state, f"{p}.self_attn_layer_norm", eps)
    x = _layer_norm(x + _ffn(x, state, p, cfg.ffn_activation), state,
                    f"{p}.final_layer_norm", eps)
  length = decoder_input.shape[1]
  y = decoder_embed[decoder_input] * scale + table[:length]
  causal = np.tril(np.ones((length, length), bool))[None]
  for i in range(cfg.num_decoder_layers):
    p = f"model.decoder.layers.{i}"
    y = _layer_norm(y + _attention(y, y, causal, state, f"{p}.self_attn",
                                   cfg.num_heads),
                    state, f"{p}.self_attn_layer_norm", eps)
    y = _layer_norm(y + _attention(y, x, keys, state, f"{p}.encoder_attn",
                                   cfg.num_heads),
                    state, f"{p}.encoder_attn_layer_norm", eps)
    y = _layer_norm(y + _ffn(y, state, p, cfg.ffn_activation), state,
                    f"{p}.final_layer_norm", eps)
  output = decoder_embed if shared else state["lm_head.weight"]
  logits = y @ output.T + state["final_logits_bias"]
  logits -= logits.max(-1, keepdims=True)
  return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _padded(rows, length):
  out = np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def _marian_scores(state, model_config, source_ids, target_ids, eps):
  """Each target token's log-probability under the numpy Marian, the
  decoder starting from token 0."""
  decoder_input = _padded([[0] + t[:-1] for t in target_ids], 24)
  log_probs = marian_log_probs(state, model_config, _padded(source_ids, 24),
                               decoder_input, eps)
  return [log_probs[b, np.arange(len(t)), t]
          for b, t in enumerate(target_ids)]


def _random_sentences(seed, vocab_size, n=6):
  rng = np.random.default_rng(seed)
  return [[int(i) for i in rng.integers(3, vocab_size, rng.integers(2, 20))]
          + [EOS] for _ in range(n)]


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_marian_equations_on_the_export_compute_mha(share_embeddings):
  """With flax's ε the numpy Marian computes mha's log-probabilities to
  float32 rounding (the permutation is exact); with Marian's 1e-5 they
  differ by less than 1e-4 (here: random parameters, layer norms' inputs
  of variance ~1)."""
  model_config = TransformerConfig.from_config(
      tiny_config(), deterministic=True, share_embeddings=share_embeddings)
  params = random_params(model_config, seed=3)
  state = marian.params_to_marian(model_config, params)
  sources = _random_sentences(0, model_config.vocab_size)
  targets = _random_sentences(1, model_config.vocab_size)
  ours = mha_log_probs(model_config, params, sources, targets)
  flax_eps = _marian_scores(state, model_config, sources, targets, 1e-6)
  marian_eps = _marian_scores(state, model_config, sources, targets,
                              marian.MARIAN_LAYER_NORM_EPSILON)
  for mine, same_eps, their_eps in zip(ours, flax_eps, marian_eps):
    np.testing.assert_allclose(same_eps, mine, rtol=0, atol=2e-5)
    np.testing.assert_allclose(their_eps, mine, rtol=0, atol=1e-4)


@pytest.mark.parametrize("activation", ["relu", "swish", "gelu"])
def test_the_model_options_are_exported(activation):
  """config.ffn_activation becomes config.json's activation_function, the
  attention biases and the output bias (config.attention_bias,
  output_bias; random here) Marian's q/k/v/out_proj biases and
  final_logits_bias: the numpy Marian computes mha."""
  model_config = TransformerConfig.from_config(
      tiny_config(ffn_activation=activation, attention_bias=True,
                  output_bias=True), deterministic=True)
  params = random_params(model_config, seed=7)
  state = marian.params_to_marian(model_config, params)
  assert (hf_export.config_json(model_config)["activation_function"]
          == activation)
  assert np.any(state["final_logits_bias"])
  assert np.any(state["model.decoder.layers.0.encoder_attn.out_proj.bias"])
  sources = _random_sentences(2, model_config.vocab_size)
  targets = _random_sentences(3, model_config.vocab_size)
  ours = mha_log_probs(model_config, params, sources, targets)
  theirs = _marian_scores(state, model_config, sources, targets, 1e-6)
  for mine, same in zip(ours, theirs):
    np.testing.assert_allclose(same, mine, rtol=0, atol=2e-5)


# ------------------------------------------------------------- round trip


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_params_to_marian_and_back_is_bit_identical(share_embeddings):
  model_config = TransformerConfig.from_config(
      tiny_config(), share_embeddings=share_embeddings)
  params = random_params(model_config, seed=5)
  state = marian.params_to_marian(model_config, params)
  assert all(v.dtype == np.float32 and v.flags.c_contiguous
             for v in state.values())
  back, extras = marian.marian_to_params(model_config, state)
  assert (jax.tree_util.tree_structure(back)
          == jax.tree_util.tree_structure(jax.device_get(params)))
  for a, b in zip(jax.tree_util.tree_leaves(back),
                  jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, np.asarray(b))
  # Every tensor of Marian's that mha has no parameter for is zero.
  layers = model_config.num_encoder_layers + 2 * model_config.num_decoder_layers
  assert len(extras) == 4 * layers + share_embeddings
  assert all(not np.any(v) for v in extras.values())
  # And back again: the same state dict.
  again = marian.params_to_marian(model_config, back)
  assert sorted(again) == sorted(state)
  for name, tensor in state.items():
    np.testing.assert_array_equal(again[name], tensor)


def test_marian_biases_come_back_in_mha_coordinates():
  """out_proj's bias is a model vector: an importer gets it un-permuted."""
  model_config = TransformerConfig.from_config(tiny_config())
  state = marian.params_to_marian(
      model_config, random_params(model_config, seed=1))
  name = "model.encoder.layers.0.self_attn.out_proj.bias"
  state[name] = marian.model_permutation(32).astype(np.float32)
  _, extras = marian.marian_to_params(model_config, state)
  np.testing.assert_array_equal(extras[name], np.arange(32))


@pytest.mark.parametrize("changes, field", [
    (dict(layer_norm="pre"), "layer_norm"),
    (dict(attention_type="additive"), "attention_type"),
    (dict(attention_type="dot"), "attention_type"),
    (dict(attention_type="location"), "attention_type"),
    (dict(position_encoding="learned"), "position_encoding"),
    (dict(d_k=4, d_v=4), "d_k"),
    (dict(d_k=8, d_v=4), "d_v"),
])
def test_what_marian_cannot_compute_is_refused(changes, field):
  model_config = TransformerConfig.from_config(tiny_config(**changes))
  with pytest.raises(ExportError, match=rf"^config\.{field}=.*Marian"):
    marian.check_representable(model_config)


# ---------------------------------------------------------- the export


@pytest.fixture(name="safetensors_numpy", scope="module")
def safetensors_numpy_fixture():
  """The export's one optional package (no torch)."""
  return pytest.importorskip(
      "safetensors.numpy", reason="safetensors is not installed (the [hf] "
      "extra: pip install 'mha[hf]')")


@pytest.fixture(scope="module")
def hf_folder(safetensors_numpy, copy_workdir, tmp_path_factory):
  del safetensors_numpy
  output_dir = tmp_path_factory.mktemp("hf") / "model"
  manifest = hf_export.export_model(str(copy_workdir), str(output_dir))
  return output_dir, manifest


def test_the_folder_holds_transformers_files(safetensors_numpy, hf_folder,
                                            copy_model, copy_workdir):
  output_dir, manifest = hf_folder
  config, model_config, params, tokenizer = copy_model
  assert sorted(os.listdir(output_dir)) == sorted([
      "README.md", "config.json", "generation_config.json",
      "model.safetensors", "source.spm", "target.spm", "tokenizer_config.json",
      "vocab.json", export_lib.MANIFEST_FILE])
  weights = safetensors_numpy.load_file(str(output_dir / "model.safetensors"))
  expected = marian.params_to_marian(model_config, params)
  assert sorted(weights) == sorted(expected)
  for name, tensor in expected.items():
    np.testing.assert_array_equal(weights[name], tensor)
  vocab = json.loads((output_dir / "vocab.json").read_text())
  assert vocab == {tokenizer.id_to_piece(i): i
                   for i in range(tokenizer.vocab_size)}
  spm_model = (copy_workdir / "spm.model").read_bytes()
  assert (output_dir / "source.spm").read_bytes() == spm_model
  assert (output_dir / "target.spm").read_bytes() == spm_model
  hf_config = json.loads((output_dir / "config.json").read_text())
  assert (hf_config["pad_token_id"], hf_config["eos_token_id"],
          hf_config["decoder_start_token_id"]) == (0, 1, 0)
  assert hf_config["d_model"] == model_config.d_model
  generation = json.loads((output_dir / "generation_config.json").read_text())
  assert generation["num_beams"] == config.beam_size
  assert generation["max_length"] == model_config.max_len + 1
  assert manifest["command"] in (output_dir / "README.md").read_text()


def test_the_model_card_has_the_workdirs_bleu(safetensors_numpy,
                                              copy_workdir, tmp_path):
  del safetensors_numpy
  """An evaluation of the exported step appears with its BLEU; one of
  another step does not."""
  for name, steps, bleu in (("test_100", [100], 12.345),
                            ("test_6", [6], 99.0)):
    folder = copy_workdir / "eval" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps(
        {"bleu": bleu, "split": "test", "averaged_steps": steps,
         "beam_size": 4, "alpha": 0.6}))
  try:
    hf_export.export_model(str(copy_workdir), str(tmp_path / "out"))
  finally:
    for name in ("test_100", "test_6"):
      os.remove(copy_workdir / "eval" / name / "metrics.json")
      os.rmdir(copy_workdir / "eval" / name)
  card = (tmp_path / "out" / "README.md").read_text()
  assert "| test | 4 | 0.6 | 12.35 |" in card
  assert "99.00" not in card


@pytest.mark.parametrize("changes, message", [
    (dict(layer_norm="pre"), r"^config\.layer_norm='pre'"),
    (dict(position_encoding="learned"), r"^config\.position_encoding="),
])
def test_unrepresentable_workdir_refused_before_writing(
    changes, message, tmp_path, tiny_workdir, safetensors_numpy):
  del safetensors_numpy
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  config = json.loads((workdir / "config.json").read_text())
  config.update(changes)
  (workdir / "config.json").write_text(json.dumps(config))
  before = file_hashes(tmp_path)
  with pytest.raises(ExportError, match=message):
    hf_export.export_model(str(workdir), str(tmp_path / "out"))
  assert file_hashes(tmp_path) == before


def test_bad_flags_and_folders_refused(tiny_workdir, tmp_path,
                                       safetensors_numpy):
  del safetensors_numpy
  with pytest.raises(ExportError, match="quantization=int8.*float32"):
    hf_export.export_model(str(tiny_workdir), str(tmp_path / "a"),
                           quantization="int8")
  with pytest.raises(ExportError, match="export_format=huggingface.*"
                     "mha.huggingface"):
    export_lib.export(str(tiny_workdir), str(tmp_path / "b"),
                      export_format="huggingface")
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("x")
  with pytest.raises(ExportError, match="not an export"):
    hf_export.export_model(str(tiny_workdir), str(tmp_path / "mine"))
  assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_re_export_replaces_the_folder(tiny_workdir, tmp_path,
                                        safetensors_numpy):
  del safetensors_numpy
  out = tmp_path / "out"
  first = hf_export.export_model(str(tiny_workdir), str(out), step=2)
  second = hf_export.export_model(str(tiny_workdir), str(out))
  assert (first["checkpoint_step"], second["checkpoint_step"]) == (2, 6)
  assert json.loads((out / export_lib.MANIFEST_FILE).read_text())[
      "checkpoint_step"] == 6
  assert sorted(os.listdir(tmp_path)) == ["out"]


def test_missing_safetensors_is_one_line(tiny_workdir, tmp_path,
                                         monkeypatch):
  monkeypatch.setitem(sys.modules, "safetensors", None)  # import fails
  with pytest.raises(ExportError, match=r"pip install 'mha\[hf\]'"):
    hf_export.export_model(str(tiny_workdir), str(tmp_path / "hf"))
  assert not (tmp_path / "hf").exists()


def test_command(tiny_workdir, tmp_path, safetensors_numpy):
  """mha-export --format=huggingface writes the folder; a refusal is one
  line naming the flag, exit status 1, nothing written."""
  del safetensors_numpy
  command = [sys.executable, "-m", "mha.cli.export",
             f"--workdir={tiny_workdir}", "--format=huggingface"]
  env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
  done = subprocess.run(
      command + [f"--output_dir={tmp_path / 'hf'}", "--step=4"], env=env,
      capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr
  manifest = json.loads((tmp_path / "hf" / export_lib.MANIFEST_FILE
                         ).read_text())
  assert (manifest["format"], manifest["averaged_steps"]) == (
      "huggingface", [4])
  assert "--step=4" in (tmp_path / "hf" / "README.md").read_text()
  done = subprocess.run(
      command + [f"--output_dir={tmp_path / 'q'}", "--quantization=int8"],
      env=env, capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 1
  errors = [line for line in done.stderr.splitlines()
            if line.startswith("mha-export:")]
  assert len(errors) == 1 and "--quantization=int8" in errors[0], done.stderr
  assert "Traceback" not in done.stderr
  assert sorted(os.listdir(tmp_path)) == ["hf"]
