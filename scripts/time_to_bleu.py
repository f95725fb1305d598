r"""Time-to-BLEU curves: BLEU of every kept checkpoint against wall time.

    python scripts/time_to_bleu.py --run=old:/tmp/m30k_old --run=new:/tmp/m30k \
        --split=val --out=docs/multi30k_time_to_bleu.png

For each `--run=LABEL:WORKDIR` (a local training workdir), every checkpoint
in `checkpoints/` is evaluated on `--split` as `eval.py --split=SPLIT
--checkpoint_step=STEP` would (the config's beam, α and output limit; the
outputs go to `<workdir>/eval/<split>_<step>/`, and a step already evaluated
there is read back, not decoded again), and placed at the wall time at which
training reached that step: the `time` of the step's training record in
`metrics.jsonl` minus the time `config.json` was written (the run's set-up,
a few seconds after the command starts: imports are not counted), or, in a
copied workdir whose config.json is newer than the run, the start its first
training record implies (`run_start`). Keep the checkpoints you want on the
curve with `--config.keep_checkpoints=N` when training. A run that was
resumed has a gap in its clock; its curve is drawn as logged.

Writes the plot (`--out`, PNG) and prints one line per point; `--json` also
writes the points; `--every=N` keeps the checkpoints whose step is a
multiple of N.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from mha.store import checkpoints
from mha.runtime import cpu_devices
from mha.evaluation import output as eval_output
from mha.evaluation import evaluator
from mha.store import metrics
from mha.store import workdir as workdir_lib
from mha.errors import UserError


def _fail(message: str) -> None:
  """Exits with `time_to_bleu.py: <message>` (one line), status 1, as
  mha/cli/startup.py's `fail` does for the commands."""
  sys.exit(f"time_to_bleu.py: {' '.join(str(message).split())}")


def run_start(config_path: str, training: list[dict]) -> float:
  """The wall time the run's clock starts at: config.json's mtime (the
  run's set-up), unless the run's own records say it started earlier.

  An mtime is not a record of the run: a copy (`cp -r` without -p, a
  download) sets it to the copy's time, after every record, and the curve
  started at negative minutes. The run's first training record bounds it:
  the trainer's first summary covers steps 1 to its step, its
  `steps_per_sec` being those steps over the seconds since the training
  loop started (compilation included), so its `time` minus step /
  steps_per_sec is when the loop started. The earlier of the two is kept:
  in the run's own workdir the mtime (the set-up, vocabulary and
  tokenization counted, as before), in a copy the recorded start. Times
  are then >= 0, clock changes aside.
  """
  origin = os.path.getmtime(config_path)
  if not training:
    return origin
  first = training[0]
  rate = first.get("steps_per_sec")
  window = (first["step"] / rate if isinstance(rate, (int, float))
            and math.isfinite(rate) and rate > 0 else 0.0)
  return min(origin, first["time"] - window)


def step_times(workdir: str) -> dict[int, float]:
  """Seconds from the run's start (`run_start`) to the end of each logged
  training step, from metrics.jsonl's training records."""
  config_path = workdir_lib.Workdir(workdir).config_path
  if not os.path.isfile(config_path):
    raise UserError(f"{config_path} does not exist: {workdir} is not a "
                    "training workdir (each --run is LABEL:WORKDIR, the "
                    "label without a colon).")
  try:
    training = [r for r in metrics.read_metrics(workdir) if "loss" in r]
  except ValueError as e:  # a damaged line, named
    raise UserError(str(e)) from None
  bad = next((r for r in training
              if not isinstance(r.get("time"), (int, float))), None)
  if bad is not None:
    raise UserError(f"{workdir_lib.Workdir(workdir).metrics_path}: the "
                    f"training record of step {bad['step']} has no numeric "
                    "\"time\".")
  origin = run_start(config_path, training)
  return {r["step"]: r["time"] - origin for r in training}


def checkpoint_bleu(workdir: str, step: int, split: str) -> dict:
  """metrics.json of `split` at checkpoint `step` (eval.py's default
  settings), evaluated now unless its output folder holds it already."""
  folder = eval_output.default_output_dir(workdir, split, [step])
  done = os.path.join(folder, "metrics.json")
  if os.path.exists(done):
    with open(done) as f:
      return json.load(f)
  return evaluator.evaluate(workdir, split=split, checkpoint_step=step)


