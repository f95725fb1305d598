"""What the Hugging Face tests share: transformers' side of the comparisons.

tests/test_huggingface_torch.py (the export read by transformers),
tests/test_huggingface_import.py (a model made by transformers imported)
and tests/test_huggingface_opus.py (an OPUS-MT-like one) compare mha with
transformers' own computation through these: `load` (a folder loaded with
no missing weight and no warning), `hf_log_probs` (teacher-forced
log-probabilities), `generate` (greedy or beam outputs, one call per
source with mha's length limit), `random_marian_model` (the random
MarianMTModel the import tests make), and on mha's side `mha_model` (a
workdir's parameters) and `mha_outputs` (its search's outputs cut as
`generate`'s are). `assert_warm_start_fine_tunes` fine-tunes an imported
workdir a few steps.

torch and transformers are imported on first use (`require_torch`): the
caller is skipped with the reason where they are not installed.
"""
import json
import logging
import os

import ml_collections
import numpy as np
import pytest

from conftest import TINY_WORKDIR_LOOP
from test_export import _mha_hypothesis
from mha.model.transformer import TransformerConfig
from mha.search import texts as translate
from mha.store import trained


def require_torch():
  """(torch, transformers); the calling test, fixture or module skipped
  with the reason where one is not installed."""
  torch = pytest.importorskip(
      "torch", reason="torch is not installed (the [hf] extra's reader; CI's "
      "Python 3.11 run has it)")
  transformers = pytest.importorskip(
      "transformers", reason="transformers is not installed (the [hf] extra)")
  return torch, transformers


def load(folder, caplog):
  """(model, tokenizer) of the folder; asserts that loading reported
  nothing: no missing, unexpected or mismatched weight, no warning."""
  _, transformers = require_torch()
  transformers.logging.enable_propagation()
  with caplog.at_level(logging.WARNING, logger="transformers"):
    model, info = transformers.MarianMTModel.from_pretrained(
        str(folder), output_loading_info=True)
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(folder))
  assert not any(info.values()), info
  assert not [r for r in caplog.records if r.name.startswith("transformers")
              and r.levelno >= logging.WARNING], caplog.text
  model.eval()
  return model, tokenizer


def hf_log_probs(model, tokenizer, pairs):
  """Teacher-forced log P(y_t | y_<t, x) of each target token (EOS
  included), the batch made by the tokenizer alone, in transformers' ids."""
  torch, _ = require_torch()
  batch = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs],
                    padding=True, return_tensors="pt")
  with torch.no_grad():
    logits = model(input_ids=batch["input_ids"],
                   attention_mask=batch["attention_mask"],
                   labels=batch["labels"]).logits
  log_probs = torch.log_softmax(logits, -1).numpy()
  labels = batch["labels"].numpy()
  picked = np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
  pad = model.config.pad_token_id
  return [row[:int((label != pad).sum())]
          for row, label in zip(picked, labels)]


def generate(model, hf_tokenizer, sources, limits, mha_id=None, **settings):
  """transformers' output ids (start token dropped, up to EOS) of each
  source, one call per source with mha's limit (max_length counts the
  start token), in mha's ids: `mha_id[i]` is Marian's id i's (None: the
  ids are mha's)."""
  torch, _ = require_torch()
  outputs = []
  for source, limit in zip(sources, limits):
    batch = hf_tokenizer([source], return_tensors="pt")
    with torch.no_grad():
      out = model.generate(**batch, max_length=limit + 1, do_sample=False,
                           **settings)[0].numpy()
    assert out[0] == model.config.decoder_start_token_id
    ids = out[1:] if mha_id is None else mha_id[out[1:]]
    outputs.append(_mha_hypothesis(ids.tolist(), limit))
  return outputs


def mha_model(workdir):
  """(saved config, model config, parameters, tokenizer) of a workdir, the
  model deterministic."""
  saved, tokenizer = trained.load_workdir(str(workdir))
  params, _, _ = trained.load_params(str(workdir))
  model_config = TransformerConfig.from_config(saved, deterministic=True)
  return saved, model_config, params, tokenizer


def mha_outputs(model_config, params, tokenizer, sources, extra: int,
                beam_size: int = 1, alpha: float = 0.0):
  """(limits, outputs): mha's length limit of each source (its ids +
  `extra`, at most max_len) and its output ids cut as `generate`'s are."""
  pairs = translate.translate_ids(model_config, params, tokenizer, sources,
                                  beam_size=beam_size, alpha=alpha,
                                  max_decode_extra=extra)
  limits = [min(len(src) + extra, model_config.max_len) for src, _ in pairs]
  return limits, [_mha_hypothesis(out, limit)
                  for (_, out), limit in zip(pairs, limits)]


def random_marian_model(vocab_size: int, *, decoder_layers: int,
                        activation: str, pad_id: int, eos_id: int):
  """A random MarianMTModel made by transformers (torch seed 0, eval
  mode): d_model 32, 4 heads, d_ff 64, 2 encoder layers, 64 positions,
  scaled and shared embeddings, init_std 0.3, no dropout; `pad_id` is
  also the decoder's start."""
  torch, transformers = require_torch()
  torch.manual_seed(0)
  return transformers.MarianMTModel(transformers.MarianConfig(
      vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=32,
      encoder_layers=2, decoder_layers=decoder_layers,
      encoder_attention_heads=4, decoder_attention_heads=4,
      encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
      activation_function=activation, scale_embedding=True,
      pad_token_id=pad_id, eos_token_id=eos_id,
      decoder_start_token_id=pad_id, forced_eos_token_id=None, dropout=0.0,
      init_std=0.3, share_encoder_decoder_embeddings=True)).eval()


def _losses(workdir) -> list[float]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [record["loss"] for record in map(json.loads, f)
            if "loss" in record]


def assert_warm_start_fine_tunes(workdir, tuned, vocabulary) -> None:
  """12 steps of the tiny loop into `tuned`, warm-started from `workdir`
  (`init_from`, the constant learning rate 0.02 after 1 warm-up step): the
  loss falls, and the files named in `vocabulary` are `workdir`'s."""
  from mha.train import trainer  # pylint: disable=import-outside-toplevel
  saved, _ = trained.load_workdir(str(workdir))
  config = ml_collections.ConfigDict(saved.to_dict())
  config.update(TINY_WORKDIR_LOOP)
  config.update(num_train_steps=12, log_every_steps=1, eval_every_steps=100,
                checkpoint_every_steps=12, init_from=str(workdir),
                learning_rate_schedule="constant_warmup", warmup_steps=1,
                learning_rate_scale=0.02)
  trainer.train_and_evaluate(config, str(tuned))
  losses = _losses(tuned)
  assert len(losses) >= 10, losses
  assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
  for name in vocabulary:
    assert (tuned / name).read_bytes() == (workdir / name).read_bytes(), name
