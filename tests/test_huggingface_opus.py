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

import ml_collections
import numpy as np
import pytest

from conftest import TINY_WORKDIR_LOOP
from test_export import _mha_hypothesis
from test_export import mha_log_probs
from test_huggingface_import import _metrics
from test_separate_vocabulary import _synthetic
from test_separate_vocabulary import _train
from mha.data import sources as data_sources
from mha.huggingface import export as hf_export
from mha.huggingface import importer
from mha.model.transformer import TransformerConfig
from mha.search import texts as translate
from mha.store import trained

pytestmark = pytest.mark.torch
torch = pytest.importorskip(
    "torch", reason="torch is not installed (the [hf] extra's reader; CI's "
    "Python 3.11 run has it)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (the [hf] extra)")

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
  torch.manual_seed(0)
  model = transformers.MarianMTModel(transformers.MarianConfig(
      vocab_size=size, decoder_vocab_size=size, d_model=32,
      encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
      decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
      max_position_embeddings=64, activation_function="swish",
      scale_embedding=True, pad_token_id=size - 1, eos_token_id=0,
      decoder_start_token_id=size - 1, forced_eos_token_id=None,
      dropout=0.0, init_std=0.3, share_encoder_decoder_embeddings=True)
  ).eval()
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
  saved, tokenizer = trained.load_workdir(str(workdir))
  params, _, _ = trained.load_params(str(workdir))
  model_config = TransformerConfig.from_config(saved, deterministic=True)
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
  labels = batch["labels"].numpy()
  hf_targets = [mha_id[row[row != pad]].tolist() for row in labels]
  ids = batch["input_ids"].numpy()
  assert [mha_id[row[row != pad]].tolist() for row in ids] == [
      tokenizer.encode(s) + [EOS] for s, _ in pairs]
  assert hf_targets == [tokenizer.encode(t, side="target") + [EOS]
                        for _, t in pairs]
  assert hf_targets != [tokenizer.encode(t) + [EOS] for _, t in pairs]
  with torch.no_grad():
    logits = model(input_ids=batch["input_ids"],
                   attention_mask=batch["attention_mask"],
                   labels=batch["labels"]).logits
  log_probs = torch.log_softmax(logits, -1).numpy()
  picked = np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
  theirs = np.concatenate([row[:len(t)] for row, t in zip(picked,
                                                          hf_targets)])
  ours = np.concatenate(mha_log_probs(
      model_config, params, [tokenizer.encode(s) + [EOS] for s, _ in pairs],
      hf_targets))
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)
  assert np.std(theirs) > 0.5  # not a uniform distribution


def test_imported_opus_model_greedy_outputs_are_generates(opus):
  folder, workdir, pairs, order = opus
  model, hf_tokenizer, model_config, params, tokenizer = _loaded(
      folder, workdir)
  extra = 10
  sources = [s for s, _ in pairs]
  outputs = translate.translate_ids(
      model_config, params, tokenizer, sources, beam_size=1, alpha=0.0,
      max_decode_extra=extra)
  limits = [min(len(src) + extra, model_config.max_len)
            for src, _ in outputs]
  ours = [_mha_hypothesis(out, limit)
          for (_, out), limit in zip(outputs, limits)]
  mha_id = np.argsort(order)
  theirs = []
  for source, limit in zip(sources, limits):
    batch = hf_tokenizer([source], return_tensors="pt")
    with torch.no_grad():
      out = model.generate(**batch, max_length=limit + 1, do_sample=False,
                           num_beams=1)[0].numpy()
    assert out[0] == model.config.decoder_start_token_id
    theirs.append(_mha_hypothesis(mha_id[out[1:]].tolist(), limit))
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
  from mha.train import trainer  # pylint: disable=g-import-not-at-top
  _, workdir, _, _ = opus
  saved, _ = trained.load_workdir(str(workdir))
  config = ml_collections.ConfigDict(saved.to_dict())
  config.update(TINY_WORKDIR_LOOP)
  config.update(num_train_steps=12, log_every_steps=1, eval_every_steps=100,
                checkpoint_every_steps=12, init_from=str(workdir),
                learning_rate_schedule="constant_warmup", warmup_steps=1,
                learning_rate_scale=0.02)
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MHA_TFDS_DIR", str(tmp_path / "tfds"))
    trainer.train_and_evaluate(config, str(tmp_path / "tuned"))
  losses = [m["loss"] for m in _metrics(tmp_path / "tuned") if "loss" in m]
  assert len(losses) >= 10, losses
  assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
  for name in ("source.spm", "target.spm", "vocab.json"):
    assert ((tmp_path / "tuned" / name).read_bytes()
            == (workdir / name).read_bytes())
