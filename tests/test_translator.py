"""mha.load and the Translator: the same translations as eval.py's path,
n-best lists, samples and forced scores through the translation layer (their
numbers are tested against independent computations in
tests/test_translate_outputs.py; here the text around them), blank lines,
line-by-line reading, and bad input as one-line UserErrors.

Most tests use `random_workdir` (long, varied translations); the checkpoint
averaging and the workdir errors `tiny_workdir` (three checkpoints). The
tests share a few search settings (beam 4 or 1, n = 2) and batch shapes (the
6 sentences of `sources`, blank lines added), so that the searches compile
once for the whole file."""
import dataclasses
import os
import queue
import shutil
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha
from configs import quickstart
from mha.store import averaging
from mha import data
from mha.search import decoding
from mha.search import refill
from mha.evaluation import evaluator
from mha.search import batches as batch_search
from mha.search import texts as translate
from mha import translator as translator_lib
from mha.cli import lines as lines_lib
from mha import validation
from mha.errors import UserError
from mha.model.transformer import Transformer


@pytest.fixture(scope="module")
def translator(random_workdir):
  return mha.load(str(random_workdir))


@pytest.fixture(scope="module")
def pairs():
  return data.load_text_pairs(quickstart.get_config(), "test[:6]")


@pytest.fixture(scope="module")
def sources(pairs):
  return pairs[0]


def with_blanks(sources):
  """Two blank lines after the first two: an empty one, and one of spaces
  and invisible format characters (a zero-width space, a word joiner),
  which encodes to no pieces either."""
  return sources[:2] + ["", "  \u200b\u2060 "] + sources[2:]


def test_translate_equals_eval_py_path(random_workdir, translator, sources,
                                       tmp_path):
  assert translator.step == 1 and translator.steps == [1]
  assert translator.defaults == translator_lib.SearchSettings(4, 0.6, 8,
                                                             "exact")
  source = tmp_path / "src.txt"
  source.write_text("\n".join(with_blanks(sources)) + "\n", encoding="utf-8")
  result = evaluator.evaluate(str(random_workdir), source_file=str(source),
                              write=False)
  out = translator.translate(sources)
  assert out[:2] + ["", ""] + out[2:] == result["translations"]
  assert len(set(out)) == 6 and min(len(t) for t in out) > 10
  # Any iterable of strings: a generator is read once, not lost.
  assert translator.translate(s for s in sources) == out


def test_blank_lines_give_empty_outputs(translator, sources):
  lines = with_blanks(sources)
  out = translator.translate(lines)
  assert out[2:4] == ["", ""]
  assert out[:2] + out[4:] == translator.translate(sources)
  # n may be the beam size (no input: nothing to search).
  assert translator.nbest([], translator.defaults.beam_size) == []
  nbest = translator.nbest(lines, 2)
  assert nbest[2:4] == [[], []]
  assert nbest[:2] + nbest[4:] == translator.nbest(sources, 2)
  samples = translator.sample(lines)
  assert samples[2:4] == ["", ""] and all(samples[:2] + samples[4:])


def test_nbest_and_samples(translator, sources):
  best = translator.translate(sources)
  lists = translator.nbest(sources, 2)
  assert [hyps[0].text for hyps in lists] == best
  for hyps in lists:
    assert len(hyps) == 2 and hyps[0].text != hyps[1].text
    assert hyps[0].score >= hyps[1].score
    assert all(h.log_prob < 0 for h in hyps)
  # Samples: reproducible, per sentence (tests/test_translate_outputs.py:
  # their distribution, temperature 0 = greedy).
  first = translator.sample(sources, seed=5, with_log_probs=True)
  assert all(s.log_prob < 0 for s in first)
  assert translator.sample(sources, seed=5, with_log_probs=True) == first
  assert translator.sample(sources[:3], seed=5) == [
      s.text for s in first[:3]]
  assert translator.sample(sources[3:], seed=5, first_id=3) == [
      s.text for s in first[3:]]
  assert translator.sample(sources, seed=6) != [s.text for s in first]


def test_bfloat16_weight_products_reach_the_search(translator, sources):
  """matmul_dtype='bfloat16' (a search setting): the model's products take
  bfloat16 inputs, so a hypothesis's log-probability moves by their
  rounding, not more; 'float32' is the default search, bit for bit."""
  lists = translator.nbest(sources, 2)
  assert translator.nbest(sources, 2, matmul_dtype="float32") == lists
  rounded = translator.nbest(sources, 2, matmul_dtype="bfloat16")
  moved = [(a.log_prob, b.log_prob) for hyps, others in zip(lists, rounded)
           for a, b in zip(hyps, others) if a.text == b.text]
  assert len(moved) >= len(sources)  # mostly the same hypotheses
  assert any(a != b for a, b in moved)
  for a, b in moved:
    assert abs(a - b) <= 0.02 * abs(a), (a, b)


