"""eval.py and mha.evaluator on a workdir trained for a few steps."""
import hashlib
import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import sacrebleu

from configs import quickstart
from mha import checkpoints
from mha import data
from mha import evaluator
from mha import trainer
from mha.transformer import TransformerConfig

REPO = pathlib.Path(__file__).resolve().parents[1]
SPLIT = "test[:12]"
FIELDS = ("bleu", "chrf", "sacrebleu_signature", "num_sentences",
          "checkpoint_step", "averaged_steps", "beam_size", "alpha",
          "decode_seconds", "sentences_per_second")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
  """Checkpoints at steps 2, 4, 6 of a tiny run (never modified by tests)."""
  path = tmp_path_factory.mktemp("evaluator") / "run"
  config = quickstart.get_config("tiny")
  config.update(vocab_size=512, max_source_length=24, max_target_length=24,
                max_tokens=768, num_train_steps=6, checkpoint_every_steps=2,
                eval_every_steps=100, eval_bleu_sentences=0, keep_checkpoints=5,
                max_decode_extra=8)
  trainer.train_and_evaluate(config, str(path))
  return path


def _run_eval(*args, stdin=None):
  return subprocess.run([sys.executable, "eval.py", *args], cwd=REPO,
                        input=stdin, capture_output=True, text=True,
                        timeout=300)


def _snapshot(path: pathlib.Path) -> dict[str, str]:
  """Hashes of every file of a workdir outside eval/."""
  return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(path.rglob("*"))
          if p.is_file() and p.relative_to(path).parts[0] != "eval"}


def test_eval_py_writes_metrics_and_bleu_recomputes(workdir):
  before = _snapshot(workdir)
  result = _run_eval(f"--workdir={workdir}", f"--split={SPLIT}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "BLEU" in result.stdout
  out = workdir / "eval" / "test_12_6"
  metrics = json.loads((out / "metrics.json").read_text())
  for field in FIELDS:
    assert field in metrics, field
  assert metrics["checkpoint_step"] == 6 and metrics["averaged_steps"] == [6]
  assert (metrics["beam_size"], metrics["alpha"]) == (4, 0.6)
  assert metrics["num_sentences"] == 12
  assert "tok:13a" in metrics["sacrebleu_signature"]
  hypotheses = (out / "translations.txt").read_text().split("\n")[:-1]
  config = quickstart.get_config()
  _, references = data.load_text_pairs(config, SPLIT)
  assert len(hypotheses) == len(references) == 12
  recomputed = sacrebleu.corpus_bleu(hypotheses, [references]).score
  assert metrics["bleu"] == pytest.approx(recomputed)
  assert _snapshot(workdir) == before  # only eval/ was written


def test_average_last_is_the_mean_of_the_last_checkpoints(workdir, tmp_path):
  params, step, averaged = evaluator.load_params(str(workdir), average_last=2)
  assert (step, averaged) == (6, [4, 6])
  p4, _ = checkpoints.restore_params(str(workdir), 4)
  p6, _ = checkpoints.restore_params(str(workdir), 6)
  jax.tree_util.tree_map(
      lambda got, a, b: np.testing.assert_allclose(got, (a + b) / 2,
                                                   rtol=1e-6),
      params, p4, p6)
  result = evaluator.evaluate(str(workdir), split=SPLIT, average_last=2,
                              output_dir=str(tmp_path / "out"))
  assert result["averaged_steps"] == [4, 6]
  assert json.loads((tmp_path / "out" / "metrics.json").read_text())[
      "averaged_steps"] == [4, 6]


def test_stdin_to_stdout_one_line_per_line(workdir):
  sources, _ = data.load_text_pairs(quickstart.get_config(), "test[:3]")
  lines = [sources[0], "", sources[1], sources[2]]
  result = _run_eval(f"--workdir={workdir}", "--source_file=-",
                     "--beam_size=1", stdin="\n".join(lines) + "\n")
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout.split("\n")
  assert out[-1] == "" and len(out) - 1 == 4
  # In order: the same sentences translated one by one give the same lines.
  config = quickstart.get_config("tiny")
  saved = json.loads((workdir / "config.json").read_text())
  config.update(saved)
  tokenizer = data.get_tokenizer(config, str(workdir))
  params, _ = checkpoints.restore_params(str(workdir))
  model_config = TransformerConfig.from_config(config, deterministic=True)
  for line, translated in zip(lines, out):
    expected = evaluator.translate_texts(
        model_config, params, tokenizer, [line], beam_size=1, alpha=0.6,
        max_decode_extra=config.max_decode_extra)
    assert translated == expected[0]


def test_batching_and_order_do_not_change_translations(workdir):
  config = quickstart.get_config("tiny")
  config.update(json.loads((workdir / "config.json").read_text()))
  tokenizer = data.get_tokenizer(config, str(workdir))
  params, _ = checkpoints.restore_params(str(workdir))
  model_config = TransformerConfig.from_config(config, deterministic=True)
  sources, _ = data.load_text_pairs(config, "test[:10]")
  kwargs = dict(beam_size=2, alpha=0.6, max_decode_extra=8)
  whole = evaluator.translate_texts(model_config, params, tokenizer, sources,
                                    batch_size=64, **kwargs)
  small = evaluator.translate_texts(model_config, params, tokenizer, sources,
                                    batch_size=3, **kwargs)
  reversed_ = evaluator.translate_texts(model_config, params, tokenizer,
                                        sources[::-1], batch_size=4, **kwargs)
  assert whole == small == reversed_[::-1]


def test_bad_inputs_give_one_clear_error(workdir, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  shutil.copy(workdir / "config.json", empty)
  shutil.copy(workdir / "spm.model", empty)
  source = tmp_path / "src.txt"
  source.write_text("a\nb\nc\n")
  reference = tmp_path / "ref.txt"
  reference.write_text("a\nb\n")
  blank = tmp_path / "blank.txt"
  blank.write_text("")
  cases = [
      (dict(workdir=str(tmp_path / "missing")), "does not exist"),
      (dict(workdir=str(empty)), "checkpoint"),
      (dict(workdir=str(workdir), checkpoint_step=5), r"\[2, 4, 6\]"),
      (dict(workdir=str(workdir), average_last=4), "3 checkpoint"),
      (dict(workdir=str(workdir), source_file=str(source),
            reference_file=str(reference)), "3 lines .* 2"),
      (dict(workdir=str(workdir), source_file=str(blank)), "is empty"),
      (dict(workdir=str(workdir), split="nonexistent"), "nonexistent"),
  ]
  for kwargs, message in cases:
    with pytest.raises(evaluator.EvalError, match=message):
      evaluator.evaluate(**kwargs, write=False)
  # eval.py prints just the message and fails.
  result = _run_eval(f"--workdir={workdir}", "--checkpoint_step=5")
  assert result.returncode != 0
  assert "No checkpoint for step 5" in result.stderr
  assert "available steps: [2, 4, 6]" in result.stderr
  assert "Traceback" not in result.stderr
