"""Evaluation never replaces other results; bad input is one line naming it.

Flags are checked before anything is read, results of other settings get
their own folder (or are refused), a failed evaluation leaves the earlier
results byte-identical, `--average_last` survives a trainer deleting
checkpoints meanwhile, and damaged checkpoints, vocabularies and data files
are named with the fix.
"""
import codecs
import gzip
import hashlib
import json
import logging
import math
import pathlib
import re
import shutil

import numpy as np
import pytest

from conftest import file_hashes
from configs import quickstart
from mha.store import averaging
from mha.store import checkpoints
from mha import data
from mha.evaluation import output as eval_output
from mha.evaluation import evaluator
from mha.store import trained
from mha.search import texts as translate
from mha import validation
from mha.data import parallel_text
from mha.data import tokenized
from mha.errors import CheckpointError
from mha.errors import DamagedCheckpointError

SPLIT = "test[:4]"


# ------------------------------------------------------------------- flags


def test_bad_flags_are_refused_before_anything_is_read(copy, eval_py,
                                                      capsys):
  before = file_hashes(copy)
  cases = [
      (dict(alpha=math.nan), r"^alpha must be a finite number >= 0 \(the "
       r"length penalty; the paper: 0.6\), got nan"),
      (dict(alpha=math.inf), "^alpha .* got inf"),
      (dict(alpha=-5.0), "^alpha .* got -5.0"),
      (dict(beam_size=0), "^beam_size must be >= 1, got 0"),
      (dict(max_decode_extra=-1), "^max_decode_extra must be >= 0, got -1"),
      (dict(batch_size=0), "^batch_size must be >= 1, got 0"),
      (dict(checkpoint_step=-2), "^checkpoint_step must be >= 0, got -2"),
      (dict(average_last=0), "^average_last must be >= 1, got 0"),
      (dict(plot_attention=-1), "^plot_attention must be >= 0, got -1"),
      (dict(beam_size=2.5), "^beam_size must be an integer >= 1, got 2.5"),
      (dict(beam_stop="fast"),
       "^beam_stop must be one of exact, early, got 'fast'"),
      (dict(matmul_dtype="float16"),
       "^matmul_dtype must be one of float32, bfloat16, got 'float16'"),
  ]
  for kwargs, message in cases:
    # Named by their keyword arguments (their flags in eval.py, below).
    # Checked first: a workdir that does not exist is not even looked at.
    with pytest.raises(evaluator.EvalError, match=message):
      evaluator.evaluate(str(copy / "absent"), **kwargs)
    with pytest.raises(evaluator.EvalError, match=message):
      evaluator.evaluate(str(copy), split=SPLIT, **kwargs)
  # eval.py: one line, exit 1, the workdir unchanged (no eval/ folder).
  capsys.readouterr()
  assert eval_py(f"--workdir={copy}", "--alpha=nan") == 1
  out, err = capsys.readouterr()
  assert out == "" and err == (
      "eval.py: --alpha must be a finite number >= 0 (the length penalty; "
      "the paper: 0.6), got nan.\n")
  assert eval_py(f"--workdir={copy}", "--beam_stop=fast") == 1
  assert capsys.readouterr().err == (
      "eval.py: --beam_stop must be one of exact, early, got 'fast'.\n")
  # A beam wider than the vocabulary (a beam of 10^6 took the machine's
  # memory): known once config.json is read, before a checkpoint is.
  vocab_size = json.loads((copy / "config.json").read_text())["vocab_size"]
  assert eval_py(f"--workdir={copy}", f"--split={SPLIT}",
                 f"--beam_size={vocab_size + 1}") == 1
  assert capsys.readouterr().err == (
      f"eval.py: --beam_size must be <= {vocab_size}, the vocabulary's "
      f"size, got {vocab_size + 1}.\n")
  assert file_hashes(copy) == before