def points(workdir: str, split: str, every: int = 1) -> list[dict]:
  """(step, minutes, BLEU, chrF) of the checkpoints of `workdir` whose step
  is a multiple of `every`."""
  times = step_times(workdir)
  out = []
  for step in (s for s in checkpoints.all_steps(workdir) if s % every == 0):
    if step not in times:
      raise UserError(f"{workdir}: checkpoint {step} has no training record "
                      "in metrics.jsonl (log_every_steps must divide "
                      "checkpoint_every_steps).")
    result = checkpoint_bleu(workdir, step, split)
    out.append({"step": step, "minutes": times[step] / 60,
                "bleu": result["bleu"], "chrf": result["chrf"]})
  return out


def parse_run(text: str) -> tuple[str, str]:
  label, sep, path = text.partition(":")
  if not sep or not label or not path:
    raise argparse.ArgumentTypeError(
        f"--run={text!r}: expected LABEL:WORKDIR, e.g. new:/tmp/m30k.")
  return label, path


def plot(curves: dict[str, list[dict]], split: str, out: str,
         marks: list[float]) -> None:
  fig, ax = plt.subplots(figsize=(6, 3.6))
  for label, rows in curves.items():
    ax.plot([r["minutes"] for r in rows], [r["bleu"] for r in rows], "o-",
            label=label)
  for minutes in marks:
    ax.axvline(minutes, color="grey", linestyle=":", linewidth=1)
  ax.set_xlabel("wall time of training (minutes)")
  ax.set_ylabel(f"BLEU on {split}")
  ax.grid(alpha=0.3)
  ax.legend(loc="lower right")
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)


def _writable(flag: str, path: str) -> None:
  """Exits naming `flag` unless `path` can be written: its folder exists
  and it is not a folder (checked first: the evaluations take minutes)."""
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    _fail(f"{flag}={path}: the folder {folder} does not exist.")
  if os.path.isdir(path):
    _fail(f"{flag}={path} is a folder, not a file to write.")


def parse_marks(text: str) -> list[float]:
  """'20,40' -> [20.0, 40.0] ('' -> []); exits naming --mark_minutes."""
  try:
    marks = [float(m) for m in text.split(",") if m.strip()]
  except ValueError:
    _fail(f"--mark_minutes={text!r}: expected comma-separated numbers of "
          "minutes, e.g. 20,40 ('' for none).")
  if not all(math.isfinite(m) for m in marks):
    _fail(f"--mark_minutes={text!r}: the minutes must be finite numbers.")
  return marks


def check_args(args: argparse.Namespace) -> list[float]:
  """Exits on a bad flag before any checkpoint is evaluated; returns the
  marks' minutes."""
  if args.every < 1:
    _fail(f"--every={args.every}: must be an integer >= 1.")
  _writable("--out", args.out)
  if args.json:
    _writable("--json", args.json)
  return parse_marks(args.mark_minutes)


def main(argv=None) -> dict[str, list[dict]]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--run", action="append", type=parse_run, required=True,
                      help="LABEL:WORKDIR, repeated for several runs")
  parser.add_argument("--split", default="val")
  parser.add_argument("--every", type=int, default=1,
                      help="only the checkpoints whose step is a multiple "
                      "of this")
  parser.add_argument("--out", required=True, help="PNG file to write")
  parser.add_argument("--json", default=None, help="also write the points")
  parser.add_argument("--mark_minutes", default="20,40",
                      help="vertical lines at these minutes ('' for none)")
  args = parser.parse_args(argv)
  marks = check_args(args)
  cpu_devices.use_cpu_cores()  # the searches on the cores, as eval.py's
  curves = {}
  try:
    for label, workdir in args.run:
      curves[label] = points(workdir, args.split, args.every)
  except UserError as e:
    _fail(str(e))
  for label, rows in curves.items():
    for r in rows:
      print(f"{label}\tstep {r['step']}\t{r['minutes']:.2f} min\t"
            f"BLEU {r['bleu']:.2f}\tchrF {r['chrf']:.2f}")
  plot(curves, args.split, args.out, marks)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(curves, f, indent=1)
  return curves


if __name__ == "__main__":
  main()
