"""The Hugging Face export read by transformers itself (PyTorch MarianMT).

`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load
the folder with no missing, unexpected or mismatched weight; on the copy
model of tests/test_export.py transformers' teacher-forced log-probabilities
equal mha's to 1e-4 per token, its greedy outputs are mha's given mha's
length limit, its tokenizer gives mha's ids, its `generate` and
`batch_decode` (greedy) give mha's text; beam 4 agreement is measured
(transformers' length penalty is length^α, not GNMT's: docs/evaluation.md).
transformers 5 has no "translation" pipeline: the README's lines of
`generate` and `batch_decode` are run and give mha's greedy text.

Needs torch and transformers (the [hf] extra): marked `torch`, skipped
with that reason where they are not installed.
"""
import numpy as np
import pytest
import sacrebleu

from conftest import tiny_config
from hf_reference import generate
from hf_reference import hf_log_probs
from hf_reference import load
from hf_reference import mha_outputs
from hf_reference import require_torch
from test_export import first_test_pairs
from test_export import mha_log_probs
from test_export import random_params
from test_export import write_workdir
# pylint: disable=unused-import  (fixtures, found by name)
from test_export import copy_model  # noqa: F401
from test_export import copy_workdir  # noqa: F401
from test_huggingface import hf_folder  # noqa: F401
from test_huggingface import safetensors_numpy_fixture  # noqa: F401
# pylint: enable=unused-import
from test_readme import python_blocks
from test_readme import readme_section
import mha
from mha.huggingface import export as hf_export
from mha.huggingface import marian
from mha.model.positional import sinusoidal_encoding
from mha.model.transformer import TransformerConfig
from mha.search import texts as translate

pytestmark = pytest.mark.torch
torch, _ = require_torch()

EOS = 1


def test_transformers_computes_mha_log_probs_and_ids(hf_folder, copy_model,
                                                     caplog):
  config, model_config, params, tokenizer = copy_model
  model, hf_tokenizer = load(hf_folder[0], caplog)
  pairs = first_test_pairs(config)
  source_ids = [tokenizer.encode(s) + [EOS] for s, _ in pairs]
  target_ids = [tokenizer.encode(t) + [EOS] for _, t in pairs]
  assert [hf_tokenizer(s)["input_ids"] for s, _ in pairs] == source_ids
  assert [hf_tokenizer(text_target=t)["input_ids"]
          for _, t in pairs] == target_ids
  ours = np.concatenate(mha_log_probs(model_config, params, source_ids,
                                      target_ids))
  theirs = np.concatenate(hf_log_probs(model, hf_tokenizer, pairs))
  np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-4)
  # Marian's layer norms' ε (1e-5, flax's 1e-6) is all that differs: with
  # flax's, transformers agrees to float32 rounding.
  for module in model.modules():
    if isinstance(module, torch.nn.LayerNorm):
      module.eps = 1e-6
  same_eps = np.concatenate(hf_log_probs(model, hf_tokenizer, pairs))
  np.testing.assert_allclose(same_eps, ours, rtol=0, atol=1e-5)
  print(f"max |log p difference|: ε 1e-5 {np.abs(theirs - ours).max():.2e}"
        f", ε 1e-6 {np.abs(same_eps - ours).max():.2e}")


def test_marian_makes_our_positions_permuted(hf_folder, copy_model, caplog):
  model, _ = load(hf_folder[0], caplog)
  model_config = copy_model[1]
  table = model.model.encoder.embed_positions.weight.detach().numpy()
  np.testing.assert_array_equal(
      table, sinusoidal_encoding(model_config.max_len, model_config.d_model)[
          :, marian.model_permutation(model_config.d_model)])


def _mha_outputs(copy_model, beam_size, alpha):
  config, model_config, params, tokenizer = copy_model
  sources = [s for s, _ in first_test_pairs(config)]
  limits, outputs = mha_outputs(model_config, params, tokenizer, sources,
                                config.max_decode_extra, beam_size, alpha)
  return sources, limits, outputs


def test_greedy_outputs_identical_to_mha(hf_folder, copy_model, caplog):
  model, hf_tokenizer = load(hf_folder[0], caplog)
  sources, limits, ours = _mha_outputs(copy_model, 1, 0.0)
  theirs = generate(model, hf_tokenizer, sources, limits, num_beams=1)
  assert theirs == ours
  # Not trivial: several lengths, some ended by EOS, some by the limit.
  assert 2 <= len([o for o in ours if o[-1] == EOS and len(o) > 2]) < len(ours)
  assert len({len(o) for o in ours}) >= 4