def test_bad_config_defaults_name_config_json(copy):
  config = json.loads((copy / "config.json").read_text())
  config["alpha"] = -1.0
  (copy / "config.json").write_text(json.dumps(config))
  before = file_hashes(copy)
  # The API names the keyword argument; a command (eval.py) its flag.
  with pytest.raises(evaluator.EvalError, match=re.escape(
      f"{copy / 'config.json'}: alpha must be a finite number >= 0 (the "
      "length penalty; the paper: 0.6), got -1.0. Give alpha.")):
    evaluator.evaluate(str(copy), split=SPLIT)
  with pytest.raises(evaluator.EvalError, match=re.escape(
      f"{copy / 'config.json'}: alpha (the default of --alpha) must be a "
      "finite number >= 0 (the length penalty; the paper: 0.6), got -1.0. "
      "Give --alpha.")):
    with validation.as_flags():
      evaluator.evaluate(str(copy), split=SPLIT)
  assert file_hashes(copy) == before


def test_a_tokenized_reference_file_is_only_compound_split(
    copy, tmp_path, monkeypatch, eval_py, capsys):
  # get_ende_bleu.sh's reference is tokenized already (newstest2014.tok.de):
  # tokenizing it again would escape its "&amp;" once more.
  source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
  source.write_text("ein Satz\n")
  reference.write_text("A dog &amp; a cat .\n")
  monkeypatch.setattr(translate, "translate_with_ids", lambda *a, **k: (
      translate.Translations(["A dog & a cat."], [None], [None], 1.0)))
  kwargs = dict(source_file=str(source), reference_file=str(reference),
                paper_bleu=True, write=False)
  tokenized = evaluator.evaluate(str(copy), reference_tokenized=True,
                                 **kwargs)
  assert tokenized["bleu_paper"] == pytest.approx(100.0)
  assert "|ref:tokenized|" in tokenized["bleu_paper_signature"]
  assert evaluator.evaluate(str(copy), **kwargs)["bleu_paper"] < 100.0
  with pytest.raises(evaluator.EvalError, match=(
      "^reference_tokenized says how paper_bleu reads reference_file")):
    evaluator.evaluate(str(copy), reference_tokenized=True,
                       **dict(kwargs, paper_bleu=False))
  capsys.readouterr()
  assert eval_py(f"--workdir={copy}", "--paper_bleu",
                 "--reference_tokenized") == 1
  assert capsys.readouterr().err == (
      "eval.py: --reference_tokenized says how --paper_bleu reads "
      "--reference_file: give both (a dataset split's references are raw "
      "text).\n")


# ------------------------------------------------------ never overwritten


def _fake_search(model_config, params, tokenizer, sources, settings, *,
                 batch_size):
  """Stands in for the beam search (tested in test_evaluator.py): output
  that depends on the settings (the output length, and every setting that
  is not the paper's: a new one with the paper's default changes
  nothing), without compiling a search per setting."""
  del model_config, params, tokenizer, batch_size
  return translate.Translations(
      [f"{s} | {settings.describe()} | extra {settings.max_decode_extra}"
       for s in sources],
      [None] * len(sources), [None] * len(sources), 2.0,
      compile_seconds=0.5 if settings.beam_stop == "early" else 0.0)


def test_eval_py_names_the_settings_it_was_given(copy, monkeypatch, eval_py,
                                                capsys):
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  assert eval_py(f"--workdir={copy}", f"--split={SPLIT}", "--beam_stop=early",
                 "--matmul_dtype=bfloat16", "--no_repeat_ngram_size=3") == 0
  out = capsys.readouterr().out.split("\n")
  # The time of compiling the searches apart (the fake's 0.5 s of 2 s).
  assert out[0] == (
      f"{SPLIT}, step 6, beam 4, alpha 0.6, stop early, bfloat16 products, "
      "no repeated 3-grams: 4 sentences in 2.0 s, 0.5 s of it compiling "
      "(2.0 sentences/s)")
  folder = "test_4_6_early_bfloat16_norepeat3"
  assert out[1] == f"Wrote {copy / 'eval' / folder}"
  metrics = json.loads((copy / "eval" / folder / "metrics.json").read_text())
  assert metrics["no_repeat_ngram_size"] == 3
  assert (metrics["decode_seconds"], metrics["compile_seconds"]) == (2.0, 0.5)
  # Without compilation (searches compiled before): no such part.
  assert eval_py(f"--workdir={copy}", f"--split={SPLIT}") == 0
  assert capsys.readouterr().out.split("\n")[0] == (
      f"{SPLIT}, step 6, beam 4, alpha 0.6: 4 sentences in 2.0 s "
      "(2.0 sentences/s)")
  translations = (copy / "eval" / folder / "translations.txt").read_text()
  assert translations.split("\n")[0].endswith(
      " | beam 4, alpha 0.6, stop early, bfloat16 products, no repeated "
      "3-grams | extra 8")


