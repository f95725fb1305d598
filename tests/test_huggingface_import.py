"""mha-import --from=huggingface (mha/huggingface/importer.py).

Round trips on the export of tests/test_export.py's copy model: mha → HF →
mha gives the checkpoint's parameters and HF → mha → HF the folder's
tensors, both bit-identical (the mapping is a permutation and reshapes:
no arithmetic); the imported workdir translates and scores as the original
does, eval.py evaluates it, and a warm start (`init_from`) fine-tunes it.
Each bad input is one line naming the file or field and leaves no workdir.
The torch tests (marked `torch`) import a MarianMTModel made by
transformers itself and compare with transformers' own computation.
"""
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import REPO_ROOT
from hf_reference import assert_warm_start_fine_tunes
from hf_reference import generate
from hf_reference import hf_log_probs
from hf_reference import load
from hf_reference import mha_model
from hf_reference import mha_outputs
from hf_reference import random_marian_model
from hf_reference import require_torch
# pylint: disable=unused-import  (fixtures, found by name)
from test_export import copy_model  # noqa: F401
from test_export import copy_workdir  # noqa: F401
from test_export import first_test_pairs
from test_export import mha_log_probs
from test_huggingface import hf_folder  # noqa: F401
from test_huggingface import safetensors_numpy_fixture  # noqa: F401
# pylint: enable=unused-import
import mha
from mha.errors import ModelImportError
from mha.huggingface import export as hf_export
from mha.huggingface import importer
from mha.huggingface import marian
from mha.model.transformer import TransformerConfig
from mha.store import checkpoints
from mha.store import trained

EOS = 1


def _import(source, workdir, base):
  return importer.import_model(str(source), str(workdir), base)


@pytest.fixture(scope="module")
def imported(hf_folder, copy_model, tmp_path_factory):
  """The copy model's Hugging Face export imported as a workdir."""
  workdir = tmp_path_factory.mktemp("imported") / "run"
  _import(hf_folder[0], workdir, copy_model[0])
  return workdir


def _leaves(params):
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {checkpoints.param_path_name(p): np.asarray(x) for p, x in flat}


def test_the_workdir_is_what_training_leaves(imported, copy_model):
  config = copy_model[0]
  assert sorted(os.listdir(imported)) == ["checkpoints", "config.json",
                                          "spm.model"]
  assert checkpoints.all_steps(str(imported)) == [importer.STEP]
  saved, _ = trained.load_workdir(str(imported))
  for field in ("d_model", "d_ff", "num_heads", "vocab_size", "max_len",
                "share_embeddings", "dropout_rate", "dataset_name",
                "beam_size", "alpha"):
    assert saved[field] == config[field], field
  # Marian's LayerNorm ε (1e-5, what transformers computes), not flax's.
  assert saved.layer_norm_epsilon == 1e-5
  assert (TransformerConfig.from_config(saved) == dataclasses.replace(
      TransformerConfig.from_config(config), layer_norm_epsilon=1e-5))
  assert not [n for n in os.listdir(imported.parent) if n != "run"]


def test_mha_to_hf_to_mha_is_bit_identical(imported, copy_model,
                                           copy_workdir):
  params = _leaves(copy_model[2])
  back, step = checkpoints.restore_params(str(imported))
  assert step == importer.STEP
  back = _leaves(back)
  assert sorted(back) == sorted(params)
  for name, value in params.items():
    assert back[name].dtype == value.dtype, name
    np.testing.assert_array_equal(back[name], value, err_msg=name)
  assert ((imported / "spm.model").read_bytes()
          == (copy_workdir / "spm.model").read_bytes())


def test_hf_to_mha_to_hf_is_bit_identical(imported, hf_folder,
                                          safetensors_numpy, tmp_path):
  again = tmp_path / "again"
  hf_export.export_model(str(imported), str(again))
  first = safetensors_numpy.load_file(str(hf_folder[0] / "model.safetensors"))
  second = safetensors_numpy.load_file(str(again / "model.safetensors"))
  assert sorted(first) == sorted(second)
  for name, tensor in first.items():
    np.testing.assert_array_equal(second[name], tensor, err_msg=name)
  for name in ("config.json", "source.spm", "target.spm", "vocab.json",
               "tokenizer_config.json", "generation_config.json"):
    assert (again / name).read_bytes() == (hf_folder[0] / name).read_bytes()