def test_score_equals_the_full_forward_pass_on_the_text(translator, pairs):
  sources, targets = pairs
  tokenizer, model_config = translator.tokenizer, translator.model_config
  scores = translator.score(sources, targets, batch_size=4)
  # Teacher forcing in one pass of the model (no cache), all pairs at once:
  # it shifts the targets right behind the start symbol 0 itself; padding
  # is masked (sources as keys, targets causally).
  x = [tokenizer.encode(s) + [data.EOS_ID] for s in sources]
  y = [tokenizer.encode(t) + [data.EOS_ID] for t in targets]
  pad = lambda rows: np.array([r + [0] * (32 - len(r)) for r in rows],
                              np.int32)
  logits = jax.jit(Transformer(model_config).apply)(
      {"params": translator.params.params}, pad(x), pad(y))
  full = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)))
  for b, (ids, scored) in enumerate(zip(y, scores)):
    want = full[b, np.arange(len(ids)), ids]
    np.testing.assert_allclose(scored.token_log_probs, want, rtol=1e-4,
                               atol=1e-4)
    assert scored.log_prob == pytest.approx(want.sum(), rel=1e-4, abs=1e-3)
    assert scored.pieces == [tokenizer.id_to_piece(i) for i in ids[:-1]] + [
        "</s>"]


def test_average_last_loads_the_mean(tiny_workdir):
  averaged = mha.load(str(tiny_workdir), step=4, average_last=2)
  assert (averaged.step, averaged.steps) == (4, [2, 4])
  want, _ = averaging.average_checkpoints(str(tiny_workdir), steps=[2, 4])
  got = averaged.params.params
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("call, message", [
    (lambda t: t.nbest(["a"], 5), "^n=5 .* beam of 4: give beam_size >= 5"),
    (lambda t: t.translate(["a"], beam_size=0), "beam_size must be"),
    (lambda t: t.nbest(["a"], 1, beam_size=t.model_config.vocab_size + 1),
     r"beam_size must be <= \d+, the vocabulary's size, got \d+\."),
    (lambda t: t.translate(["a"], alpha=float("nan")), "alpha must be"),
    (lambda t: t.nbest(["a"], 2, beam_stop="fast"),
     "beam_stop must be one of exact, early, got 'fast'"),
    (lambda t: t.translate(["a"], matmul_dtype="float16"),
     "matmul_dtype must be one of float32, bfloat16, got 'float16'"),
    (lambda t: lines_lib.line_translator(t, sample=True,
                                         matmul_dtype="bfloat16"),
     "^matmul_dtype: beam search settings; sampling takes temperature"),
    (lambda t: lines_lib.line_translator(t, sample=True, beam_stop="early",
                                         no_repeat_ngram_size=2),
     "^beam_stop, no_repeat_ngram_size: beam search settings"),
    (lambda t: t.translate(["a"], beam_width=2),
     "^Not a search setting: beam_width"),
    (lambda t: t.translate(["a"], no_repeat_ngram_size=-1),
     "no_repeat_ngram_size must be"),
    (lambda t: t.translate("a sentence"), "list of strings"),
    (lambda t: t.translate(7), "list of strings"),
    (lambda t: t.nbest(iter([b"bytes"]), 2), "list of strings"),
    (lambda t: t.sample(["a"], temperature=-1), "temperature must be"),
    (lambda t: t.sample(["a"], top_k=-2), "top_k must be"),
    (lambda t: t.sample(["a"], top_k=t.model_config.vocab_size + 1),
     r"top_k must be an integer in 0\.\.\d+, got \d+\."),
    (lambda t: t.score(["a", "b"], ["c"]), "2 sources but 1 targets"),
    (lambda t: t.score(["a"], ["b " * 200]), "Target 1 has"),
    (lambda t: t.translate(["ok", "\ud800 x"]), r"sentences: sentence 2 is "
     r"not text that UTF-8 can encode \(surrogates not allowed at character "
     r"0\)"),
    (lambda t: t.score(["a"], ["\udcff"]), "targets: sentence 1 is not"),
    (lambda t: t.translate({"a": 1}), "list of strings"),
    (lambda t: t.nbest({"a", "b"}, 2), "list of strings"),
    (lambda t: t.sample(["a"], with_log_probs="yes"),
     "with_log_probs must be True or False, got 'yes'"),
])
def test_bad_arguments_are_user_errors(translator, call, message):
  with pytest.raises(UserError, match=message):
    call(translator)