def test_other_settings_never_replace_results(copy, monkeypatch):
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  first = evaluator.evaluate(str(copy), split=SPLIT)
  out = copy / "eval" / "test_4_6"
  assert first["output_dir"] == str(out)
  kept = file_hashes(out)
  metrics = json.loads((out / "metrics.json").read_text())
  assert (metrics["beam_size"], metrics["alpha"]) == (4, 0.6)
  assert (metrics["beam_stop"], metrics["matmul_dtype"]) == ("exact",
                                                             "float32")
  assert (out / "translations.txt").read_text().split("\n")[0].endswith(
      " | beam 4, alpha 0.6 | extra 8")  # what the search was given

  # Other settings: another folder, named by what differs from the config.
  for kwargs, name in [
      (dict(beam_size=8, alpha=1.0), "test_4_6_beam8_alpha1.0"),
      (dict(max_decode_extra=3), "test_4_6_extra3"),
      (dict(average_last=2, alpha=0), "test_4_avg2_6_alpha0.0"),
      (dict(beam_stop="early"), "test_4_6_early"),
      (dict(matmul_dtype="bfloat16"), "test_4_6_bfloat16"),
      (dict(no_repeat_ngram_size=2), "test_4_6_norepeat2")]:
    result = evaluator.evaluate(str(copy), split=SPLIT, **kwargs)
    assert result["output_dir"] == str(copy / "eval" / name)
    written = json.loads((copy / "eval" / name / "metrics.json").read_text())
    assert written["alpha"] == kwargs.get("alpha", 0.6)
    assert written["beam_stop"] == kwargs.get("beam_stop", "exact")
    assert written["matmul_dtype"] == kwargs.get("matmul_dtype", "float32")
    assert written["no_repeat_ngram_size"] == kwargs.get(
        "no_repeat_ngram_size", 0)
  assert (copy / "eval" / "test_4_6_early" / "translations.txt").read_text(
      ).split("\n")[0].endswith(" | beam 4, alpha 0.6, stop early | extra 8")
  assert (copy / "eval" / "test_4_6_bfloat16" / "translations.txt"
          ).read_text().split("\n")[0].endswith(
              " | beam 4, alpha 0.6, bfloat16 products | extra 8")
  assert file_hashes(out) == kept

  # The results of the code before beam_stop (no such field in their
  # metrics.json) are those of the exact search: the same evaluation goes on
  # in their folder; an early one is refused there.
  older = copy / "eval" / "older"
  evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(older))
  recorded = json.loads((older / "metrics.json").read_text())
  del (recorded["beam_stop"], recorded["matmul_dtype"],
       recorded["no_repeat_ngram_size"])
  (older / "metrics.json").write_text(json.dumps(recorded))
  evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(older))
  with pytest.raises(evaluator.EvalError,
                     match=re.escape("(beam_stop 'exact', not 'early')")):
    evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(older),
                       beam_stop="early")
  with pytest.raises(evaluator.EvalError, match=re.escape(
      "(matmul_dtype 'float32', not 'bfloat16')")):
    evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(older),
                       matmul_dtype="bfloat16")
  with pytest.raises(evaluator.EvalError, match=re.escape(
      "(no_repeat_ngram_size 0, not 2)")):
    evaluator.evaluate(str(copy), split=SPLIT, output_dir=str(older),
                       no_repeat_ngram_size=2)
  shutil.rmtree(older)

  # A folder that records other settings is refused before any checkpoint
  # is read.
  def no_reading(*args, **kwargs):
    raise AssertionError("a checkpoint was read")

  monkeypatch.setattr(trained, "load_params", no_reading)
  with pytest.raises(evaluator.EvalError, match=re.escape(
      f"{out} holds the results of another evaluation (beam_size 4, not 1); "
      f"eval.py never replaces them: give another output_dir, or delete "
      f"{out} first.")):
    evaluator.evaluate(str(copy), split=SPLIT, beam_size=1,
                       output_dir=str(out))
  with pytest.raises(evaluator.EvalError, match=re.escape(
      "(split 'test[:4]', not 'test[:3]'; checkpoint_step 6, not 4; "
      "averaged_steps [6], not [4])")):
    evaluator.evaluate(str(copy), split="test[:3]", checkpoint_step=4,
                       output_dir=str(out))
  assert file_hashes(out) == kept

  # A failure after decoding (here a NaN score: a bug, so it keeps its type)
  # leaves the earlier results as they were and no temporary folder.
  monkeypatch.undo()
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  monkeypatch.setattr(evaluator.metric_table, "corpus_scores",
                      lambda *args, **kwargs: {"bleu": math.nan})
  with pytest.raises(ValueError, match="Out of range float"):
    evaluator.evaluate(str(copy), split=SPLIT)
  assert file_hashes(out) == kept
  assert sorted(p.name for p in (copy / "eval").iterdir()) == [
      "test_4_6", "test_4_6_beam8_alpha1.0", "test_4_6_bfloat16",
      "test_4_6_early", "test_4_6_extra3", "test_4_6_norepeat2",
      "test_4_avg2_6_alpha0.0"]


