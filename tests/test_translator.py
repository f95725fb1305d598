"""mha.load and the Translator on a trained tiny workdir: the same
translations as eval.py's path, n-best lists, samples and scores through the
translation layer, blank lines, and bad input as one-line UserErrors."""
import shutil

import jax
import numpy as np
import pytest

import mha
from configs import quickstart
from mha import checkpoints
from mha import data
from mha import evaluator
from mha import translate
from mha.errors import UserError
from mha.transformer import TransformerConfig


@pytest.fixture(scope="module")
def translator(tiny_workdir):
  return mha.load(str(tiny_workdir))


@pytest.fixture(scope="module")
def sources():
  return data.load_text_pairs(quickstart.get_config(), "test[:6]")[0]


def test_translate_equals_eval_py_path(tiny_workdir, translator, sources,
                                       tmp_path):
  assert translator.step == 6 and translator.steps == [6]
  assert translator.defaults.beam_size == 4
  source = tmp_path / "src.txt"
  source.write_text("\n".join(sources) + "\n", encoding="utf-8")
  result = evaluator.evaluate(str(tiny_workdir), source_file=str(source),
                              write=False)
  assert translator.translate(sources) == result["translations"]
  # Settings override the config's, as eval.py's flags do.
  greedy = evaluator.evaluate(str(tiny_workdir), source_file=str(source),
                              write=False, beam_size=1, max_decode_extra=3)
  assert translator.translate(sources, beam_size=1, max_decode_extra=3,
                              batch_size=2) == greedy["translations"]


def test_blank_lines_give_empty_outputs(translator, sources):
  lines = [sources[0], "", "   ", sources[1]]
  out = translator.translate(lines)
  assert out[1:3] == ["", ""]
  assert [out[0], out[3]] == translator.translate([sources[0], sources[1]])
  assert translator.nbest(lines, 2)[1:3] == [[], []]
  assert translator.sample(lines)[1:3] == ["", ""]


def test_average_last_loads_the_mean(tiny_workdir):
  averaged = mha.load(str(tiny_workdir), step=4, average_last=2)
  assert (averaged.step, averaged.steps) == (4, [2, 4])
  want, _ = checkpoints.average_checkpoints(str(tiny_workdir), steps=[2, 4])
  got = averaged.params.params
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_nbest_sample_and_score_agree(translator, sources, tiny_workdir):
  best = translator.translate(sources)
  lists = translator.nbest(sources, 3)
  assert [hyps[0].text for hyps in lists] == best
  for hyps in lists:
    assert len(hyps) == 3
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
  # Forced scores of the n-best's ids: the search's log P(Y | X).
  config, tokenizer = evaluator.load_workdir(str(tiny_workdir))
  params, _ = checkpoints.restore_params(str(tiny_workdir))
  model_config = TransformerConfig.from_config(config, deterministic=True)
  found = translate.nbest_ids(model_config, params, tokenizer, sources,
                              num_best=3, beam_size=4, alpha=0.6,
                              max_decode_extra=config.max_decode_extra)
  checked = 0
  for i, hyps in enumerate(found):
    for (ids, _, log_prob), hyp in zip(hyps, lists[i]):
      assert hyp.log_prob == log_prob
      # Through the text: where the vocabulary re-encodes the text to the
      # same ids, score() gives the search's log-probability.
      if tokenizer.encode(hyp.text) + [data.EOS_ID] == ids.tolist():
        (scored,) = translator.score([sources[i]], [hyp.text])
        assert scored.log_prob == pytest.approx(log_prob, rel=1e-5, abs=1e-4)
        assert scored.pieces[-1] == "</s>"
        assert len(scored.pieces) == len(scored.token_log_probs) == len(ids)
        checked += 1
  assert checked >= 3
  # Samples: reproducible, per sentence, temperature 0 = greedy.
  first = translator.sample(sources, seed=5, with_log_probs=True)
  assert translator.sample(sources, seed=5, with_log_probs=True) == first
  assert translator.sample(sources[2:], seed=5, first_id=2,
                           batch_size=1) == [s.text for s in first[2:]]
  assert translator.sample(sources, temperature=0.0) == translator.translate(
      sources, beam_size=1)


@pytest.mark.parametrize("call, message", [
    (lambda t: t.nbest(["a"], 5), "n = 5 .* beam of 4"),
    (lambda t: t.translate(["a"], beam_size=0), "beam_size must be"),
    (lambda t: t.translate(["a"], alpha=float("nan")), "alpha must be"),
    (lambda t: t.translate("a sentence"), "list of strings"),
    (lambda t: t.sample(["a"], temperature=-1), "temperature must be"),
    (lambda t: t.sample(["a"], top_k=-2), "top_k must be"),
    (lambda t: t.score(["a", "b"], ["c"]), "2 sources but 1 targets"),
    (lambda t: t.score(["a"], ["b " * 200]), "Target 1 has"),
])
def test_bad_arguments_are_user_errors(translator, call, message):
  with pytest.raises(UserError, match=message):
    call(translator)


def test_bad_workdirs_and_steps_are_user_errors(tiny_workdir, tmp_path):
  with pytest.raises(UserError, match="does not exist"):
    mha.load(str(tmp_path / "nowhere"))
  with pytest.raises(UserError, match="3"):
    mha.load(str(tiny_workdir), step=3)
  with pytest.raises(UserError, match="average_last"):
    mha.load(str(tiny_workdir), average_last=4)
  with pytest.raises(UserError, match="step must be"):
    mha.load(str(tiny_workdir), step=-1)
  empty = tmp_path / "empty"
  shutil.copytree(tiny_workdir, empty,
                  ignore=shutil.ignore_patterns("checkpoints"))
  with pytest.raises(UserError, match="checkpoint"):
    mha.load(str(empty))
