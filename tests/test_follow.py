"""eval.py --follow (mha/evaluation/follow.py): checkpoints evaluated as they
appear.

In process, on a copy of tiny_workdir (checkpoints 2, 4, 6 of a 6-step run)
whose checkpoints are taken away and put back one by one between polls,
through the follower's injected `sleep` (the "trainer"), with a fake clock:
nothing here waits for time to pass.
"""
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest
import sacrebleu
from tensorboard.backend.event_processing import plugin_event_accumulator

from mha import data
from mha.evaluation import evaluator
from mha.store import trained
from mha.evaluation import follow
from mha.store import metrics as metrics_lib
from mha.runtime import files
from mha.scoring import metric_table
from mha.search import texts as translate

SPLIT = "test[:4]"  # the split (and settings) of test_eval_safety.py
NAME = "test_4"
# The metrics of each evaluation without switches (--paper_bleu ...).
DEFAULT = sorted(metric.name for metric in metric_table.chosen())
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def run(copy, tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
  """(`copy` of tiny_workdir with its checkpoints set aside for the test to
  bring in, the folder they were set aside in)."""
  saved = tmp_path / "saved"
  shutil.move(copy / "checkpoints", saved)
  (copy / "checkpoints").mkdir()
  return copy, saved


class Trainer:
  """The follower's `sleep` and `clock`: each sleep advances the clock and
  runs the next of `actions` (functions of nothing) if any is left."""

  def __init__(self, actions):
    self.actions = list(actions)
    self.now = 0.0
    self.sleeps = 0

  def clock(self) -> float:
    return self.now

  def sleep(self, seconds: float) -> None:
    self.sleeps += 1
    self.now += seconds
    if self.actions:
      self.actions.pop(0)()
    elif self.sleeps > 50:  # a follower that would never stop
      raise AssertionError(f"still polling after {self.sleeps} polls")


def save(path, saved, step):
  return lambda: shutil.copytree(saved / str(step),
                                 path / "checkpoints" / str(step))


def delete(path, step):
  return lambda: shutil.rmtree(path / "checkpoints" / str(step))


def _follow(path, trainer, **kwargs):
  return follow.follow(str(path), split=SPLIT, poll_seconds=10.0,
                       clock=trainer.clock, sleep=trainer.sleep, **kwargs)


def _logged(path) -> list[tuple[int, str]]:
  """(step, tag) of every follower score in metrics.jsonl, in order."""
  return [(r["step"], k) for r in metrics_lib.read_metrics(str(path))
          for k in sorted(r) if "/" in k]


def test_each_checkpoint_and_average_is_evaluated_once_as_it_appears(run):
  path, saved = run
  trainer_lines = metrics_lib.read_metrics(str(path))
  save(path, saved, 2)()
  trainer = Trainer([save(path, saved, 4), save(path, saved, 6),
                     delete(path, 2)])
  results = _follow(path, trainer, average_last=2, timeout_seconds=0)
  # Step 2 alone (no average of 2 yet), then 4 and avg(2, 4), then 6 and
  # avg(4, 6); it stops once step 6 = num_train_steps is evaluated, though
  # the trainer (its deletion of step 2) is not done.
  assert [r["averaged_steps"] for r in results] == [[2], [4], [2, 4], [6],
                                                     [4, 6]]
  assert trainer.sleeps == 2 and trainer.actions
  for result in results:
    folder = pathlib.Path(result["output_dir"])
    assert json.loads((folder / "metrics.json").read_text())["bleu"] == (
        result["bleu"])
  assert sorted(p.name for p in (path / "eval").iterdir()) == [
      "follow_test_4.json", "test_4_2", "test_4_4", "test_4_6",
      "test_4_avg2_4", "test_4_avg2_6"]
  # metrics.jsonl: the trainer's lines as they were, then one line per
  # evaluation with the evaluation's scores at the checkpoint's step.
  records = metrics_lib.read_metrics(str(path))
  assert records[:len(trainer_lines)] == trainer_lines
  mine = records[len(trainer_lines):]
  names = [NAME, NAME, f"{NAME}_avg2", NAME, f"{NAME}_avg2"]
  assert [(r["step"], sorted(k for k in r if k not in ("step", "time")))
          for r in mine] == [
              (s, [f"{n}/{metric}" for metric in DEFAULT]) for s, n in
              zip((2, 4, 4, 6, 6), names)]
  for record, result, name in zip(mine, results, names):
    for metric in DEFAULT:
      assert record[f"{name}/{metric}"] == result[metric]
  # TensorBoard: the same scalars, under tags the trainer's do not clash
  # with (the trainer's loss is there too, untouched).
  accumulator = plugin_event_accumulator.EventAccumulator(str(path))
  accumulator.Reload()
  tags = accumulator.PluginTagToContent("scalars").keys()
  assert {f"{NAME}/bleu", f"{NAME}_avg2/chrf", "loss"} <= tags
  assert [(e.step, e.tensor_proto.float_val[0])
          for e in accumulator.Tensors(f"{NAME}_avg2/bleu")] == [
              (4, pytest.approx(results[2]["bleu"])),
              (6, pytest.approx(results[4]["bleu"]))]
  # No trainer lock was taken or left, and the follower's lock is gone.
  assert not (path / "lock").exists()
  assert not list((path / "eval").glob(".*lock"))


def test_every_metric_of_the_table_goes_into_tensorboard_and_jsonl(
    run, monkeypatch):
  """With every switch of the table's opt-in metrics (--paper_bleu ...),
  each metric of the table is written as `<name>/<metric>`, its value
  that of metrics.json; BLEU and chrF are sacreBLEU's called here.

  The translations are the references, every other one shortened (the
  6-step model's are empty: every score 0): scores between 0 and 100.
  """
  path, saved = run
  save(path, saved, 6)()
  _, references = data.load_text_pairs(trained.load_workdir(str(path))[0],
                                       SPLIT)
  texts = [" ".join(r.split()[:-1]) if i % 2 else r
           for i, r in enumerate(references)]
  monkeypatch.setattr(translate, "translate_with_ids", lambda *a, **k: (
      translate.Translations(texts, [None] * 4, [None] * 4, 1.0)))
  switches = {metric.opt_in: True for metric in metric_table.METRICS
              if metric.opt_in}
  (result,) = _follow(path, Trainer([]), timeout_seconds=0, **switches)
  (record,) = metrics_lib.read_metrics(str(path))[-1:]
  tags = {f"{NAME}/{metric.name}": metric.name
          for metric in metric_table.METRICS}
  assert record["step"] == 6
  assert sorted(k for k in record if "/" in k) == sorted(tags)
  folder = pathlib.Path(result["output_dir"])
  written = json.loads((folder / "metrics.json").read_text())
  for tag, metric in tags.items():
    assert record[tag] == written[metric] == result[metric], tag
  accumulator = plugin_event_accumulator.EventAccumulator(str(path))
  accumulator.Reload()
  for tag, metric in tags.items():
    assert [(e.step, e.tensor_proto.float_val[0])
            for e in accumulator.Tensors(tag)] == [
                (6, pytest.approx(written[metric]))], tag
  hypotheses = (folder / "translations.txt").read_text().split("\n")[:-1]
  assert hypotheses == texts
  assert record[f"{NAME}/bleu"] == pytest.approx(
      sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score)
  assert record[f"{NAME}/chrf"] == pytest.approx(
      sacrebleu.metrics.CHRF().corpus_score(hypotheses, [references]).score)
  assert 0 < record[f"{NAME}/bleu"] < 100 and 0 < record[f"{NAME}/chrf"] < 100
  assert record[f"{NAME}/bleu"] != record[f"{NAME}/chrf"]


def test_a_restarted_follower_goes_on_where_it_stopped(run):
  path, saved = run
  save(path, saved, 2)()
  trainer = Trainer([save(path, saved, 4)])
  first = _follow(path, trainer, timeout_seconds=30)
  # Steps 2 and 4, then 30 s (3 polls of 10 s) without a new checkpoint.
  assert [r["checkpoint_step"] for r in first] == [2, 4]
  assert trainer.sleeps == 4 and trainer.now == 40.0
  save(path, saved, 6)()
  again = _follow(path, Trainer([]), timeout_seconds=30)
  assert [r["checkpoint_step"] for r in again] == [6]
  assert _logged(path) == [(step, f"{NAME}/{metric}") for step in (2, 4, 6)
                           for metric in DEFAULT]
  assert json.loads((path / "eval" / "follow_test_4.json").read_text()) == {
      "evaluated": {NAME: [2, 4, 6]}}


def test_a_checkpoint_deleted_while_it_is_read_is_skipped(
    run, monkeypatch, caplog):
  path, saved = run
  for step in (2, 4):
    save(path, saved, step)()
  load_params = trained.load_params

  def deleted_meanwhile(workdir, step=None, average_last=None):
    if step == 2:  # the trainer deletes step 2 as the follower reads it
      delete(path, 2)()
    return load_params(workdir, step, average_last)

  monkeypatch.setattr(trained, "load_params", deleted_meanwhile)
  trainer = Trainer([save(path, saved, 6)])
  with caplog.at_level(logging.WARNING):
    results = _follow(path, trainer, timeout_seconds=0)
  assert [r["checkpoint_step"] for r in results] == [4, 6]
  skipped = [r.getMessage() for r in caplog.records
             if r.levelno >= logging.WARNING and "skipped" in
             r.getMessage()]
  assert len(skipped) == 1 and skipped[0].startswith(
      f"Step 2 ({NAME}) was deleted while it was read")
  assert [s for s, _ in _logged(path)] == [4] * len(DEFAULT) + [6] * len(
      DEFAULT)
  # Recorded as done: a follower started again does not try it.
  assert json.loads((path / "eval" / "follow_test_4.json").read_text())[
      "evaluated"] == {NAME: [2, 4, 6]}


def test_a_second_follower_with_the_same_settings_is_refused(run):
  path, saved = run
  save(path, saved, 2)()
  refused = []

  def second_follower():
    with pytest.raises(evaluator.EvalError) as error:
      _follow(path, Trainer([]), timeout_seconds=10)
    refused.append(str(error.value))
    save(path, saved, 6)()

  results = _follow(path, Trainer([second_follower]), timeout_seconds=0)
  assert [r["checkpoint_step"] for r in results] == [2, 6]
  (message,) = refused
  assert message.startswith("Another eval.py --follow (process ")
  assert "same split and settings" in message
  # The refused follower wrote nothing: one line per step in metrics.jsonl.
  assert [s for s, _ in _logged(path)] == [2] * len(DEFAULT) + [6] * len(
      DEFAULT)


def test_bad_follow_flags_are_one_line_before_anything_is_read(
    run, eval_py, capsys):
  path, _ = run
  with pytest.raises(evaluator.EvalError, match=(
      "^poll_seconds must be > 0 and timeout_seconds >= 0")):
    follow.follow(str(path), poll_seconds=0)
  capsys.readouterr()
  assert eval_py(f"--workdir={path}", "--follow",
                 "--checkpoint_step=2") == 1
  assert capsys.readouterr().err == (
      "eval.py: --checkpoint_step is not taken with --follow, which "
      "evaluates each checkpoint of --workdir on --split into its default "
      "folder.\n")
  assert not (path / "eval").exists()


def test_a_follower_of_a_bucket(gcs_dir, tiny_workdir, tmp_path, monkeypatch):
  # The follower's own files on gs:// (lock, record, metrics.jsonl, event
  # file) through the file layer; the checkpoints and their evaluation,
  # tested above, are stood in for.
  monkeypatch.chdir(tmp_path)
  for name in ("config.json", "spm.model"):
    files.write_bytes_atomic(f"{gcs_dir}/{name}",
                             (tiny_workdir / name).read_bytes())
  present = [2]
  monkeypatch.setattr(follow, "_present", lambda workdir: list(present))
  monkeypatch.setattr(follow, "_readable",
                      lambda workdir, step, count: step in present)

  def evaluate(workdir, *, checkpoint_step, average_last, **kwargs):
    assert workdir == gcs_dir and average_last is None, kwargs
    return {"bleu": float(checkpoint_step), "chrf": 2.0 * checkpoint_step,
            "checkpoint_step": checkpoint_step}

  monkeypatch.setattr(evaluator, "evaluate", evaluate)
  trainer = Trainer([lambda: present.append(4), lambda: present.append(6)])
  results = _follow(gcs_dir, trainer, timeout_seconds=0)
  assert [r["checkpoint_step"] for r in results] == [2, 4, 6]
  assert [(r["step"], r[f"{NAME}/bleu"], r[f"{NAME}/chrf"])
          for r in metrics_lib.read_metrics(gcs_dir)] == [
              (2, 2.0, 4.0), (4, 4.0, 8.0), (6, 6.0, 12.0)]
  assert json.loads(files.read_bytes(f"{gcs_dir}/eval/follow_{NAME}.json")) == {
      "evaluated": {NAME: [2, 4, 6]}}
  assert files.listdir(f"{gcs_dir}/eval") == [f"follow_{NAME}.json"]
  assert [n for n in files.listdir(gcs_dir) if n.startswith("events.")]
  assert not list(tmp_path.iterdir())  # nothing local: no 'gs:' folder


def test_a_sigterm_ends_a_follower_with_one_line_and_its_lock_released(run):
  """eval.py --follow waiting for a checkpoint that does not come, in a
  process of its own: a SIGTERM (an evaluation VM preempted) ends it with
  one line and status 143, its lock removed, not left for the next
  follower to take over."""
  path, _ = run
  process = subprocess.Popen(
      [sys.executable, "eval.py", f"--workdir={path}", "--follow",
       f"--split={SPLIT}"], cwd=REPO, stderr=subprocess.PIPE)
  eval_dir = path / "eval"
  while process.poll() is None and not (
      eval_dir.exists() and any(n.endswith(".lock")
                                for n in os.listdir(eval_dir))):
    threading.Event().wait(0.05)
  process.terminate()
  stderr = process.communicate(timeout=300)[1].decode("utf-8")
  assert process.returncode == 143, stderr[-3000:]
  assert stderr.strip().split("\n")[-1] == "eval.py: Stopped by SIGTERM."
  assert not [n for n in os.listdir(eval_dir) if n.endswith(".lock")]


def test_eval_py_hands_its_follow_flags_to_the_follower(tmp_path, eval_py,
                                                        monkeypatch, capsys):
  """eval.py --follow passes --paper_bleu, --follow_interval and
  --follow_timeout (and the search flags) on, and refuses each flag of a
  single evaluation before anything starts."""
  calls = []
  monkeypatch.setattr(follow, "follow", lambda workdir, **kwargs: (
      calls.append((workdir, kwargs))))
  workdir = str(tmp_path / "run")
  assert eval_py(f"--workdir={workdir}", "--follow", "--paper_bleu",
                 "--follow_interval=7", "--follow_timeout=30",
                 "--average_last=2", "--beam_size=3") == 0
  (got, kwargs), = calls
  assert got == workdir
  assert {k: kwargs[k] for k in ("paper_bleu", "poll_seconds",
                                 "timeout_seconds", "average_last",
                                 "beam_size")} == dict(
      paper_bleu=True, poll_seconds=7.0, timeout_seconds=30.0,
      average_last=2, beam_size=3)
  capsys.readouterr()
  for flag in ("--checkpoint_step=2", "--source_file=src.txt",
               "--reference_file=ref.txt", f"--output_dir={tmp_path}",
               "--reference_tokenized", "--plot_attention=1"):
    assert eval_py(f"--workdir={workdir}", "--follow", flag) == 1, flag
    name = flag[2:].split("=")[0]
    assert capsys.readouterr().err.startswith(
        f"eval.py: --{name} is not taken with --follow"), flag
  assert len(calls) == 1