def test_a_source_file_of_other_lines_is_another_evaluation(
    copy, monkeypatch, tmp_path):
  # Its folder is named by the path: the lines read are recorded too, so
  # that an edited file is not scored into the earlier results' folder.
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
  source.write_text("a b\nc d\n")
  reference.write_text("x\ny\n")
  out = tmp_path / "out"

  def evaluate():
    return evaluator.evaluate(str(copy), source_file=str(source),
                              reference_file=str(reference),
                              output_dir=str(out))

  evaluate()
  recorded = json.loads((out / "metrics.json").read_text())
  assert [recorded["sources_sha256"], recorded["references_sha256"]] == [
      hashlib.sha256(b"a b\nc d").hexdigest(),
      hashlib.sha256(b"x\ny").hexdigest()]
  evaluate()  # the same lines: the same evaluation, in its folder
  kept = file_hashes(out)
  for path, lines in ((source, "a b\nc e\n"), (reference, "x\nz\n")):
    original = path.read_text()
    path.write_text(lines)
    with pytest.raises(evaluator.EvalError, match=(
        f"{out} holds the results of another evaluation "
        r"\((sources|references)_sha256 '[0-9a-f]{64}', not '[0-9a-f]{64}'\)")):
      evaluate()
    assert file_hashes(out) == kept
    path.write_text(original)
  # Results written before the field was recorded: the same path goes on.
  del recorded["sources_sha256"], recorded["references_sha256"]
  (out / "metrics.json").write_text(json.dumps(recorded))
  source.write_text("a b\nc e\n")
  assert evaluate()["sources_sha256"] == hashlib.sha256(
      b"a b\nc e").hexdigest()


def test_write_outputs_replaces_entries_and_keeps_other_files(tmp_path):
  out = tmp_path / "out"
  eval_output.write_outputs(str(out), ["a"], {"bleu": 1.0})
  (out / "notes.txt").write_text("mine")

  def draw(folder):
    path = pathlib.Path(folder) / "attention" / "x.png"
    path.parent.mkdir()
    path.write_bytes(b"png")
    return [str(path)]

  maps = eval_output.write_outputs(str(out), ["b"], {"bleu": 2.0}, draw)
  assert maps == [str(out / "attention" / "x.png")]
  assert (out / "translations.txt").read_text() == "b\n"
  assert json.loads((out / "metrics.json").read_text()) == {"bleu": 2.0}
  assert (out / "notes.txt").read_text() == "mine"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ------------------------------------------------------- damaged inputs


