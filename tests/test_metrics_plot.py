"""mha/store/metrics.py's metrics.jsonl (write, read, resume truncation, bad
lines) and scripts/plot_metrics.py (its curves and the PNG it writes)."""
import json
import time

import matplotlib.image
import pytest

from mha.store import metrics as metrics_lib
from mha.store import workdir as workdir_lib
from scripts import plot_metrics


def _write(workdir, steps, every_eval=2):
  writer = metrics_lib.MetricsWriter(str(workdir))
  for step in steps:
    writer.write(step, {"nll": 10.0 / step, "loss": 11.0 / step})
    if step % every_eval == 0:
      writer.write(step, {"eval_nll": 12.0 / step, "eval_bleu": 3.0 * step})
  writer.close()


def test_records_round_trip_and_resume_drops_later_steps(tmp_path):
  _write(tmp_path, [1, 2, 3, 4])
  records = metrics_lib.read_metrics(str(tmp_path))
  assert [(r["step"], sorted(set(r) - {"step", "time"})) for r in records] == [
      (1, ["loss", "nll"]), (2, ["loss", "nll"]),
      (2, ["eval_bleu", "eval_nll"]),
      (3, ["loss", "nll"]), (4, ["loss", "nll"]),
      (4, ["eval_bleu", "eval_nll"])]
  assert records[2]["eval_bleu"] == 6.0
  # A run resumed from the step-2 checkpoint rewrites steps 3 and 4.
  metrics_lib.MetricsWriter(str(tmp_path)).truncate_after(2)
  assert [r["step"] for r in metrics_lib.read_metrics(str(tmp_path))] == [
      1, 2, 2]


def test_resume_drops_a_torn_last_line_and_names_a_bad_one(tmp_path):
  _write(tmp_path, [1, 2])
  path = tmp_path / workdir_lib.RUN_METRICS_FILE
  whole = path.read_text()
  # Killed in the middle of appending the step-3 record.
  path.write_text(whole + '{"step": 3, "nl')
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 4: not a JSON"):
    metrics_lib.read_metrics(str(tmp_path))
  metrics_lib.MetricsWriter(str(tmp_path)).truncate_after(5)
  assert path.read_text() == whole
  # A bad line that is not the last is not ours to drop: one clear error.
  lines = whole.splitlines(keepends=True)
  path.write_text(lines[0] + "garbage\n" + "".join(lines[1:]))
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a JSON"):
    metrics_lib.MetricsWriter(str(tmp_path)).truncate_after(5)
  assert path.read_text().count("garbage") == 1


def test_plot_curves_and_png(tmp_path):
  _write(tmp_path, [1, 2, 3, 4, 5, 6], every_eval=3)
  lines = plot_metrics.curves(metrics_lib.read_metrics(str(tmp_path)))
  assert lines["train NLL"] == ([1, 2, 3, 4, 5, 6],
                                [10.0 / s for s in range(1, 7)])
  assert lines["eval NLL"] == ([3, 6], [4.0, 2.0])
  assert lines["eval BLEU"] == ([3, 6], [9.0, 18.0])
  out = tmp_path / "curves.png"
  plot_metrics.main([f"--workdir={tmp_path}", f"--out={out}"])
  image = matplotlib.image.imread(out)
  assert image.shape[:2] == (360, 600)  # 6 x 3.6 inches at 100 dpi
  # Something was drawn: not one flat colour.
  assert image[..., :3].std() > 0.05


def test_plot_bad_workdir_gives_one_clear_error(tmp_path):
  with pytest.raises(SystemExit, match="metrics.jsonl does not exist"):
    plot_metrics.main([f"--workdir={tmp_path}", f"--out={tmp_path / 'a.png'}"])
  (tmp_path / workdir_lib.RUN_METRICS_FILE).write_text(
      json.dumps({"step": 5, "eval_nll": 1.0}) + "\n")
  with pytest.raises(SystemExit, match="holds no training metrics"):
    plot_metrics.main([f"--workdir={tmp_path}", f"--out={tmp_path / 'a.png'}"])
  assert not (tmp_path / "a.png").exists()