@pytest.mark.parametrize("call, message", [
    (lambda t: t.nbest(["a"], 5),
     "^--nbest=5 hypotheses asked of a beam of 4: give --beam_size >= 5"),
    (lambda t: t.nbest(["a"], 0), "^--nbest must be an integer >= 1, got 0"),
    (lambda t: t.sample(["a"], temperature=-1), "^--temperature must be"),
    (lambda t: t.translate(["a"], beam_size=0), "^--beam_size must be"),
])
def test_in_a_command_the_settings_are_named_by_their_flags(
    translator, call, message):
  """mha-translate's messages (inside `validation.as_flags`, which
  `cli.startup.guarded` enters) name its flags, --nbest for `n`."""
  with pytest.raises(UserError, match=message):
    with validation.as_flags():
      call(translator)


def test_bad_workdirs_and_steps_are_user_errors(tiny_workdir, tmp_path):
  with pytest.raises(UserError, match="does not exist"):
    mha.load(tmp_path / "nowhere")  # a pathlib.Path as well as a string
  with pytest.raises(UserError, match="workdir must be a path"):
    mha.load(None)
  with pytest.raises(UserError, match="workdir is empty"):  # an unset $WD
    mha.load(" ")
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


def test_read_batches_takes_only_lines_already_there():
  read, write = os.pipe()
  batches = lines_lib.read_batches(read, max_lines=2)
  got = queue.Queue()

  def next_batch():
    threading.Thread(target=lambda: got.put(next(batches, None)),
                     daemon=True).start()
    return got.get(timeout=60)  # never reached if the reader waited for more

  try:
    os.write(write, "\ufeffeins\r\nzwei\ndrei\nvi".encode("utf-8"))
    assert next_batch() == ["eins", "zwei"]  # at most max_lines
    assert next_batch() == ["drei"]  # the pipe is open: no waiting for "vi"
    os.write(write, b"er\n\n")
    assert next_batch() == ["vier", ""]
    os.write(write, "f\u00fcnf".encode("utf-8"))
  finally:
    os.close(write)
  assert next_batch() == ["f\u00fcnf"]  # the last line without a newline
  assert next_batch() is None
  os.close(read)
  read, write = os.pipe()
  os.write(write, b"ok\n\xff\n")
  os.close(write)
  with pytest.raises(data.DataError, match="standard input, line 2: invalid"):
    list(lines_lib.read_batches(read, 8))
  os.close(read)
  read, write = os.pipe()
  os.write(write, "ok\n".encode("utf-16-le"))
  os.close(write)
  with pytest.raises(data.DataError, match="standard input, line 1: a NUL"):
    list(lines_lib.read_batches(read, 8))
  os.close(read)


def test_line_translator_nbest_lines_and_samples(translator, sources):
  lines = with_blanks(sources)
  nbest = lines_lib.line_translator(translator, nbest=2)
  text = nbest(lines, 10)
  want = translator.nbest(lines, 2)
  # A blank line (13, 14) is not translated but keeps its block: n lines
  # of the empty translation with scores 0, as translate gives it "".
  assert want[2:4] == [[], []]
  want[2:4] = [[translator_lib.Hypothesis("", 0.0, 0.0)] * 2] * 2
  assert text == "".join(
      f"{11 + i}\t{k + 1}\t{h.score:.6f}\t{h.log_prob:.6f}\t{h.text}\n"
      for i, hyps in enumerate(want) for k, h in enumerate(hyps))
  assert [line.split("\t")[:2] for line in text.split("\n")[:-1]] == [
      [str(i), str(k)] for i in range(11, 19) for k in (1, 2)]
  assert text.split("\n")[4:8] == ["13\t1\t0.000000\t0.000000\t",
                                    "13\t2\t0.000000\t0.000000\t",
                                    "14\t1\t0.000000\t0.000000\t",
                                    "14\t2\t0.000000\t0.000000\t"]
  # Samples: a line's key is its position in the whole input, so the
  # batches the input arrives in do not matter.
  sample = lines_lib.line_translator(translator, sample=True, seed=4,
                                          temperature=0.7)
  whole = []
  lines_lib.translate_stream(sample, iter([lines]), whole.append)
  pieces = []
  # (The pieces' sentences are those of test_nbest_and_samples' calls: the
  # same compiled shapes.)
  count = lines_lib.translate_stream(
      sample, iter([lines[:5], lines[5:]]), pieces.append)
  assert count == 8 and len(pieces) == 2
  assert "".join(pieces) == whole[0] == "".join(
      t + "\n" for t in translator.sample(lines, seed=4, temperature=0.7))
  for bad in [dict(nbest=2, sample=True), dict(sample=True, beam_size=2),
              dict(nbest=5)]:
    with pytest.raises(UserError):
      lines_lib.line_translator(translator, **bad)