def _state(value: float) -> dict:
  return {"params": {"w": np.full((4, 3), value, np.float32),
                     "b": np.arange(3, dtype=np.float32) * value},
          "opt_state": {"mu": np.zeros(3, np.float32)},
          "step": np.array(int(value), np.int32)}


def _save(workdir: pathlib.Path, steps, keep: int = 5) -> None:
  manager = checkpoints.make_manager(workdir, keep=keep)
  for step in steps:
    checkpoints.save(manager, step, _state(step), {"step": step})
  manager.close()


def _truncate_data(step_dir: pathlib.Path) -> None:
  for path in (step_dir / "state" / "d").iterdir():
    with open(path, "r+b") as f:
      f.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("damage", ["meta/metadata", "state/_METADATA",
                                    "truncated", "state/_METADATA garbage"])
def test_damaged_checkpoint_names_path_and_intact_step(tmp_path, damage,
                                                       capfd):
  _save(tmp_path, [1, 2, 3])
  step_dir = tmp_path / "checkpoints" / "3"
  (tmp_path / "checkpoints" / "2" / "state" / "_METADATA").unlink()
  if damage == "truncated":
    _truncate_data(step_dir)
    problem = r"state/d/[0-9a-f]+ is truncated"
  elif damage.endswith(" garbage"):  # Orbax's own JSON, overwritten
    damage = damage.split()[0]
    (step_dir / damage).write_text("garbage")
    problem = f"{damage} is not valid JSON"
  else:
    (step_dir / damage).unlink()
    problem = f"{damage} is missing"
  before = file_hashes(tmp_path)
  head = f"Checkpoint {re.escape(str(step_dir))} is damaged: {problem}; "
  aside = re.escape(f"(mv {step_dir} {tmp_path}/damaged_checkpoint_3)")
  manager = checkpoints.make_manager(tmp_path, keep=5)
  with pytest.raises(DamagedCheckpointError, match=(
      head + "the newest intact checkpoint is step 1: to resume from it, "
      f"move the damaged step out of .*checkpoints {aside} and run train.py "
      "again.$")):
    checkpoints.restore(manager, None, _state(0))
  manager.close()
  with pytest.raises(DamagedCheckpointError, match=head):
    checkpoints.check_step(tmp_path)
  # The API names its keyword argument (eval.py its flag, below).
  eval_fix = "the newest intact checkpoint is step 1: evaluate it with " \
             "checkpoint_step=1.$"
  if damage == "meta/metadata":  # evaluation reads params only
    assert checkpoints.restore_params(tmp_path)[1] == 3
    with pytest.raises(CheckpointError, match=head):
      checkpoints.read_meta(tmp_path)
  else:
    with pytest.raises(CheckpointError, match=head + eval_fix):
      checkpoints.restore_params(tmp_path)
    with pytest.raises(CheckpointError, match=head + eval_fix):
      trained.load_params(str(tmp_path))
  assert checkpoints.restore_params(tmp_path, 1)[1] == 1
  assert file_hashes(tmp_path) == before
  # No stack from Orbax's or asyncio's threads (they would print to fd 2).
  assert "Traceback" not in capfd.readouterr().err


def test_no_intact_checkpoint_says_so(tmp_path):
  _save(tmp_path, [1])
  _truncate_data(tmp_path / "checkpoints" / "1")
  manager = checkpoints.make_manager(tmp_path, keep=5)
  with pytest.raises(CheckpointError, match=(
      "no earlier checkpoint is intact: move it out of .* to train from the "
      "start, or use another --workdir.$")):
    checkpoints.restore(manager, 1, _state(0))
  manager.close()
  with pytest.raises(CheckpointError, match="no earlier checkpoint is intact"
                     ".$"):
    checkpoints.restore_params(tmp_path)