def test_the_readmes_transformers_lines_give_mha_s_greedy_text(
    hf_folder, copy_model, capsys):
  # README "Using a trained model": its transformers block, run on the
  # export with test sentences in place of the quickstart's, prints mha's
  # greedy text. `generate` there has no length limit of mha's: sentences
  # whose greedy output ended with EOS before mha's limit.
  (block,) = [b for b in python_blocks(readme_section("Using a trained model"))
              if "transformers" in b]
  sentence = "guno duma ri moge nigo ri ponoru pabo"
  assert block.count(sentence) == 1
  assert block.count("workdirs/quickstart_hf") == 2
  sources, _, ours = _mha_outputs(copy_model, 1, 0.0)
  ended = [(s, o) for s, o in zip(sources, ours)
           if o[-1] == EOS and len(o) > 2][:4]
  assert len(ended) >= 2
  for source, out in ended:
    code = block.replace("workdirs/quickstart_hf", str(hf_folder[0])).replace(
        sentence, source.replace('"', '\\"'))
    capsys.readouterr()
    exec(compile(code, "README.md", "exec"), {})  # pylint: disable=exec-used
    printed = capsys.readouterr().out
    assert printed == f"{[translate.detokenize(copy_model[3], out)]!r}\n"


def test_beam_4_agreement_measured(hf_folder, copy_model, caplog):
  """mha's beam 4 (GNMT's penalty, α = 0.6) beside transformers' (the
  export's generation config: length_penalty = α on length^α,
  early_stopping="never"): the share of identical outputs, which
  docs/evaluation.md reports (18 of 24 here)."""
  model, hf_tokenizer = load(hf_folder[0], caplog)
  sources, limits, ours = _mha_outputs(copy_model, 4, 0.6)
  theirs = generate(model, hf_tokenizer, sources, limits)
  same = sum(a == b for a, b in zip(ours, theirs))
  print(f"beam 4: {same}/{len(ours)} outputs identical")
  assert same >= len(ours) // 2


def test_unshared_embeddings_load_and_score(tmp_path, caplog,
                                            safetensors_numpy, tiny_workdir):
  """Separate encoder and decoder embeddings and an output projection with
  a bias (lm_head untied, final_logits_bias its bias), random parameters."""
  del safetensors_numpy
  config = tiny_config(share_embeddings=False)
  model_config = TransformerConfig.from_config(config, deterministic=True)
  params = random_params(model_config, seed=7)
  workdir = write_workdir(tmp_path / "run", config, params,
                          tiny_workdir / "spm.model")
  hf_export.export_model(str(workdir), str(tmp_path / "hf"))
  model, _ = load(tmp_path / "hf", caplog)
  rng = np.random.default_rng(0)
  sources = [list(rng.integers(3, 64, 9)) + [EOS] for _ in range(4)]
  targets = [list(rng.integers(3, 64, 7)) + [EOS] for _ in range(4)]
  ours = mha_log_probs(model_config, params, sources, targets)
  with torch.no_grad():
    logits = model(input_ids=torch.tensor(sources),
                   labels=torch.tensor(targets)).logits
  theirs = torch.log_softmax(logits, -1).numpy()
  for mine, hf, target in zip(ours, theirs, targets):
    np.testing.assert_allclose(hf[np.arange(len(target)), target], mine,
                               rtol=0, atol=1e-4)


def test_the_bleu_script_scores_both_engines(copy_workdir, copy_model,
                                             hf_folder, caplog):
  # scripts/huggingface_bleu.py (docs/evaluation.md's Multi30k figures):
  # greedy outputs all the same text, so the same BLEU; each engine's BLEU
  # of each search, and the beam outputs in common, as computed here from
  # mha.load's translations and transformers' generate sentence by
  # sentence.
  from scripts import huggingface_bleu  # pylint: disable=import-outside-toplevel
  pairs = first_test_pairs(copy_model[0])
  sources_ = [source for source, _ in pairs]
  references = [reference for _, reference in pairs]
  greedy, beam = huggingface_bleu.compare(str(copy_workdir), sources_,
                                          references, batch_size=8)
  assert (greedy["search"], greedy["same"]) == ("greedy", len(pairs))
  assert greedy["transformers"] == greedy["mha"]
  translator = mha.load(str(copy_workdir))
  beam_size = translator.defaults.beam_size
  assert beam["search"] == f"beam {beam_size}" and beam_size > 1
  for row, size in ((greedy, 1), (beam, beam_size)):
    ours = translator.translate(sources_, beam_size=size)
    assert row["mha"] == pytest.approx(
        sacrebleu.corpus_bleu(ours, [references]).score)
  model, hf_tokenizer = load(hf_folder[0], caplog)
  _, model_config, params, tokenizer = copy_model
  limits, _ = mha_outputs(model_config, params, tokenizer, sources_,
                          translator.defaults.max_decode_extra)
  theirs = [translate.detokenize(tokenizer, ids) for ids in generate(
      model, hf_tokenizer, sources_, limits, num_beams=beam_size,
      length_penalty=translator.defaults.alpha, early_stopping="never")]
  assert beam["transformers"] == pytest.approx(
      sacrebleu.corpus_bleu(theirs, [references]).score)
  assert beam["same"] == sum(a == b for a, b in zip(ours, theirs))
  assert beam["sentences"] == len(pairs)
