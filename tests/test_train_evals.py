"""The in-training BLEU (`mha.train_evals.BeamBleu`): its sentences are
searched as one search (batches of 64 sentences a device, each device's
share refilled), with the translations that batches of 64 give
(mha.evaluator's batching), and so the BLEU."""
import jax
import numpy as np
import pytest

import mha
from configs import quickstart
from mha import data
from mha import devices
from mha import translate
from mha import train_evals


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
  assert [b.inputs.shape[0] for b in two] == [64, 8]
  assert got_texts == want_texts and len(set(want_texts)) > 30
  assert got["eval_bleu"] == want["eval_bleu"]
