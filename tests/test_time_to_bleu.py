"""scripts/time_to_bleu.py: every kept checkpoint's BLEU at its wall time."""
import json
import os
import shutil

import pytest

from mha.evaluation import evaluator
from scripts import time_to_bleu

SPLIT = "validation[:8]"


def test_points_place_each_checkpoint_at_its_training_time(tiny_workdir,
                                                          tmp_path,
                                                          monkeypatch):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  # The clock starts when config.json was written: 100 s before step 1's
  # record, whatever the copy's mtime.
  with open(workdir / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  logged = {r["step"]: r["time"] for r in records if "loss" in r}
  os.utime(workdir / "config.json", (0, logged[1] - 100.0))
  out = tmp_path / "curve.png"
  curves = time_to_bleu.main([f"--run=tiny:{workdir}", f"--split={SPLIT}",
                              f"--out={out}",
                              f"--json={tmp_path / 'points.json'}"])
  rows = curves["tiny"]
  assert [r["step"] for r in rows] == [2, 4, 6]
  for r in rows:
    assert r["minutes"] == pytest.approx(
        (logged[r["step"]] - logged[1] + 100.0) / 60, abs=1e-6)
    # The BLEU is that of the step's own checkpoint, as eval.py writes it.
    with open(workdir / "eval" / f"validation_8_{r['step']}" /
              "metrics.json") as f:
      written = json.load(f)
    assert written["averaged_steps"] == [r["step"]]
    assert written["num_sentences"] == 8
    assert r["bleu"] == written["bleu"] and r["chrf"] == written["chrf"]
  assert out.stat().st_size > 0
  with open(tmp_path / "points.json") as f:
    assert json.load(f) == curves

  # A second call reads the evaluations back instead of decoding again.
  def no_decoding(*args, **kwargs):
    raise AssertionError("evaluated again")
  monkeypatch.setattr(evaluator, "evaluate", no_decoding)
  again = time_to_bleu.main([f"--run=tiny:{workdir}", f"--split={SPLIT}",
                             f"--out={out}"])
  assert again == curves
  # --every=4 keeps the checkpoints whose step is a multiple of 4.
  fours = time_to_bleu.main([f"--run=tiny:{workdir}", f"--split={SPLIT}",
                             f"--out={out}", "--every=4"])
  assert fours == {"tiny": [r for r in rows if r["step"] == 4]}


def test_a_checkpoint_without_a_training_record_is_named(tiny_workdir,
                                                         tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  with open(workdir / "metrics.jsonl") as f:
    lines = [l for l in f if json.loads(l).get("step") != 4]
  with open(workdir / "metrics.jsonl", "w") as f:
    f.writelines(lines)
  with pytest.raises(SystemExit, match="checkpoint 4 has no training record"):
    time_to_bleu.main([f"--run=tiny:{workdir}", f"--split={SPLIT}",
                       f"--out={tmp_path / 'x.png'}"])


def test_run_needs_a_label_and_a_workdir(tmp_path):
  with pytest.raises(Exception, match="LABEL:WORKDIR"):
    time_to_bleu.parse_run("/tmp/m30k")
  # A colon inside the label leaves a path that is no workdir: named.
  with pytest.raises(SystemExit, match="is not a training workdir"):
    time_to_bleu.main([f"--run=a (:b):{tmp_path}", "--out=x.png"])


def test_a_copied_workdir_starts_at_the_start_it_recorded(tiny_workdir,
                                                         tmp_path):
  # `cp -r` gives config.json the copy's time, after every record: the
  # times were negative. The first training record's window (its steps
  # over its steps_per_sec) gives the start instead.
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  with open(workdir / "metrics.jsonl") as f:
    training = [r for r in map(json.loads, f) if "loss" in r]
  os.utime(workdir / "config.json", (0, training[-1]["time"] + 3600.0))
  first = training[0]
  start = first["time"] - first["step"] / first["steps_per_sec"]
  times = time_to_bleu.step_times(str(workdir))
  assert times == {r["step"]: pytest.approx(r["time"] - start)
                   for r in training}
  assert min(times.values()) > 0


@pytest.mark.parametrize("flag, message", [
    ("--every=0", "--every=0: must be an integer >= 1."),
    ("--out={tmp}/nope/curve.png",
     "--out={tmp}/nope/curve.png: the folder {tmp}/nope does not exist."),
    ("--out={tmp}", "--out={tmp} is a folder, not a file to write."),
    ("--json={tmp}/nope/points.json",
     "--json={tmp}/nope/points.json: the folder {tmp}/nope does not exist."),
    ("--mark_minutes=abc", "--mark_minutes='abc': expected comma-separated "
     "numbers of minutes, e.g. 20,40 ('' for none)."),
], ids=["every", "out_folder", "out_is_folder", "json_folder", "marks"])
def test_bad_flags_are_refused_before_any_evaluation(tmp_path, monkeypatch,
                                                     flag, message):
  # These used to fail with a traceback, --out and --mark_minutes only
  # after every checkpoint was evaluated.
  def no_evaluation(*args, **kwargs):
    raise AssertionError("evaluated before the flags were checked")
  monkeypatch.setattr(time_to_bleu, "points", no_evaluation)
  with pytest.raises(SystemExit) as error:
    time_to_bleu.main([f"--run=a:{tmp_path}", f"--out={tmp_path / 'c.png'}",
                       flag.format(tmp=tmp_path)])
  assert str(error.value) == "time_to_bleu.py: " + message.format(
      tmp=tmp_path)
  assert list(tmp_path.iterdir()) == []


def test_mark_minutes_empty_draws_no_line(tmp_path, monkeypatch):
  """--mark_minutes='' means no vertical line (the help's promise), a list
  means a line at each; a run without checkpoints is an empty curve."""
  workdir = tmp_path / "run"
  (workdir / "checkpoints").mkdir(parents=True)
  (workdir / "config.json").write_text("{}")
  drawn = []
  monkeypatch.setattr(time_to_bleu, "plot",
                      lambda curves, split, out, marks: drawn.append(marks))
  for marks in ("", "5, 7.5"):
    assert time_to_bleu.main([f"--run=empty:{workdir}",
                              f"--out={tmp_path / 'x.png'}",
                              f"--mark_minutes={marks}"]) == {"empty": []}
  assert drawn == [[], [5.0, 7.5]]
