"""eval.py and mha.evaluation.evaluator on a workdir trained for a few steps."""
import hashlib
import json
import logging
import math
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import sacrebleu

from configs import quickstart
from mha.store import checkpoints
from mha import data
from mha.evaluation import evaluator
from mha.store import trained as trained_lib
from mha.store import workdir as workdir_lib
from mha.scoring import metric_table
from mha.scoring.corpus import Corpus
from mha.search import batches as batch_search
from mha.search.settings import SearchSettings
from mha.search import texts as translate
from mha.errors import UserError
from mha.model.transformer import TransformerConfig
from test_packaging import outside_the_core
from test_packaging import with_imports_recorded

REPO = pathlib.Path(__file__).resolve().parents[1]
SPLIT = "test[:12]"
FIELDS = ("bleu", "chrf", "sacrebleu_signature", "chrf_signature", "split",
          "num_sentences", "checkpoint_step", "averaged_steps", "beam_size",
          "alpha", "decode_seconds", "compile_seconds", "sentences_per_second")


def _snapshot(path: pathlib.Path) -> dict[str, tuple[str, int] | None]:
  """Hash and mtime of every file of a workdir outside eval/ (dirs: None)."""
  snapshot = {}
  for p in sorted(path.rglob("*")):
    relative = p.relative_to(path)
    if relative.parts[0] == evaluator.EVAL_DIR:
      continue
    snapshot[str(relative)] = (
        (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        if p.is_file() else None)
  return snapshot


@pytest.fixture(scope="module")
def trained(tiny_workdir) -> tuple[pathlib.Path, dict]:
  """Checkpoints at steps 2, 4, 6 of a tiny run, and the workdir's snapshot.

  Tests only evaluate it (writing under eval/); the last test checks that
  nothing else changed.
  """
  return tiny_workdir, _snapshot(tiny_workdir)


@pytest.fixture(scope="module")
def workdir(trained) -> pathlib.Path:
  return trained[0]


@pytest.fixture(scope="module")
def model(workdir):
  """(config, tokenizer, model_config, params of the last step)."""
  config, tokenizer = trained_lib.load_workdir(str(workdir))
  params, _ = checkpoints.restore_params(str(workdir))
  return (config, tokenizer,
          TransformerConfig.from_config(config, deterministic=True), params)


def _run_eval(*args, stdin=None):
  return subprocess.run([sys.executable, "eval.py", *args], cwd=REPO,
                        input=stdin, capture_output=True, text=True,
                        timeout=300)


def _references(split: str) -> tuple[list[str], list[str]]:
  return data.load_text_pairs(quickstart.get_config(), split)


def test_eval_py_writes_metrics_and_bleu_recomputes(workdir, tmp_path):
  imports = tmp_path / "imports.json"
  result = subprocess.run(
      with_imports_recorded(imports, "eval.py", f"--workdir={workdir}",
                            f"--split={SPLIT}", "--cpu_devices=4"), cwd=REPO,
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Searching on 4 CPU device(s)" in result.stderr  # as XLA_FLAGS's
  # Everything it imported (the search kept on disk with jax.export's
  # serializer among it) is installed by the README's main command;
  # sacremoses (0.4 s to import) only with --paper_bleu.
  imported = json.loads(imports.read_text())
  assert not outside_the_core(imported)
  assert "sacremoses" not in imported
  out = workdir / "eval" / "test_12_6"
  metrics = json.loads((out / "metrics.json").read_text())
  for field in FIELDS:
    assert field in metrics, field
  assert metrics["checkpoint_step"] == 6 and metrics["averaged_steps"] == [6]
  assert (metrics["beam_size"], metrics["alpha"]) == (4, 0.6)
  assert metrics["num_sentences"] == 12 and metrics["split"] == SPLIT
  # No --batch_size: on CPU devices (4 here, as in this process) 64
  # sentences in all, 16 a device: at beam 4 the 64 rows each device needs
  # for batches to be searched as one.
  assert jax.local_device_count() == 4
  assert metrics["batch_size"] == 64
  assert metrics["sentences_per_second"] > 0
  # A new process prepares its searches (traced, or read from the files
  # kept, and compiled or fetched from XLA's cache): counted apart.
  assert 0 < metrics["compile_seconds"] <= metrics["decode_seconds"]
  assert "tok:13a" in metrics["sacrebleu_signature"]
  assert "case:mixed" in metrics["sacrebleu_signature"]
  hypotheses = (out / "translations.txt").read_text().split("\n")
  assert hypotheses.pop() == ""  # the last line's newline
  _, references = _references(SPLIT)
  assert len(hypotheses) == len(references) == 12
  bleu = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references])
  chrf = sacrebleu.metrics.CHRF().corpus_score(hypotheses, [references])
  assert metrics["bleu"] == pytest.approx(bleu.score)
  assert metrics["chrf"] == pytest.approx(chrf.score)
  # The last line printed: BLEU and its signature, and beside it each
  # metric of the table on by default.
  last = result.stdout.strip().split("\n")[-1]
  assert f"BLEU {metrics['bleu']:.2f}" in last
  assert metrics["sacrebleu_signature"] in last
  for metric in metric_table.chosen():
    assert f"{metric.label} {metrics[metric.name]:.2f}" in last