@pytest.mark.parametrize("line, problem", [
    ('{"time": 1.0, "nll": 1.0}', 'the record has no "step".'),
    ('{"step": "five", "nll": 1.0}', '"step" is "five", not an integer.'),
    ('{"step": 2.5, "nll": 1.0}', '"step" is 2.5, not an integer.'),
    ('[1, 2]', "not a JSON record ([1, 2] is not an object)."),
], ids=["no_step", "string_step", "float_step", "list"])
def test_a_record_without_an_integer_step_is_named(tmp_path, line, problem):
  # Such lines used to give a KeyError, a plot with a category axis, or be
  # skipped silently.
  _write(tmp_path, [1, 2, 3])
  path = tmp_path / workdir_lib.RUN_METRICS_FILE
  lines = path.read_text().splitlines(keepends=True)
  path.write_text(lines[0] + line + "\n" + "".join(lines[1:]))
  damaged = path.read_text()
  message = f"{path}, line 2: {problem}"
  with pytest.raises(ValueError) as error:
    metrics_lib.read_metrics(str(tmp_path))
  assert str(error.value) == message
  out = tmp_path / "a.png"
  with pytest.raises(SystemExit) as error:
    plot_metrics.main([f"--workdir={tmp_path}", f"--out={out}"])
  assert str(error.value) == f"plot_metrics.py: {message}"
  # A resume refuses it too, and leaves the file as it was.
  with pytest.raises(ValueError, match="line 2: "):
    metrics_lib.MetricsWriter(str(tmp_path)).truncate_after(1)
  assert not out.exists() and path.read_text() == damaged


def test_plot_out_in_a_missing_folder_is_refused(tmp_path):
  _write(tmp_path, [1, 2])
  out = tmp_path / "nope" / "a.png"
  with pytest.raises(SystemExit) as error:
    plot_metrics.main([f"--workdir={tmp_path}", f"--out={out}"])
  assert str(error.value) == (f"plot_metrics.py: --out={out}: the folder "
                              f"{out.parent} does not exist.")
  assert not out.parent.exists()


def test_records_are_strict_json_with_the_wall_clock_time(tmp_path):
  """Each record's `time` is the wall clock (scripts/time_to_bleu.py
  subtracts config.json's mtime from it), and a non-finite value is written
  as a string: every line is JSON that any parser reads (no NaN token)."""
  before = time.time()
  metrics_lib.MetricsWriter(str(tmp_path)).write(
      3, {"loss": float("nan"), "grad_norm": float("inf"), "nll": 2.5})
  after = time.time()
  line = (tmp_path / workdir_lib.RUN_METRICS_FILE).read_text()

  def refuse(name):
    raise ValueError(f"not JSON: {name}")
  record = json.loads(line, parse_constant=refuse)
  assert before <= record.pop("time") <= after
  assert record == {"step": 3, "loss": "nan", "grad_norm": "inf", "nll": 2.5}


def test_blank_lines_are_not_records(tmp_path):
  """read_metrics skips blank lines (a file edited by hand)."""
  _write(tmp_path, [1, 2])
  path = tmp_path / workdir_lib.RUN_METRICS_FILE
  lines = path.read_text().splitlines(keepends=True)
  path.write_text(lines[0] + "\n" + "".join(lines[1:]) + "\n")
  assert [r["step"] for r in metrics_lib.read_metrics(str(tmp_path))] == [
      1, 2, 2]


def test_progress_line_rate_since_the_last_report_and_eta(monkeypatch):
  """The console line's steps/s are those since the previous report, and
  the ETA (hours:minutes:seconds) the steps left at that rate."""
  clock = iter([1000.0, 1010.0, 1030.0])
  monkeypatch.setattr(metrics_lib.time, "perf_counter", lambda: next(clock))
  lines = []
  monkeypatch.setattr(metrics_lib.logging, "info",
                      lambda fmt, *args: lines.append(fmt % args))
  progress = metrics_lib.Progress(0, 100000)
  assert progress.report(100, 2.0) == pytest.approx(10.0)  # 100 in 10 s
  assert progress.report(200, 1.5) == pytest.approx(5.0)  # 100 in 20 s
  # 99,800 steps left at 5 a second: 19,960 s.
  assert lines[1] == ("step 200/100000  loss 1.5000  5.00 steps/s  "
                      "ETA 5:32:40")