def test_imported_model_translates_and_scores_identically(imported,
                                                          copy_workdir,
                                                          copy_model):
  config, model_config, params, tokenizer = copy_model
  pairs = first_test_pairs(config)
  sources = [s for s, _ in pairs]
  original, ours = mha.load(str(copy_workdir)), mha.load(str(imported))
  assert ours.translate(sources) == original.translate(sources)
  assert (ours.translate(sources, beam_size=1)
          == original.translate(sources, beam_size=1))
  scores = ours.score(sources, [t for _, t in pairs])
  expected = mha_log_probs(
      model_config, params, [tokenizer.encode(s) + [EOS] for s in sources],
      [tokenizer.encode(t) + [EOS] for _, t in pairs])
  # The import computes with Marian's ε = 1e-5, the original flax's 1e-6.
  for score, want in zip(scores, expected):
    np.testing.assert_allclose(score.token_log_probs, want, rtol=0,
                               atol=1e-4)


def test_eval_py_evaluates_the_imported_workdir(imported, copy_model,
                                                copy_workdir, tmp_path):
  """eval.py's greedy outputs of the import, scored against the original
  workdir's greedy outputs: BLEU 100."""
  sources = [s for s, _ in first_test_pairs(copy_model[0])]
  references = mha.load(str(copy_workdir)).translate(sources, beam_size=1)
  (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sources))
  (tmp_path / "ref.txt").write_text("".join(t + "\n" for t in references))
  workdir = tmp_path / "run"
  shutil.copytree(imported, workdir)
  result = subprocess.run(
      [sys.executable, str(REPO_ROOT / "eval.py"), f"--workdir={workdir}",
       f"--source_file={tmp_path / 'src.txt'}",
       f"--reference_file={tmp_path / 'ref.txt'}",
       f"--output_dir={tmp_path / 'out'}", "--beam_size=1"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
  assert metrics["bleu"] == pytest.approx(100.0)


def test_a_warm_start_from_the_import_fine_tunes(imported, tmp_path):
  assert_warm_start_fine_tunes(imported, tmp_path / "tuned", ("spm.model",))


def test_train_overrides_name_the_model_shape(imported):
  saved, _ = trained.load_workdir(str(imported))
  overrides = importer.train_overrides(saved)
  assert f"--config.d_model={saved.d_model}" in overrides.split()
  assert f"--config.vocab_size={saved.vocab_size}" in overrides.split()
  assert "--config.share_embeddings=True" in overrides.split()


# ---------------------------------------------------------- bad input


# ------------------------------------ OPUS-MT's ids and biases (no torch)


def _opus_folder(hf_folder, folder, order):
  """The export with OPUS-MT's ids: Marian id j is the export's id
  order[j] (</s> 0, <unk> 1, <pad> last), its vocabulary rows, vocab.json
  and special ids permuted alike: the same model under other ids."""
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top
  shutil.copytree(hf_folder[0], folder)
  vocab = json.loads((folder / "vocab.json").read_text())
  pieces = sorted(vocab, key=vocab.get)
  (folder / "vocab.json").write_text(json.dumps(
      {pieces[old]: new for new, old in enumerate(order)}))
  state = st.load_file(str(folder / "model.safetensors"))
  state["model.shared.weight"] = state["model.shared.weight"][order]
  state["final_logits_bias"] = state["final_logits_bias"][:, order]
  st.save_file(state, str(folder / "model.safetensors"),
               metadata={"format": "pt"})
  position = {old: new for new, old in enumerate(order)}
  _edit_json("config.json", pad_token_id=position[0],
             decoder_start_token_id=position[0],
             eos_token_id=position[1])(folder)
  return state


def _opus_order(vocab_size):
  """Marian's ids of the export's: </s> 0, <unk> 1, the others shuffled,
  <pad> last."""
  rest = 3 + np.random.default_rng(1).permutation(vocab_size - 3)
  return np.concatenate([[1, 2], rest, [0]])


def test_opus_ids_are_permuted_to_mha_s(hf_folder, imported, copy_model,
                                        tmp_path):
  config = copy_model[0]
  order = _opus_order(config.vocab_size)
  state = _opus_folder(hf_folder, tmp_path / "opus", order)
  _import(tmp_path / "opus", tmp_path / "run", config)
  assert sorted(os.listdir(tmp_path / "run")) == [
      "checkpoints", "config.json", "source.spm", "target.spm", "vocab.json"]
  vocab = json.loads((tmp_path / "run" / "vocab.json").read_text())
  assert [p for p, _ in sorted(vocab.items(), key=lambda x: x[1])[:3]] == [
      "<pad>", "</s>", "<unk>"]
  # The same model: translations and scores of the spm.model import.
  sources = [s for s, _ in first_test_pairs(config)]
  targets = [t for _, t in first_test_pairs(config)]
  ours, plain = mha.load(str(tmp_path / "run")), mha.load(str(imported))
  assert ours.translate(sources) == plain.translate(sources)
  for a, b in zip(ours.score(sources, targets),
                  plain.score(sources, targets)):
    np.testing.assert_allclose(a.token_log_probs, b.token_log_probs,
                               rtol=0, atol=1e-6)
  # HF -> mha -> HF: the export has mha's ids, its vocabulary rows the
  # OPUS folder's permuted by mha's order (pad, </s>, unk, then Marian's).
  again = tmp_path / "again"
  hf_export.export_model(str(tmp_path / "run"), str(again))
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top
  second = st.load_file(str(again / "model.safetensors"))
  marian_ids = json.loads((tmp_path / "opus" / "vocab.json").read_text())
  exported = json.loads((again / "vocab.json").read_text())
  mha_order = np.array(sorted(marian_ids, key=exported.get))
  mha_order = np.array([marian_ids[p] for p in mha_order])
  assert list(mha_order[:3]) == [len(order) - 1, 0, 1]
  for name, tensor in state.items():
    if name == "model.shared.weight":
      tensor = tensor[mha_order]
    elif name == "final_logits_bias":
      tensor = tensor[:, mha_order]
    np.testing.assert_array_equal(second[name], tensor, err_msg=name)
  assert json.loads((again / "config.json").read_text())["pad_token_id"] == 0
  for name in ("source.spm", "target.spm"):
    assert (again / name).read_bytes() == (hf_folder[0] / name).read_bytes()


def test_biases_become_model_options(hf_folder, copy_model, tmp_path):
  """Non-zero attention biases and final_logits_bias: attention_bias and
  output_bias, the tensors in the parameters (round trip bit for bit)."""
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "biased"
  shutil.copytree(hf_folder[0], folder)
  state = st.load_file(str(folder / "model.safetensors"))
  rng = np.random.default_rng(2)
  for name in state:
    if name.endswith("_proj.bias") or name == "final_logits_bias":
      state[name] = rng.normal(size=state[name].shape).astype(np.float32)
  st.save_file(state, str(folder / "model.safetensors"),
               metadata={"format": "pt"})
  saved = _import(folder, tmp_path / "run", copy_model[0])
  assert saved.attention_bias and saved.output_bias
  params, _, _ = trained.load_params(str(tmp_path / "run"))
  model_config = TransformerConfig.from_config(saved)
  np.testing.assert_array_equal(params["output_bias"],
                                state["final_logits_bias"][0])
  np.testing.assert_array_equal(
      params["decoder_layers_1"]["cross_attention"]["key_bias"],
      state["model.decoder.layers.1.encoder_attn.k_proj.bias"].reshape(
          model_config.num_heads, -1))
  again = marian.params_to_marian(model_config, params)
  for name, tensor in again.items():
    np.testing.assert_array_equal(tensor, state[name], err_msg=name)


def _damaged(tmp_path, hf_folder, change):
  """A copy of the export, changed by `change(folder)`."""
  folder = tmp_path / "bad"
  shutil.copytree(hf_folder[0], folder)
  change(folder)
  return folder


def _edit_json(name, **changes):
  def change(folder):
    value = json.loads((folder / name).read_text())
    value.update(changes)
    (folder / name).write_text(json.dumps(value))
  return change


def _truncate(folder):
  path = folder / "model.safetensors"
  path.write_bytes(path.read_bytes()[:-1000])


def _edit_weights(**changes):
  """Sets tensors of model.safetensors: name -> function of the tensor."""
  def change(folder):
    from safetensors import numpy as st  # pylint: disable=g-import-not-at-top
    path = str(folder / "model.safetensors")
    state = st.load_file(path)
    for name, edit in changes.items():
      state[name.replace("__", ".")] = edit(
          state.get(name.replace("__", "."), np.zeros(4, np.float32)))
    st.save_file(state, path, metadata={"format": "pt"})
  return change


def _twice_one_id(folder):
  vocab = json.loads((folder / "vocab.json").read_text())
  pieces = sorted(vocab, key=vocab.get)
  vocab[pieces[6]] = 5
  (folder / "vocab.json").write_text(json.dumps(vocab))


def _rename_unk(folder):
  vocab = json.loads((folder / "vocab.json").read_text())
  vocab["<other>"] = vocab.pop("<unk>")
  (folder / "vocab.json").write_text(json.dumps(vocab))


def _other_target_spm(folder):
  (folder / "target.spm").write_bytes(
      (folder / "target.spm").read_bytes() + b"\0")


_ONE = lambda x: np.ones_like(x)  # noqa: E731
BAD_INPUTS = {
    "not_marian": (_edit_json("config.json", model_type="bart"),
                   r"config\.json: model_type='bart'"),
    "no_config": (lambda f: (f / "config.json").unlink(),
                  r"config\.json: missing"),
    "truncated_weights": (_truncate, r"model\.safetensors: damaged"),
    "no_weights": (lambda f: (f / "model.safetensors").unlink(),
                   r"model\.safetensors: missing"),
    "vocab_json": (_twice_one_id, r"vocab\.json: does not give the ids "
                   r"0\.\.511 each to one piece"),
    "target_spm": (_other_target_spm, r"target\.spm is not a "
                   r"SentencePiece model"),
    "pre_ln": (_edit_json("config.json", normalize_before=True),
               r"config\.json: normalize_before=True"),
    "activation": (_edit_json("config.json", activation_function="tanh"),
                   r"config\.json: activation_function='tanh' cannot be "
                   r"imported: mha's ffn_activation maps"),
    "special_ids": (_edit_json("config.json", pad_token_id=511,
                               decoder_start_token_id=511),
                    r"config\.json: pad_token_id=511 but vocab\.json gives "
                    r"'<pad>' the id 0"),
    "decoder_start": (_edit_json("config.json", decoder_start_token_id=5),
                      r"config\.json: decoder_start_token_id=5 differs "
                      r"from pad_token_id=0"),
    "no_unk": (_rename_unk, r"vocab\.json: has no '<unk>'"),
    "separate_vocabs": (_edit_json("tokenizer_config.json",
                                   separate_vocabs=True),
                        r"tokenizer_config\.json: separate_vocabs=true"),
    "separate_heads": (_edit_json("config.json", decoder_attention_heads=2),
                       r"config\.json: decoder_attention_heads=2 differs"),
    "bart_embedding_norm": (_edit_weights(
        model__encoder__layernorm_embedding__weight=_ONE),
        r"model\.safetensors: holds model\.encoder\.layernorm_embedding"),
    "wrong_shape": (_edit_weights(
        model__encoder__layers__0__fc1__bias=lambda x: x[:-1]),
        r"model\.safetensors: does not fit config\.json: .*fc1|"
        r"model\.safetensors: .*w1"),
    "vocab_size": (_edit_json("config.json", vocab_size=500,
                              decoder_vocab_size=500),
                   r"config\.json: vocab_size=500 but vocab\.json has 512"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_leaves_no_workdir(case, hf_folder,
                                                     copy_model, tmp_path):
  change, message = BAD_INPUTS[case]
  source = _damaged(tmp_path, hf_folder, change)
  target = tmp_path / "out" / "run"
  with pytest.raises(ModelImportError, match=rf"^{source}/{message}") as e:
    _import(source, target, copy_model[0])
  assert "\n" not in str(e.value)
  assert not target.exists()
  assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_an_existing_workdir_is_refused(hf_folder, copy_model, tmp_path):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "notes.txt").write_text("mine")
  with pytest.raises(ModelImportError, match="exists and is not an empty"):
    _import(hf_folder[0], tmp_path / "run", copy_model[0])
  assert os.listdir(tmp_path / "run") == ["notes.txt"]
  (tmp_path / "run" / "notes.txt").unlink()  # an empty folder is used
  _import(hf_folder[0], tmp_path / "run", copy_model[0])
  assert checkpoints.all_steps(str(tmp_path / "run")) == [importer.STEP]


def test_a_failed_write_leaves_no_workdir(hf_folder, copy_model, tmp_path,
                                          monkeypatch):
  def fail(*args, **kwargs):
    raise OSError("disk full")
  monkeypatch.setattr(checkpoints, "save", fail)
  with pytest.raises(OSError, match="disk full"):
    _import(hf_folder[0], tmp_path / "run", copy_model[0])
  assert os.listdir(tmp_path) == []


def _mha_import(*args):
  return subprocess.run(
      [sys.executable, "-m", "mha.cli.import_", *args], cwd=REPO_ROOT,
      capture_output=True, text=True, timeout=600, check=False)


def test_command(hf_folder, tmp_path):
  config = f"--config={REPO_ROOT / 'configs' / 'quickstart.py'}:tiny"
  bad = _mha_import("--from=huggingface", f"--source={tmp_path}",
                    f"--workdir={tmp_path / 'w'}", config)
  assert bad.returncode == 1
  # python -m names the command import_.py; the console script mha-import.
  assert [line.split(": ", 1)[1] for line in bad.stderr.splitlines()
          if not line.startswith("I")] == [
      f"{tmp_path}/config.json: missing: --source is not a "
      "Hugging Face MarianMT folder."]
  assert not (tmp_path / "w").exists()
  good = _mha_import("--from=huggingface", f"--source={hf_folder[0]}",
                     f"--workdir={tmp_path / 'w'}", config)
  assert good.returncode == 0, good.stderr[-2000:]
  assert f"--config.init_from={tmp_path / 'w'}" in good.stdout
  saved = json.loads((tmp_path / "w" / "config.json").read_text())
  assert saved["d_model"] == 32 and saved["max_tokens"] != 768


# ------------------------------------------ a model made by transformers


@pytest.fixture(scope="module")
def transformers_model(copy_model, copy_workdir, tmp_path_factory):
  """A random MarianMTModel made by transformers (relu, post-LN, shared
  embeddings, zero biases, random layer norms, mha's special ids) with the
  copy model's SentencePiece model, saved by `save_pretrained`, and the
  workdir mha-import makes of it."""
  torch, _ = require_torch()
  config, model_config, _, tokenizer = copy_model
  model = random_marian_model(512, decoder_layers=3, activation="relu",
                              pad_id=0, eos_id=EOS)
  with torch.no_grad():
    for module in model.modules():
      if isinstance(module, torch.nn.LayerNorm):
        module.weight.normal_(1.0, 0.2)
        module.bias.normal_(0.0, 0.2)
  folder = tmp_path_factory.mktemp("transformers") / "model"
  model.save_pretrained(str(folder))
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  for name, content in hf_export.tokenizer_files(
      model_config, pieces,
      (copy_workdir / "spm.model").read_bytes()).items():
    (folder / name).write_bytes(content)
  workdir = tmp_path_factory.mktemp("from_transformers") / "run"
  _import(folder, workdir, config)
  return folder, workdir


@pytest.fixture(name="both_models")
def both_models_fixture(transformers_model, caplog):
  """((model, tokenizer) of transformers' folder, checked by `load`;
  `mha_model` of its import)."""
  folder, workdir = transformers_model
  return load(folder, caplog), mha_model(workdir)


@pytest.mark.torch
def test_transformers_model_imports_and_scores_as_transformers(
    transformers_model, both_models, copy_model):
  (model, hf_tokenizer), (_, model_config, params, tokenizer) = both_models
  assert (model_config.num_encoder_layers, model_config.num_decoder_layers
          ) == (2, 3)
  pairs = first_test_pairs(copy_model[0])
  ours = np.concatenate(mha_log_probs(
      model_config, params, [tokenizer.encode(s) + [EOS] for s, _ in pairs],
      [tokenizer.encode(t) + [EOS] for _, t in pairs]))
  theirs = np.concatenate(hf_log_probs(model, hf_tokenizer, pairs))
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)
  assert np.std(theirs) > 0.5  # not a uniform distribution
  # HF -> mha -> HF: the tensors transformers saved, bit for bit.
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top
  state = st.load_file(str(transformers_model[0] / "model.safetensors"))
  again = marian.params_to_marian(model_config, params)
  for name, tensor in again.items():
    np.testing.assert_array_equal(tensor, state[name], err_msg=name)


@pytest.mark.torch
def test_transformers_model_greedy_outputs_are_generates(both_models,
                                                         copy_model):
  (model, hf_tokenizer), (saved, model_config, params, tokenizer) = (
      both_models)
  sources = [s for s, _ in first_test_pairs(copy_model[0])]
  limits, ours = mha_outputs(model_config, params, tokenizer, sources,
                             saved.max_decode_extra)
  theirs = generate(model, hf_tokenizer, sources, limits, num_beams=1)
  assert theirs == ours
  assert len({tuple(o) for o in ours}) >= 4  # not one output
