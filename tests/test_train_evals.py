"""The in-training BLEU (`mha.train_evals.BeamBleu`): its sentences are
searched in one batch where they fit, with the translations that batches of
64 give (mha.evaluator's batching), and so the BLEU."""
import jax
import pytest

import mha
from configs import quickstart
from mha import data
from mha import devices
from mha import translate
from mha import train_evals


@pytest.mark.parametrize("sentences, beam, devices, want", [
    (100, 4, 1, 100),   # Multi30k's 100: one batch (400 rows)
    (256, 4, 1, 128),   # 512 rows a device
    (256, 4, 8, 256),   # split over 8 devices: 128 rows each
    (1000, 1, 1, 512),  # greedy: a row a sentence
    (3, 4, 1, 3),
])
def test_bleu_batch_size(sentences, beam, devices, want):
  assert train_evals.bleu_batch_size(sentences, beam, devices) == want


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
