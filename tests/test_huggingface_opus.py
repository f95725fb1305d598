"""mha-import of an OPUS-MT-like MarianMTModel made by transformers.

The model has what OPUS-MT's have and mha's paper model lacks: the swish
activation, random non-zero attention biases and final_logits_bias,
Marian's ids (</s> 0, <unk> 1, <pad> last: the decoder's start), separate
source and target SentencePiece models (trained here) and one vocab.json
built from both. After the import, mha computes what transformers
computes: teacher-forced log-probabilities to 1e-4 per token (Marian's
LayerNorm ε 1e-5 is imported: the difference is float32 rounding), greedy
outputs equal to `generate(num_beams=1)`'s, and the ids of each sentence
are transformers' mapped by the import's permutation.
"""
import json

import numpy as np
import pytest

from hf_reference import assert_warm_start_fine_tunes
from hf_reference import generate
from hf_reference import hf_log_probs
from hf_reference import mha_model
from hf_reference import mha_outputs
from hf_reference import random_marian_model
from hf_reference import require_torch
from test_export import mha_log_probs
from test_separate_vocabulary import _synthetic
from test_separate_vocabulary import _train
from mha.data import sources as data_sources
from mha.huggingface import export as hf_export
from mha.huggingface import importer

pytestmark = pytest.mark.torch
torch, transformers = require_torch()

EOS = 1  # mha's


@pytest.fixture(name="opus", scope="module")
def opus_fixture(tmp_path_factory):
  """(folder, workdir, pairs, order): the transformers model's folder, its
  import, test sentences and Marian's id of each mha id."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MHA_TFDS_DIR",
                 str(tmp_path_factory.getbasetemp() / "tfds"))
    source_text, target_text = [], []
    for chunk_sources, chunk_targets in data_sources.open_split(
        _synthetic(), "train").read(2000):
      source_text += chunk_sources
      target_text += chunk_targets
    pairs = list(zip(*next(iter(data_sources.open_split(
        _synthetic(), "test").read(8)))))[:8]
  models = {"source.spm": _train(source_text, 60),
            "target.spm": _train(target_text, 50)}
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  pieces = set()
  for proto in models.values():
    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces |= {sp.id_to_piece(i) for i in range(sp.get_piece_size())
               if not (sp.is_control(i) or sp.is_unknown(i))}
  vocab = {"</s>": 0, "<unk>": 1}
  vocab.update({p: 2 + i for i, p in enumerate(sorted(pieces))})
  vocab["<pad>"] = size = len(vocab)
  size += 1
  model = random_marian_model(size, decoder_layers=2, activation="swish",
                              pad_id=size - 1, eos_id=0)
  with torch.no_grad():
    for name, tensor in model.named_parameters():
      if name.endswith("_proj.bias") or "layer_norm" in name:
        tensor.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.3)
    model.final_logits_bias.normal_(0.0, 1.0)
  folder = tmp_path_factory.mktemp("opus") / "model"
  model.save_pretrained(str(folder))
  for name, content in models.items():
    (folder / name).write_bytes(content)
  (folder / "vocab.json").write_text(json.dumps(vocab))
  (folder / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "MarianTokenizer", "separate_vocabs": False,
      "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}))
  workdir = tmp_path_factory.mktemp("opus_import") / "run"
  importer.import_model(str(folder), str(workdir), _synthetic())
  order = np.array([size - 1, 0, 1] + list(range(2, size - 1)))
  return folder, workdir, pairs, order


def _loaded(folder, workdir):
  model = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
  hf_tokenizer = transformers.MarianTokenizer.from_pretrained(str(folder))
  _, model_config, params, tokenizer = mha_model(workdir)
  return model, hf_tokenizer, model_config, params, tokenizer


def test_imported_opus_model_scores_as_transformers(opus):
  folder, workdir, pairs, order = opus
  model, hf_tokenizer, model_config, params, tokenizer = _loaded(
      folder, workdir)
  assert (model_config.ffn_activation, model_config.attention_bias,
          model_config.output_bias, model_config.layer_norm_epsilon) == (
              "swish", True, True, 1e-5)
  batch = hf_tokenizer([s for s, _ in pairs],
                       text_target=[t for _, t in pairs], padding=True,
                       return_tensors="pt")
  pad = model.config.pad_token_id
  mha_id = np.argsort(order)  # Marian's id -> mha's
  hf_targets = [mha_id[row[row != pad]].tolist()
                for row in batch["labels"].numpy()]
  ids = batch["input_ids"].numpy()
  assert [mha_id[row[row != pad]].tolist() for row in ids] == [
      tokenizer.encode(s) + [EOS] for s, _ in pairs]
  assert hf_targets == [tokenizer.encode(t, side="target") + [EOS]
                        for _, t in pairs]
  assert hf_targets != [tokenizer.encode(t) + [EOS] for _, t in pairs]
  theirs = np.concatenate(hf_log_probs(model, hf_tokenizer, pairs))
  ours = np.concatenate(mha_log_probs(
      model_config, params, [tokenizer.encode(s) + [EOS] for s, _ in pairs],
      hf_targets))
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)
  assert np.std(theirs) > 0.5  # not a uniform distribution


def test_imported_opus_model_greedy_outputs_are_generates(opus):
  folder, workdir, pairs, order = opus
  model, hf_tokenizer, model_config, params, tokenizer = _loaded(
      folder, workdir)
  sources = [s for s, _ in pairs]
  limits, ours = mha_outputs(model_config, params, tokenizer, sources, 10)
  theirs = generate(model, hf_tokenizer, sources, limits,
                    mha_id=np.argsort(order), num_beams=1)
  assert theirs == ours
  assert len({tuple(o) for o in ours}) >= 4  # not one output


def test_hf_to_mha_to_hf_is_exact_up_to_the_id_permutation(opus, tmp_path):
  """The export of the import: both SentencePiece models as they were,
  vocab.json in mha's ids, every tensor bit-identical, the vocabulary rows
  in mha's order."""
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top
  folder, workdir, _, order = opus
  again = tmp_path / "again"
  hf_export.export_model(str(workdir), str(again))
  for name in ("source.spm", "target.spm"):
    assert (again / name).read_bytes() == (folder / name).read_bytes()
  marian_ids = json.loads((folder / "vocab.json").read_text())
  mha_id = np.argsort(order)
  assert json.loads((again / "vocab.json").read_text()) == {
      piece: int(mha_id[i]) for piece, i in marian_ids.items()}
  exported = json.loads((again / "config.json").read_text())
  assert (exported["pad_token_id"], exported["eos_token_id"],
          exported["decoder_start_token_id"]) == (0, 1, 0)
  state = st.load_file(str(folder / "model.safetensors"))
  second = st.load_file(str(again / "model.safetensors"))
  assert set(second) <= set(state)
  for name, tensor in second.items():
    want = state[name]
    if name == "model.shared.weight":
      want = want[order]
    elif name == "final_logits_bias":
      want = want[:, order]
    np.testing.assert_array_equal(tensor, want, err_msg=name)


def test_a_warm_start_from_the_opus_import_fine_tunes(opus, tmp_path):
  """A few steps on the synthetic pair from the import (`init_from`): the
  run takes the separate vocabulary and the loss falls."""
  _, workdir, _, _ = opus
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MHA_TFDS_DIR", str(tmp_path / "tfds"))
    assert_warm_start_fine_tunes(workdir, tmp_path / "tuned",
                                 ("source.spm", "target.spm", "vocab.json"))