def test_eval_py_damaged_checkpoint_and_vocabulary(copy, eval_py, capsys,
                                                   tmp_path):
  (copy / "checkpoints" / "6" / "state" / "_METADATA").unlink()
  before = file_hashes(copy)
  capsys.readouterr()
  assert eval_py(f"--workdir={copy}", f"--split={SPLIT}") == 1
  assert capsys.readouterr().err == (
      f"eval.py: Checkpoint {copy}/checkpoints/6 is damaged: state/_METADATA "
      "is missing; the newest intact checkpoint is step 4: evaluate it with "
      "--checkpoint_step=4.\n")
  assert file_hashes(copy) == before

  # A damaged spm.model: named, never retrained (train or eval), unchanged.
  (copy / "spm.model").write_bytes(b"\x00not a model")
  before = file_hashes(copy)
  message = (f"{copy}/spm.model is not a SentencePiece model (damaged or "
             "another file)")
  assert eval_py(f"--workdir={copy}") == 1
  err = capsys.readouterr().err
  assert err.startswith(f"eval.py: {message}") and err.count("\n") == 1
  with pytest.raises(data.DataError, match=re.escape(message)):
    data.get_tokenizer(quickstart.get_config("tiny"), str(copy))
  assert file_hashes(copy) == before

  # An invalid config.json: one line naming the file.
  (copy / "config.json").write_text("{")
  assert eval_py(f"--workdir={copy}") == 1
  err = capsys.readouterr().err
  assert err.startswith("eval.py: ") and f"{copy}/config.json" in err
  assert err.count("\n") == 1


def test_train_refuses_a_damaged_latest_step_before_writing(copy):
  from mha.train import trainer
  from mha.store import workdir as workdir_lib
  from mha.errors import CheckpointError
  config = workdir_lib.load_config(str(copy))
  config.num_train_steps = 8
  (copy / "checkpoints" / "6" / "state" / "_METADATA").unlink()
  before = file_hashes(copy)
  with pytest.raises(CheckpointError, match=(
      f"{re.escape(str(copy))}/checkpoints/6 is damaged: state/_METADATA is "
      "missing; the newest intact checkpoint is step 4: to resume from it")):
    trainer.train_and_evaluate(config, str(copy))
  assert file_hashes(copy) == before  # no config.json, events file or lock


# ------------------------------------------------- average_last and deletion


def _mean_params(workdir, steps):
  trees = [checkpoints.restore_params(workdir, s)[0] for s in steps]
  return averaging.average_params(trees)


def test_average_last_chooses_again_when_the_trainer_deletes(tmp_path,
                                                             monkeypatch):
  _save(tmp_path, [2, 4, 6], keep=3)
  read = checkpoints.read_params
  calls = []

  def trainer_saves_meanwhile(reader, step, purpose):
    calls.append(step)
    if len(calls) == 1:  # the trainer saves step 8 and deletes step 2
      _save(tmp_path, [8], keep=3)
    return read(reader, step, purpose)

  monkeypatch.setattr(checkpoints, "read_params", trainer_saves_meanwhile)
  params, step, averaged = trained.load_params(str(tmp_path),
                                                 average_last=3)
  assert (step, averaged) == (8, [4, 6, 8])
  monkeypatch.undo()
  np.testing.assert_allclose(params["w"],
                             _mean_params(tmp_path, [4, 6, 8])["w"])

  # Deleted without a new step: the message counts what is there now.
  def trainer_deletes(reader, step, purpose):
    shutil.rmtree(tmp_path / "checkpoints" / "4", ignore_errors=True)
    return read(reader, step, purpose)

  monkeypatch.setattr(checkpoints, "read_params", trainer_deletes)
  with pytest.raises(evaluator.EvalError, match=re.escape(
      f"average_last=3 but {tmp_path}/checkpoints holds 2 checkpoint(s) up "
      "to step 8: [6, 8].")):
    trained.load_params(str(tmp_path), average_last=3)

  # Deleted at every attempt: a bounded number of tries, then one line.
  def always_deleted(reader, step, purpose):
    raise checkpoints.CheckpointNotFound(f"Checkpoint {step} was deleted")

  monkeypatch.setattr(checkpoints, "read_params", always_deleted)
  with pytest.raises(evaluator.EvalError, match=(
      f"deleted while they were read, {trained.READ_ATTEMPTS} times")):
    trained.load_params(str(tmp_path), average_last=2)


