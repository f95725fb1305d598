"""The in-training BLEU (`mha.train.evals.BeamBleu`): its sentences are
searched as one search (batches of 64 sentences a device, each device's
share refilled), with the translations that batches of 64 give
(mha.evaluation.evaluator's batching), and so the BLEU."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import sacrebleu

import mha
from configs import quickstart
from mha import data
from mha.train import devices
from mha.scoring import metric_table
from mha.scoring.corpus import Corpus
from mha.search import texts as translate
from mha.train import evals as train_evals


@pytest.mark.parametrize("sentences, beam, devices, want", [
    # One device: batches of 64 searched as one with refilled rows, each
    # with 64 rows (sentences x beam) or more.
    (100, 4, 1, 64),    # Multi30k's 100: 64 and 36 (40 rows x 4)
    (256, 4, 1, 64),
    (70, 4, 1, 35),     # 64 and 6 (8 x 4 rows: too few): 35 and 35
    (3, 4, 1, 3),       # one batch
    (100, 1, 1, 100),   # greedy: 64 and 36 rows, 50 and 50 too few: one
    # Several devices (a batch's sentences split over them): batches of
    # 64 a device searched as one, each device's share refilled.
    (1000, 4, 2, 128),  # 7 x 128 and 104 (52 x 4 rows a device)
    (136, 4, 2, 68),    # 128 and 8 (4 x 4 rows a device: too few)
    (130, 1, 2, 130),   # greedy: 128 and 2, 65 and 65 too few: one batch,
    (1100, 1, 2, 1024),  # of up to 512 rows a device
    (256, 4, 8, 256),   # one batch: 128 rows each
    (100, 4, 4, 100),
])
def test_bleu_batch_size(sentences, beam, devices, want):
  assert train_evals.bleu_batch_size(sentences, beam, devices) == want


@pytest.mark.parametrize("sentences, num_devices", [
    (65, 1), (70, 1), (100, 1), (128, 1), (193, 1), (300, 1),
    (136, 2), (300, 2), (600, 4)])
def test_the_bleu_batches_are_one_refilled_search(sentences, num_devices):
  # What translate.decode_batches searches as one (one program compiled).
  rng = np.random.default_rng(sentences)
  encoded = [list(rng.integers(3, 50, n)) + [1]
             for n in rng.integers(3, 40, sentences)]
  for beam in (2, 4):
    batches = translate.make_batches(
        encoded, max_len=64, max_decode_extra=50,
        batch_size=train_evals.bleu_batch_size(sentences, beam, num_devices))
    assert len(batches) >= 2
    groups = translate._refill_groups(  # pylint: disable=protected-access
        batches, tuple(jax.local_devices()[:num_devices]), beam)
    assert groups == [list(range(len(batches)))], (beam, groups)


def test_beam_bleu_searches_one_batch_with_the_translations_of_64(
    random_workdir, monkeypatch):
  translator = mha.load(str(random_workdir))
  config = translator.config.copy_and_resolve_references()
  config.eval_bleu_sentences = 72  # in batches of 64: two (64 and 8)
  pairs = data.load_text_pairs(quickstart.get_config(), "test[:72]")
  bleu = train_evals.BeamBleu(config, translator.tokenizer,
                              translator.model_config)
  bleu._pairs = pairs  # pylint: disable=protected-access  (read once)
  searched = []  # (batches, translations) of each call
  make_batches = translate.make_batches
  translate_with_ids = translate.translate_with_ids

  def recording_texts(*args, **kwargs):
    translations = translate_with_ids(*args, **kwargs)
    searched[-1].append(translations.texts)
    return translations

  monkeypatch.setattr(translate, "make_batches", lambda encoded, **kw: (
      searched.append([make_batches(encoded, **kw)]) or searched[-1][0]))
  monkeypatch.setattr(translate, "translate_with_ids", recording_texts)
  params = translator.params.params
  got = bleu(devices.pmap_replicate(params, jax.local_devices()))
  want = train_evals.evaluate_bleu(translator.model_config, params,
                                   translator.tokenizer, *pairs, config)
  (one, got_texts), (two, want_texts) = searched
  assert [b.inputs.shape[0] for b in one] == [72]
  # The second batch's 8 sentences in a full batch's 64 rows.
  assert [(b.inputs.shape[0], len(b.indices)) for b in two] == [(64, 64),
                                                                (64, 8)]
  assert got_texts == want_texts and len(set(want_texts)) > 30
  assert got["eval_bleu"] == want["eval_bleu"]


def test_evaluations_are_due_every_eval_every_steps_and_at_the_last():
  """Due at every `eval_every_steps`-th step and at the last step, also
  when the last is not a multiple of it."""
  config = ml_collections.ConfigDict(dict(eval_every_steps=4,
                                          num_train_steps=10))
  bleu = train_evals.BeamBleu(config, None, None)
  assert [step for step in range(1, 11) if bleu.due(step)] == [4, 8, 10]


def test_dev_loss_is_the_token_weighted_mean_over_batches_and_devices(
    monkeypatch):
  """The metric sums of every batch (each over all devices) divided by the
  tokens: loss and NLL per token, perplexity exp(NLL), accuracy."""
  def sums_step(model, config):
    del model, config

    def step(params, batch):
      del params
      t = batch["targets"].astype(jnp.float32)
      w = (t > 0).astype(jnp.float32)
      return jax.lax.psum({"loss": (w * t).sum(), "nll": (w * t / 4).sum(),
                           "correct": (w * (t < 5)).sum(), "tokens": w.sum()},
                          devices.AXIS)
    return step

  rng = np.random.default_rng(0)
  batches = []
  for rows, length in ((8, 4), (4, 8)):
    targets = rng.integers(1, 10, (rows, length)) * (
        rng.random((rows, length)) < 0.7)
    batches.append({"inputs": targets.copy(), "targets": targets})
  monkeypatch.setattr(train_evals, "make_eval_step", sums_step)
  monkeypatch.setattr(train_evals.data, "eval_batches",
                      lambda config, tokenizer, split: batches)
  dev = train_evals.DevLoss(ml_collections.ConfigDict(dict(eval_split="dev")),
                            None, model=object())
  got = dev.evaluate_params({"w": np.zeros(1, np.float32)})
  t = np.concatenate([b["targets"].ravel() for b in batches]).astype(float)
  w = t > 0
  nll = (t[w] / 4).sum() / w.sum()
  assert got["eval_loss"] == pytest.approx(t[w].sum() / w.sum())
  assert got["eval_nll"] == pytest.approx(nll)
  assert got["eval_perplexity"] == pytest.approx(np.exp(nll))
  assert got["eval_accuracy"] == pytest.approx((t[w] < 5).sum() / w.sum())


def test_beam_bleu_reads_the_first_pairs_of_the_split(monkeypatch):
  """BeamBleu scores the first `eval_bleu_sentences` sources of
  `eval_split` against their own references."""
  sources = [f"source {i}" for i in range(5)]
  references = [f"reference {i}" for i in range(5)]
  monkeypatch.setattr(train_evals.data, "load_text_pairs",
                      lambda config, split: (sources, references)
                      if split == "dev" else None)
  scored = []
  monkeypatch.setattr(train_evals, "evaluate_bleu",
                      lambda model_config, params, tok, s, r, config,
                      batch_size: scored.append((s, r)) or {})
  config = ml_collections.ConfigDict(dict(eval_split="dev", beam_size=4,
                                          eval_bleu_sentences=3))
  bleu = train_evals.BeamBleu(config, None, None)
  bleu(devices.pmap_replicate({"w": np.zeros(1)}, jax.local_devices()))
  assert scored == [(sources[:3], references[:3])]


def test_evaluate_bleu_reports_the_searchs_scores_and_times(monkeypatch):
  """Each metric of the table reported in training is `eval_<name>`, as the
  table's function gives it for the translations (eval_bleu and eval_chrf
  sacreBLEU's called here), and nothing else but the speed (sentences per
  second of the search) and the compile time, its own part."""
  texts = ["the cat sat on the mat", "a dog", "it rains today"]
  references = ["the cat sat on a mat", "the dog", "it rains today"]
  monkeypatch.setattr(translate, "translate_with_ids", lambda *a, **k: (
      translate.Translations(texts, [None] * 3, [None] * 3, seconds=1.5,
                             compile_seconds=0.5)))
  config = quickstart.get_config()
  got = train_evals.evaluate_bleu(None, None, None, ["x"] * 3, references,
                                  config)
  corpus = Corpus(texts, references, lang=config.target_lang)
  reported = metric_table.in_training()
  assert {"bleu", "chrf"} <= {metric.name for metric in reported}
  assert "bleu_paper" not in {metric.name for metric in reported}
  for metric in reported:
    assert got[f"eval_{metric.name}"] == metric.compute(corpus).value
  assert set(got) == {f"eval_{metric.name}" for metric in reported} | {
      "eval_decode_sentences_per_sec", "eval_decode_compile_seconds"}
  assert got["eval_bleu"] == pytest.approx(
      sacrebleu.metrics.BLEU().corpus_score(texts, [references]).score)
  assert got["eval_chrf"] == pytest.approx(
      sacrebleu.metrics.CHRF().corpus_score(texts, [references]).score)
  assert got["eval_bleu"] != got["eval_chrf"]
  assert 0 < got["eval_bleu"] < 100 and 0 < got["eval_chrf"] < 100
  assert got["eval_decode_sentences_per_sec"] == pytest.approx(3 / 1.5)
  assert got["eval_decode_compile_seconds"] == 0.5