def test_a_terminal_sessions_searches_are_prepared_before_the_first_line(
    translator, sources):
  # A setting no other test uses (alpha 0.37): its search starts compiled
  # for no shape. After the warm-up, a one-line input in a warmed bucket
  # compiles nothing more, and gets the translation it would get anyway.
  # pylint: disable=protected-access
  search = batch_search.translate_fn(
      translator.model_config, translator.defaults.given(alpha=0.37),
      data.EOS_ID)
  function = lines_lib.line_translator(translator, alpha=0.37)
  assert search._cache_size() == 0
  tokenizer = translator.tokenizer
  warm = {b: lines_lib.warm_up_line(tokenizer, b) for b in (8, 16, 24)}
  for bucket, line in warm.items():
    length = len(tokenizer.encode(line)) + 1
    assert translate.bucket_length(length, 64) == bucket
    assert translate.bucket_length(len(tokenizer.encode(line + " a")) + 1,
                                   64) > bucket  # the longest such line
  line = next(s for s in sources
              if translate.bucket_length(len(tokenizer.encode(s)) + 1,
                                         64) == 16)
  warmed = lines_lib.WarmedUp(function, tokenizer, max_len=64)
  warmed.wait()
  assert search._cache_size() == 3
  assert warmed([line], 0) == translator.translate([line], alpha=0.37)[0] + (
      "\n")
  assert search._cache_size() == 3
  # pylint: enable=protected-access


def test_the_first_line_stops_the_warm_up_after_the_bucket_in_progress(
    translator):
  # The warm-up is held inside its first line (bucket 8) while the first
  # real line arrives: the call waits for that bucket, then the warm-up
  # stops (16 and 24 are never prepared) and the line is translated.
  # Buckets past the model's max_len are never warmed (their line would be
  # cut, with a warning).
  calls, inside, release = [], threading.Event(), threading.Event()

  def function(lines, first):
    calls.append(lines)
    if len(calls) == 1:
      inside.set()
      assert release.wait(timeout=120)
    return "out\n"

  warmed = lines_lib.WarmedUp(function, translator.tokenizer,
                                   max_len=20)
  assert inside.wait(timeout=120)
  result = []
  caller = threading.Thread(target=lambda: result.append(warmed(["x"], 0)))
  caller.start()
  # The call has stopped the warm-up; it waits for it.
  assert warmed._stop.wait(timeout=120)  # pylint: disable=protected-access
  assert calls == [[lines_lib.warm_up_line(translator.tokenizer, 8)]]
  release.set()
  caller.join(timeout=120)
  assert result == ["out\n"]
  assert calls == [[lines_lib.warm_up_line(translator.tokenizer, 8)],
                   ["x"]]


class _WordTokenizer:
  """One id per word: lines whose lengths are counted by hand."""

  def encode(self, line):
    return [5] * len(line.split())


def test_warm_up_lines_fill_their_buckets_up_to_max_len():
  # 15 words + EOS = 16 ids: the longest line of bucket 16.
  assert lines_lib.warm_up_line(_WordTokenizer(), 16) == " ".join(
      ["a"] * 15)
  # Buckets 8 and 16 are warmed with max_len 16 (the one of exactly max_len
  # too), 24 is not.
  calls = []
  lines_lib.WarmedUp(lambda lines, first: calls.append(lines),
                          _WordTokenizer(), max_len=16).wait()
  assert [len(lines[0].split()) for lines in calls] == [7, 15]


def test_the_stopping_rule_reaches_the_searches(translator, sources,
                                                monkeypatch):
  # The rules themselves are tested in test_beam_stopping.py; here: every
  # path from the Translator to a beam search traces it with the rule
  # asked for, or the workdir's (alpha 0.41: searches no other test traced,
  # so each call traces its own).
  # pylint: disable=protected-access
  traced = []
  for module, name in ((decoding, "beam_search"), (refill, "beam_refill")):
    def record(*args, _search=getattr(module, name), _name=name,
               **kwargs):
      traced.append((_name, kwargs.get("stop", "exact")))
      return _search(*args, **kwargs)
    monkeypatch.setattr(module, name, record)
  # 48 sentences in batches of 16 on one device: a refilled search (on
  # the test's 4 devices each batch would be split instead).
  translate.translate_texts(
      translator.model_config, translator.params, translator.tokenizer,
      sources * 8, beam_size=4, alpha=0.41, max_decode_extra=8,
      batch_size=16, devices=jax.local_devices()[:1], beam_stop="early")
  assert traced == [("beam_refill", "early")]
  lines_lib.line_translator(translator, alpha=0.41,
                                 beam_stop="early")(sources, 0)
  assert traced[1:] == [("beam_search", "early")]
  # The workdir's rule where none is given.
  monkeypatch.setattr(translator, "defaults", dataclasses.replace(
      translator.defaults, beam_stop="early", alpha=0.41))
  translator.nbest(sources, 2)
  assert traced[2:] == [("beam_search", "early")]