def test_a_step_deleted_under_orbax_is_not_called_damaged(tmp_path,
                                                          monkeypatch):
  _save(tmp_path, [1, 2])
  restore = checkpoints.ocp.CheckpointManager.restore

  def deleted_meanwhile(self, step, *args, **kwargs):
    shutil.rmtree(tmp_path / "checkpoints" / str(step))
    return restore(self, step, *args, **kwargs)

  monkeypatch.setattr(checkpoints.ocp.CheckpointManager, "restore",
                      deleted_meanwhile)
  with pytest.raises(checkpoints.CheckpointNotFound,
                     match="2 was deleted while it was read"):
    checkpoints.restore_params(tmp_path, 2)


# ------------------------------------------------------------ data files


def test_damaged_gzip_directory_split_and_bom(tmp_path, monkeypatch):
  monkeypatch.setenv("MHA_TFDS_DIR", str(tmp_path / "tfds"))
  folder = tmp_path / "text"
  folder.mkdir()
  (folder / "train.en").write_text("a b\nc d\n")
  good = gzip.compress("e f\ng h\n".encode() * 50)
  damaged = bytearray(good)
  damaged[len(good) // 2] ^= 0xFF
  (folder / "train.de.gz").write_bytes(bytes(damaged))
  with pytest.raises(data.DataError, match=(
      f"Cannot read {re.escape(str(folder / 'train.de.gz'))}: .*The gzip "
      "file is damaged or cut short: copy or download it again.$")):
    parallel_text.make_builder(str(folder), ("de", "en"))
  assert not (tmp_path / "tfds").exists()

  (folder / "test.de").mkdir()
  (folder / "test.en").write_text("x\n")
  with pytest.raises(data.DataError, match=re.escape(
      f"{folder / 'test.de'} is a directory, not the text file of split "
      "'test', language 'de'.")):
    parallel_text.split_files(str(folder), "test", ("de", "en"))

  bom = tmp_path / "bom.txt"
  bom.write_bytes(codecs.BOM_UTF8 + "Ein Hund.\nZwei.\n".encode())
  assert parallel_text.read_lines(str(bom)) == ["Ein Hund.", "Zwei."]
  assert evaluator.read_lines(str(bom)) == ["Ein Hund.", "Zwei."]
  zipped = tmp_path / "source.de.gz"  # eval.py reads what training reads
  zipped.write_bytes(gzip.compress(b"Ein Hund.\r\n\nZwei."))
  assert evaluator.read_lines(str(zipped)) == ["Ein Hund.", "", "Zwei."]
  bad = tmp_path / "bad.txt"
  bad.write_bytes(codecs.BOM_UTF8 + b"ok\n\xff\n")
  with pytest.raises(data.DataError, match=r"bad.txt, line 2: invalid UTF-8 "
                     r"\(invalid start byte at byte 6\)"):
    parallel_text.read_lines(str(bad))
  # UTF-16 of ASCII text is valid UTF-8 with a NUL after each letter: it
  # was translated into nonsense.
  utf16 = tmp_path / "utf16.txt"
  utf16.write_bytes("ok\nEin Hund.\n".encode("utf-16-le"))
  with pytest.raises(data.DataError, match=(
      r"utf16.txt, line 1: a NUL byte: a UTF-16 or binary file\? Text must "
      r"be UTF-8")):
    evaluator.read_lines(str(utf16))
  utf16.write_bytes(b"ok\nok\n\0")
  with pytest.raises(data.DataError, match=r"utf16.txt, line 3: a NUL"):
    parallel_text.read_lines(str(utf16))


def test_damaged_tokenized_cache_is_made_again(copy, caplog):
  config, tok = trained.load_workdir(str(copy))
  (cache,) = (copy / "tokenized").glob("validation_16_-*.npz")
  good = cache.read_bytes()
  expected = tokenized.tokenize_split(config, tok, "validation[:16]")
  cache.write_bytes(good[:len(good) // 2])
  with caplog.at_level(logging.WARNING):
    again = tokenized.tokenize_split(config, tok, "validation[:16]")
  assert f"Tokenized cache {cache} cannot be read" in caplog.text
  for field in ("inputs", "inputs_offsets", "targets", "targets_offsets"):
    np.testing.assert_array_equal(getattr(again, field),
                                  getattr(expected, field))
  assert cache.read_bytes() == good


def test_a_config_json_that_does_not_describe_the_checkpoint_is_refused(
    copy, eval_py, capsys, tmp_path):
  import mha  # pylint: disable=import-outside-toplevel
  from mha.train import trainer  # pylint: disable=import-outside-toplevel
  from mha.errors import EvalError, WorkdirError  # pylint: disable=import-outside-toplevel
  from conftest import tiny_config  # pylint: disable=import-outside-toplevel
  config_path = copy / "config.json"
  trained = json.loads(config_path.read_text())
  # One layer a side where the checkpoint has two: the model would ignore
  # the second layer's parameters and translate otherwise.
  config_path.write_text(json.dumps(dict(trained, num_layers=1)))
  with pytest.raises(EvalError, match=(
      r"config.json does not describe checkpoint 6: the checkpoint's "
      r"parameter decoder_layers_1/\S+ is not in the model")):
    mha.load(str(copy))
  # A field its rule refuses: named with the file.
  config_path.write_text(json.dumps(dict(trained, num_heads="four")))
  with pytest.raises(EvalError, match=re.escape(
      f"{config_path}: config.num_heads must be an integer >= 1, got "
      "'four'.")):
    mha.load(str(copy))
  # Without d_model (the base's 512 then): the shapes differ.
  config_path.write_text(json.dumps(
      {k: v for k, v in trained.items() if k != "d_model"}))
  before = file_hashes(copy)
  assert eval_py(f"--workdir={copy}", f"--split={SPLIT}") == 1
  assert re.fullmatch(
      r"eval.py: \S+config.json does not describe checkpoint 6: parameter "
      r"\S+ has shape \(.*32.*\) in the checkpoint but \(.*512.*\) "
      r"in the model. Was config.json edited\?\n",
      capsys.readouterr().err)
  assert file_hashes(copy) == before
  # A CTranslate2 export (config.json and spm.model too) is no workdir,
  # to evaluate or to train into.
  export = tmp_path / "ct2"
  export.mkdir()
  for name in ("config.json", "spm.model"):
    shutil.copy(copy / name, export / name)
  (export / "mha_export.json").write_text("{}")
  before = file_hashes(export)
  with pytest.raises(WorkdirError, match="is a CTranslate2 export"):
    mha.load(str(export))
  with pytest.raises(WorkdirError, match="is a CTranslate2 export"):
    trainer.train_and_evaluate(tiny_config(), str(export))
  assert file_hashes(export) == before


def test_piped_eval_py_writes_into_an_output_dir_only_when_given(
    copy, tmp_path, monkeypatch, eval_py, capsys):
  """--source_file=-: the translations alone on standard output, the rest
  on standard error; with --output_dir they are written there too."""
  monkeypatch.setattr(translate, "translate_with_ids", _fake_search)
  read_lines = evaluator.files.read_lines
  monkeypatch.setattr(evaluator.files, "read_lines", lambda path: (
      ["ein Satz", "zwei"] if path == "/dev/stdin" else read_lines(path)))
  out = tmp_path / "out"
  want = ("ein Satz | beam 4, alpha 0.6 | extra 8\n"
          "zwei | beam 4, alpha 0.6 | extra 8\n")
  assert eval_py(f"--workdir={copy}", "--source_file=-") == 0
  captured = capsys.readouterr()
  assert captured.out == want
  assert captured.err.startswith("file, step 6, beam 4, alpha 0.6: 2 ")
  assert not (copy / "eval").exists() and not out.exists()
  assert eval_py(f"--workdir={copy}", "--source_file=-",
                 f"--output_dir={out}") == 0
  captured = capsys.readouterr()
  assert captured.out == want
  assert f"Wrote {out}\n" in captured.err
  assert (out / "translations.txt").read_text() == want