def test_average_last_is_the_mean_of_the_last_checkpoints(workdir):
  params, step, averaged = trained_lib.load_params(str(workdir), average_last=2)
  assert (step, averaged) == (6, [4, 6])
  p4, _ = checkpoints.restore_params(str(workdir), 4)
  p6, _ = checkpoints.restore_params(str(workdir), 6)
  jax.tree_util.tree_map(
      lambda got, a, b: np.testing.assert_allclose(
          got, (np.asarray(a, np.float32) + b) / 2, rtol=1e-6),
      params, p4, p6)
  # Up to a given step.
  assert trained_lib.choose_steps(str(workdir), 4, 2) == [2, 4]
  result = evaluator.evaluate(str(workdir), split=SPLIT, average_last=2)
  assert result["averaged_steps"] == [4, 6]
  assert result["checkpoint_step"] == 6
  out = workdir / "eval" / "test_12_avg2_6"
  assert result["output_dir"] == str(out)
  assert json.loads((out / "metrics.json").read_text())[
      "averaged_steps"] == [4, 6]


def test_source_and_reference_files(workdir, tmp_path):
  sources, references = _references(SPLIT)
  source = tmp_path / "src.txt"
  source.write_text("\n".join(sources) + "\n", encoding="utf-8")
  reference = tmp_path / "ref.txt"
  reference.write_text("\n".join(references), encoding="utf-8")  # no final \n
  result = evaluator.evaluate(str(workdir), source_file=str(source),
                              reference_file=str(reference))
  out = workdir / "eval" / "file_6"
  assert result["output_dir"] == str(out)
  metrics = json.loads((out / "metrics.json").read_text())
  assert metrics["split"] == "file" and metrics["num_sentences"] == 12
  hypotheses = (out / "translations.txt").read_text().split("\n")[:-1]
  assert metrics["bleu"] == pytest.approx(
      sacrebleu.corpus_bleu(hypotheses, [references]).score)
  # The same sentences read as the split: the same translations.
  from_split = evaluator.evaluate(str(workdir), split=SPLIT, write=False)
  assert from_split["translations"] == hypotheses


def test_stdin_to_stdout_one_line_per_line(workdir, model):
  config, tokenizer, model_config, params = model
  sources, _ = _references("test[:3]")
  lines = [sources[0], "", sources[1], sources[2]]
  result = _run_eval(f"--workdir={workdir}", "--source_file=-",
                     "--beam_size=1", stdin="\n".join(lines) + "\n")
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout.split("\n")
  assert out.pop() == "" and len(out) == 4
  # In order (batching does not change translations: the next test).
  assert out == translate.translate_texts(
      model_config, params, tokenizer, lines, beam_size=1, alpha=0.6,
      max_decode_extra=config.max_decode_extra)


def test_scores_are_the_hypotheses_against_the_references():
  result = metric_table.corpus_scores(["the cat sat on the"],
                                      ["the cat sat on the mat"])
  # BLEU: every n-gram of the 5-token hypothesis is in the 6-token
  # reference (precisions 1), brevity penalty exp(1 - 6/5).
  assert result["bleu"] == pytest.approx(100 * math.exp(1 - 6 / 5))
  # chrF (character 1- to 6-grams, spaces dropped, beta 2, the F-score of
  # the mean precision and recall): the hypothesis's 14 characters are the
  # first of the reference's 17, so precision 1 and recall the mean of
  # (15 - n) / (18 - n). Swapped, precision and recall trade places.
  recall = sum((15 - n) / (18 - n) for n in range(1, 7)) / 6
  assert result["chrf"] == pytest.approx(100 * 5 * recall / (4 + recall))


def test_scores_are_cased():
  """BLEU and chrF compare cased text: "The Cat" is not "the cat"."""
  result = metric_table.corpus_scores(["The Cat sat on the mat"],
                                      ["the cat sat on the mat"])
  # n-gram precisions 4/6, 3/5, 2/4, 1/3 (what "The" and "Cat" break), no
  # brevity penalty: their geometric mean.
  assert result["bleu"] == pytest.approx(
      100 * (4 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
  assert result["chrf"] < 100
  same = metric_table.corpus_scores(["The Cat sat on the mat"],
                                    ["The Cat sat on the mat"])
  assert (same["bleu"] == pytest.approx(100)
          and same["chrf"] == pytest.approx(100))


# Every switch of the table's opt-in metrics on: all its metrics computed.
ALL_METRICS = {metric.opt_in: True for metric in metric_table.METRICS
               if metric.opt_in}


def test_the_table_of_metrics_names_each_field_once():
  """A metric's name and fields are its own in metrics.json: no two
  metrics write the same key; what eval.py prints is among its fields;
  an opt-in metric is computed only when its switch is given."""
  corpus = Corpus(["the cat sat on a mat", "A dog-walker ran"],
                  ["the cat sat on the mat", "A dog-walker runs"], lang="en")
  keys = []
  for metric in metric_table.METRICS:
    value, fields = metric.compute(corpus)
    assert math.isfinite(value), metric.name
    assert metric.shown is None or metric.shown in fields, metric.name
    keys += [metric.name, *fields]
  assert len(keys) == len(set(keys)), keys
  assert set(metric_table.corpus_scores(
      corpus.hypotheses, corpus.references, lang="en",
      metrics=metric_table.METRICS)) == set(keys)
  assert metric_table.chosen(**ALL_METRICS) == metric_table.METRICS
  by_default = metric_table.chosen()
  assert {m.name for m in by_default} >= {"bleu", "chrf"}
  assert all(m.opt_in is None for m in by_default)
  assert "bleu_paper" not in {m.name for m in by_default}
  assert {m.name for m in metric_table.chosen(paper_bleu=False)} == {
      m.name for m in by_default}
  assert "bleu_paper" in {m.name for m in metric_table.chosen(
      paper_bleu=True)}
  with pytest.raises(ValueError, match="^No metric is asked for by "
                     "paper_blue; the switches are paper_bleu"):
    metric_table.chosen(paper_blue=True)
  with pytest.raises(ValueError, match="^2 hypotheses but 1 references"):
    metric_table.corpus_scores(["a", "b"], ["a"])


def test_the_printed_scores_are_the_lines_of_before():
  """eval.py's score lines, as they were when written by hand: the
  metrics on by default on one line with sacreBLEU's signature, the
  paper's BLEU on its own with its signature and caveat."""
  scores = {"bleu": 27.314, "chrf": 56.0249, "sacrebleu_signature": "SIG",
            "chrf_signature": "CSIG", "bleu_details": "DETAILS",
            "bleu_paper": 28.4, "bleu_paper_signature": "PSIG",
            "split": "test", "num_sentences": 3}
  assert metric_table.console_lines(scores) == [
      "BLEU 27.31  chrF 56.02  (SIG)",
      "Paper's BLEU 28.40  (PSIG; for comparison with the paper only, "
      "quote sacreBLEU)"]
  del scores["bleu_paper"]
  assert metric_table.console_lines(scores) == [
      "BLEU 27.31  chrF 56.02  (SIG)"]
  assert metric_table.console_lines({"split": "file"}) == []


def test_every_metric_of_the_table_is_computed_and_written(random_workdir,
                                                           tmp_path):
  """eval.py's evaluation writes each metric of the table (with every
  switch given) into metrics.json with its fields, as the table's
  function gives it for the translations written; BLEU and chrF are
  sacreBLEU's called here; eval.py prints each one's value.

  A model with long, varied translations (random parameters), scored
  against references made from them: scores strictly between 0 and 100.
  """
  workdir = str(random_workdir)
  source = tmp_path / "src.txt"
  source.write_text("guno duma ri moge\nnigo ri ponoru pabo\n"
                    "pabo moge ri guno\nri nigo duma\n")
  first = evaluator.evaluate(workdir, source_file=str(source), beam_size=1,
                             write=False)["translations"]
  # Each translation with a word dropped or one added: partly matched.
  references = [" ".join(t.split()[:-1] if i % 2 else t.split() + ["Haus"])
                for i, t in enumerate(first)]
  reference = tmp_path / "ref.txt"
  reference.write_text("".join(r + "\n" for r in references))
  out = tmp_path / "all_metrics"
  result = evaluator.evaluate(workdir, source_file=str(source),
                              reference_file=str(reference), beam_size=1,
                              output_dir=str(out), **ALL_METRICS)
  written = json.loads((out / "metrics.json").read_text())
  hypotheses = (out / "translations.txt").read_text().split("\n")[:-1]
  assert hypotheses == first and all(hypotheses)
  config, _ = trained_lib.load_workdir(workdir)
  corpus = Corpus(hypotheses, references, lang=config.target_lang)
  for metric in metric_table.METRICS:
    value, fields = metric.compute(corpus)
    assert written[metric.name] == result[metric.name] == value, metric.name
    assert {k: written[k] for k in fields} == fields, metric.name
  assert written["bleu"] == pytest.approx(
      sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score)
  assert written["chrf"] == pytest.approx(
      sacrebleu.metrics.CHRF().corpus_score(hypotheses, [references]).score)
  assert 0 < written["bleu"] < 100 and 0 < written["chrf"] < 100
  assert written["bleu"] != written["chrf"]
  printed = "\n".join(metric_table.console_lines(written))
  for metric in metric_table.METRICS:
    assert f"{metric.label} {written[metric.name]:.2f}" in printed
  # Without the switches: only the metrics on by default.
  plain = evaluator.evaluate(workdir, source_file=str(source),
                             reference_file=str(reference), beam_size=1,
                             write=False)
  assert {m.name for m in metric_table.METRICS if m.name in plain} == {
      m.name for m in metric_table.chosen()}
  assert plain["bleu"] == written["bleu"]


def test_make_batches_sorts_buckets_and_covers_every_sentence():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 65, 200)
  encoded = [[5] * (n - 1) + [data.EOS_ID] for n in lengths]
  batches = translate.make_batches(encoded, batch_size=32, max_len=64,
                                   max_decode_extra=50)
  indices = np.concatenate([b.indices for b in batches])
  assert sorted(indices.tolist()) == list(range(200))
  longest = [max(lengths[b.indices]) for b in batches]
  assert longest == sorted(longest, reverse=True)
  for b in batches:
    rows, length = b.inputs.shape
    assert length in translate.LENGTH_BUCKETS or length == 64
    # 200 = 6 x 32 + 8: the last batch has a full batch's rows too (one
    # program for every batch of a length), its spare rows empty.
    assert rows == 32 and b.max_decode_len == min(length + 50, 64)
    for row, i in enumerate(b.indices):
      n = lengths[i]
      assert (b.inputs[row, :n] != 0).all() and (b.inputs[row, n:] == 0).all()
    assert (b.inputs[len(b.indices):] == 0).all()
  assert len({b.shape_key for b in batches}) <= 5
  with pytest.raises(ValueError, match="65 ids"):
    translate.make_batches([[5] * 65], batch_size=4, max_len=64,
                           max_decode_extra=0)


def test_batching_order_truncation_and_no_recompilation(workdir, model,
                                                        caplog):
  config, tokenizer, model_config, params = model
  sources, references = _references("test[:10]")
  kwargs = dict(beam_size=1, alpha=0.6, max_decode_extra=8)
  whole = translate.translate_texts(model_config, params, tokenizer, sources,
                                    batch_size=64, **kwargs)
  reversed_ = translate.translate_texts(model_config, params, tokenizer,
                                        sources[::-1], batch_size=4, **kwargs)
  assert whole == reversed_[::-1]

  # A source longer than the model's positions is truncated, with a warning.
  too_long = " ".join(sources) * 3
  assert len(tokenizer.encode(too_long)) > model_config.max_len
  with caplog.at_level(logging.WARNING):
    out = translate.translate_texts(model_config, params, tokenizer,
                                    [sources[0], too_long], **kwargs)
  assert len(out) == 2 and out[0] == whole[0]
  assert "truncated (lines 2)" in caplog.text

  # BLEU during training: repeated calls with new parameters compile nothing.
  # pylint: disable=protected-access
  search = batch_search.translate_fn(model_config, SearchSettings(beam_size=1),
                                     data.EOS_ID)
  p4, _ = checkpoints.restore_params(str(workdir), 4)
  translate.translate_texts(model_config, p4, tokenizer, sources, **kwargs)
  compiled = search._cache_size()
  second = translate.translate_with_ids(model_config, params, tokenizer,
                                        sources, **kwargs)
  assert compiled >= 1 and search._cache_size() == compiled
  # pylint: enable=protected-access
  # ... so the time of preparing searches, counted apart, is 0 (eval.py's
  # compile_seconds); a new output length is a new search to compile.
  assert second.compile_seconds == 0.0
  longer = translate.translate_with_ids(
      model_config, params, tokenizer, sources,
      **dict(kwargs, max_decode_extra=kwargs["max_decode_extra"] + 17))
  assert 0.0 < longer.compile_seconds <= longer.seconds
  second = second.texts
  assert second == whole
  scores = metric_table.corpus_scores(second, references)
  assert scores["bleu"] == pytest.approx(
      sacrebleu.corpus_bleu(whole, [references]).score)


def test_bad_inputs_give_one_clear_error(workdir, tmp_path):
  no_checkpoint = tmp_path / "no_checkpoint"
  no_checkpoint.mkdir()
  shutil.copy(workdir / "config.json", no_checkpoint)
  shutil.copy(workdir / "spm.model", no_checkpoint)
  no_config = tmp_path / "no_config"
  no_config.mkdir()
  no_vocab = tmp_path / "no_vocab"
  no_vocab.mkdir()
  shutil.copy(workdir / "config.json", no_vocab)
  source = tmp_path / "src.txt"
  source.write_text("a\nb\nc\n")
  reference = tmp_path / "ref.txt"
  reference.write_text("a\nb\n")
  blank = tmp_path / "blank.txt"
  blank.write_text("")
  w = str(workdir)
  cases = [
      (dict(workdir=str(tmp_path / "missing")), "missing does not exist"),
      (dict(workdir=str(no_config)), "no_config/config.json does not exist"),
      (dict(workdir=str(no_vocab)), "no_vocab/spm.model does not exist"),
      (dict(workdir=str(no_checkpoint)), "No checkpoint in .*no_checkpoint"),
      (dict(workdir=w, checkpoint_step=5), r"step 5 .*steps: \[2, 4, 6\]"),
      (dict(workdir=w, average_last=4),
       r"^average_last=4 .* holds 3 checkpoint\(s\) up to step 6"),
      (dict(workdir=w, checkpoint_step=2, average_last=2),
       r"holds 1 checkpoint\(s\) up to step 2: \[2\]"),
      (dict(workdir=w, average_last=0), "^average_last must be >= 1"),
      (dict(workdir=w, source_file=str(source),
            reference_file=str(reference)),
       "src.txt has 3 lines but reference file .*ref.txt has 2"),
      (dict(workdir=w, source_file=str(blank)), "blank.txt is empty"),
      (dict(workdir=w, source_file=str(tmp_path / "nope.txt")),
       "nope.txt does not exist"),
      (dict(workdir=w, reference_file=str(reference)),
       "^reference_file needs source_file"),
      (dict(workdir=w, split="test", source_file=str(source)),
       "^Give split or source_file, not both"),
      (dict(workdir=w, split="nonexistent"), "nonexistent"),
      (dict(workdir=w, beam_size=0), "^beam_size must be >= 1, got 0"),
      (dict(workdir=w, source_file=str(tmp_path)), "is a directory"),
      (dict(workdir="s3://bucket/run"),
       "s3://bucket/run: only local paths and gs://BUCKET/... URLs"),
  ]
  for kwargs, message in cases:
    with pytest.raises(UserError, match=message):
      evaluator.evaluate(**kwargs)
  assert not (no_checkpoint / "eval").exists()
  assert sorted(p.name for p in no_vocab.iterdir()) == ["config.json"]
  # eval.py prints just the message and fails.
  result = _run_eval(f"--workdir={workdir}", "--checkpoint_step=5")
  assert result.returncode == 1
  assert ("eval.py: No checkpoint for step 5 in "
          f"{workdir_lib.Workdir(workdir).checkpoints_path}; available steps: "
          "[2, 4, 6]."
          in result.stderr)
  assert "Traceback" not in result.stderr and result.stdout == ""


def test_workdir_unchanged_except_eval(trained):
  """Runs last: every evaluation above wrote under eval/ only.

  Whichever of them ran in this process (all of them in a plain run; a
  share of them where pytest-xdist splits the module): eval/ may be absent.
  """
  workdir, before = trained
  assert _snapshot(workdir) == before
  eval_dir = workdir / "eval"
  written = (sorted(p.name for p in eval_dir.iterdir())
             if eval_dir.exists() else [])
  assert set(written) <= {"test_12_6", "test_12_avg2_6", "file_6"}


def test_blank_source_lines_give_blank_translations(random_workdir,
                                                     tmp_path):
  # eval.py --source_file: a blank line in is a blank line out, in its
  # place; the other lines translate as without it (a model with long,
  # varied outputs: random parameters).
  def translations(lines):
    path = tmp_path / f"source_{len(lines)}.txt"
    path.write_text("".join(line + "\n" for line in lines))
    return evaluator.evaluate(str(random_workdir), source_file=str(path),
                              beam_size=1, write=False)["translations"]
  sentences = ["guno duma ri moge", "nigo ri ponoru pabo"]
  plain = translations(sentences)
  assert all(plain)
  assert translations([sentences[0], "", "  ", sentences[1]]) == [
      plain[0], "", "", plain[1]]
