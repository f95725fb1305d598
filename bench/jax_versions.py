r"""The quickstart's BLEU and the train step's MFU on two JAX versions.

    python bench/jax_versions.py    # .venv (JAX 0.10.2), .venv313 (JAX 0.12)
    python bench/jax_versions.py --python=/work/main/.venv/bin/python \
        --python=/work/venv313/bin/python --repeats=3
    python bench/jax_versions.py --small --python=A --python=B   # smoke test

Each interpreter given (`--python`, twice or more; default: the repository's
`.venv` and `.venv313`, as `.ci/run` makes them) runs this tree's code in
fresh processes, the interpreters taking turns (A, B, A, B, ...) so that the
load of a shared machine falls on each alike:

1. the README's quickstart (`bench/accelerator.py`'s `quickstart`:
   `train.py --config=configs/quickstart.py`, then `eval.py`, each run in a
   workdir and compilation cache of its own), `--quickstart_repeats` times
   each: BLEU, train.py's and eval.py's wall seconds;
2. `bench/train_step.py`'s train step at the reference shape (configs/
   multi30k.py on Multi30k packed batches, `--data_dir` or the config's
   folder; synthetic batches where Multi30k is not found), through
   `bench/accelerator.py`'s `run_train_steps` in a process of its own that
   first measures its float32 matmul peak, `--repeats` times each: s/step,
   non-padding tokens/s, MFU (model FLOP/s over that process's peak).

Then one table: a row per interpreter (its Python, jax, jaxlib and flax
versions, read from it; medians over its runs, the range of its s/step) and
a row per later interpreter of ratios to the first (B/A). `--small`:
accelerator.py's smoke-test sizes (the quickstart for 100 steps, eval.py on
128 test sentences, the tiny reference model on synthetic batches): it says
that every part runs, not how fast. Nothing is asserted about time.
"""
import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# pylint: disable=g-import-not-at-top,wrong-import-position
from bench import accelerator
from bench import common
from mha.model import flops
from mha.runtime import host_memory
# pylint: enable=g-import-not-at-top,wrong-import-position

DEFAULT_PYTHONS = (os.path.join(REPO, ".venv", "bin", "python"),
                   os.path.join(REPO, ".venv313", "bin", "python"))
RESULT = "jax_versions result: "  # the train-step process's last line
PROBE = ("import json, platform, flax, jax, jaxlib, mha; print(json.dumps("
         "{'Python': platform.python_version(), 'jax': jax.__version__, "
         "'jaxlib': jaxlib.__version__, 'flax': flax.__version__, "
         "'mha': mha.__file__}))")
HEADERS = ["interpreter", "Python", "jax", "jaxlib", "flax", "BLEU",
           "train.py s", "eval.py s", "s/step", "s/step min-max", "tokens/s",
           "MFU", "peak FLOP/s", "runs"]


@dataclasses.dataclass
class Interpreter:
  """One Python of the comparison and what it ran.

  Attributes:
    label: 'A', 'B', ... in the order given.
    path: the interpreter.
    versions: its Python, jax, jaxlib and flax versions (`PROBE`).
    quickstarts: its quickstart runs.
    train_steps: its train-step runs (`train_step_run`'s dicts).
  """
  label: str
  path: str
  versions: dict[str, str]
  quickstarts: list[accelerator.Quickstart] = dataclasses.field(
      default_factory=list)
  train_steps: list[dict[str, float | str]] = dataclasses.field(
      default_factory=list)


def probe(path: str) -> dict[str, str]:
  """The versions of interpreter `path`, which must import this tree's mha.

  Raises:
    SystemExit: one line naming `--python=path` and what is wrong.
  """
  if not (os.path.isfile(path) and os.access(path, os.X_OK)):
    sys.exit(f"bench/jax_versions.py: --python={path}: no such interpreter "
             "(the defaults are the .venv and .venv313 that .ci/run makes)")
  done = subprocess.run([path, "-c", PROBE], cwd=REPO, capture_output=True,
                        text=True, check=False)
  if done.returncode:
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    sys.exit(f"bench/jax_versions.py: --python={path}: cannot import jax, "
             f"jaxlib, flax and mha: {last}")
  versions = json.loads(done.stdout.strip().splitlines()[-1])
  mha_dir = os.path.dirname(os.path.dirname(versions.pop("mha")))
  if os.path.realpath(mha_dir) != os.path.realpath(REPO):
    sys.exit(f"bench/jax_versions.py: --python={path}: imports mha from "
             f"{mha_dir}, not from this tree {REPO}")
  return versions


def plan_of(small: bool, data_dir: str | None) -> accelerator.Plan:
  """accelerator.py's sizes, with the train step's Multi30k folder."""
  plan = accelerator.SMALL if small else accelerator.FULL
  if data_dir:
    plan = dataclasses.replace(
        plan, train_flags=plan.train_flags + (f"--data_dir={data_dir}",))
  return plan


def child_main(args: argparse.Namespace) -> None:
  """In the interpreter compared: the matmul peak, then the train step at
  the reference shape; its figures as one JSON line after `RESULT`."""
  host_memory.start()  # the commands' rule: huge pages on CPU hosts
  peak = accelerator.start_peak()
  row, = accelerator.run_train_steps(plan_of(args.small, args.data_dir),
                                     peak, shapes=("reference",))
  print(RESULT + json.dumps({
      "seconds_per_step": row.seconds, "tokens_per_sec": row.work
      / row.seconds, "mfu": row.achieved / peak.best, "peak": peak.best,
      "setting": row.setting}),
        flush=True)


def train_step_run(python: str, args: argparse.Namespace,
                   log_path: str) -> dict[str, float | str]:
  """`child_main` run by `python` in a fresh process; its figures."""
  accelerator.run_command(
      [python, os.path.abspath(__file__), "--child"]
      + (["--small"] if args.small else [])
      + ([f"--data_dir={args.data_dir}"] if args.data_dir else []), log_path)
  with open(log_path) as f:
    lines = [line for line in f if line.startswith(RESULT)]
  if not lines:
    sys.exit(f"bench/jax_versions.py: {python}: the train step printed no "
             f"figures (log {log_path})")
  result = json.loads(lines[-1][len(RESULT):])
  print(f"train step ({python}): {result['seconds_per_step']:.4f} s/step, "
        f"{result['tokens_per_sec']:.0f} tokens/s, MFU {result['mfu']:.2%}; "
        f"load average {common.load_average():.2f}", flush=True)
  return result


def figures(it: Interpreter) -> dict[str, float]:
  """Medians over `it`'s runs (the best peak) of the table's numbers."""
  steps = it.train_steps

  def median(key: str) -> float:
    return statistics.median(float(r[key]) for r in steps)

  return {
      "BLEU": statistics.median(q.metrics["bleu"] for q in it.quickstarts),
      "train.py s": statistics.median(q.train_seconds
                                      for q in it.quickstarts),
      "eval.py s": statistics.median(q.eval_seconds for q in it.quickstarts),
      "s/step": median("seconds_per_step"),
      "tokens/s": median("tokens_per_sec"), "MFU": median("mfu"),
      "peak FLOP/s": max(float(r["peak"]) for r in steps)}


def _cell(key: str, x: float) -> str:
  """The table's cell of figure `key` (a `figures` key) of value `x`."""
  if key == "MFU":
    return accelerator.significant(100 * x) + "%"
  if key == "peak FLOP/s":
    return common.fmt_si(x, "FLOP/s")
  return f"{x:.2f}" if key == "BLEU" else accelerator.significant(x)


def table_cells(interpreters: list[Interpreter]) -> list[list[str]]:
  """The table's rows (`HEADERS`): one per interpreter, then the ratios of
  each later one to the first."""
  rows, first = [], figures(interpreters[0])
  for it in interpreters:
    numbers = figures(it)
    seconds = [float(r["seconds_per_step"]) for r in it.train_steps]
    cells = {key: _cell(key, x) for key, x in numbers.items()}
    cells.update({
        "interpreter": f"{it.label}: {it.path}", "runs":
        f"{len(it.quickstarts)} + {len(it.train_steps)}", "s/step min-max":
        f"{accelerator.significant(min(seconds))}-"
        f"{accelerator.significant(max(seconds))}", **it.versions})
    rows.append([cells.get(h, "") for h in HEADERS])
  for it in interpreters[1:]:
    ratios = {key: f"{x / first[key]:.3f}"
              for key, x in figures(it).items()}
    ratios["interpreter"] = f"{it.label}/{interpreters[0].label}"
    rows.append([ratios.get(h, "") for h in HEADERS])
  return rows


def make_parser() -> argparse.ArgumentParser:
  """The command's flags."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--python", action="append", default=None,
                      help="an interpreter to compare (twice or more; "
                      "default: the repository's .venv and .venv313)")
  parser.add_argument("--repeats", type=int, default=3,
                      help="train-step runs per interpreter")
  parser.add_argument("--quickstart_repeats", type=int, default=1,
                      help="quickstart runs per interpreter")
  parser.add_argument("--small", action="store_true",
                      help="bench/accelerator.py's smoke-test sizes")
  parser.add_argument("--data_dir", default=None,
                      help="the train step's Multi30k folder (default: "
                      "configs/multi30k.py's data_dir)")
  parser.add_argument("--workdir", default=None,
                      help="where the runs and their logs go (kept); "
                      "default: a temporary folder, removed at the end")
  parser.add_argument("--child", action="store_true",
                      help=argparse.SUPPRESS)  # one train-step process
  return parser


def parse_flags(argv: list[str] | None = None) -> argparse.Namespace:
  """The flags, checked: a bad one exits with one line naming it."""
  parser = make_parser()
  args = parser.parse_args(argv)
  args.python = args.python or list(DEFAULT_PYTHONS)
  if len(args.python) < 2:
    parser.error(f"--python={args.python[0]}: give two interpreters or more "
                 "(the same one twice measures the noise)")
  for flag in ("repeats", "quickstart_repeats"):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag}={getattr(args, flag)}: must be at least 1")
  if args.data_dir and not os.path.isdir(args.data_dir):
    parser.error(f"--data_dir={args.data_dir}: no such folder")
  if args.workdir and os.path.exists(args.workdir) and os.listdir(
      args.workdir):
    parser.error(f"--workdir={args.workdir}: not empty (a quickstart there "
                 "would resume a run): give a new folder")
  return args


def run_all(args: argparse.Namespace, workdir: str) -> list[Interpreter]:
  """Every run, the interpreters taking turns: quickstarts, train steps."""
  interpreters = [Interpreter(chr(ord("A") + i), path, probe(path))
                  for i, path in enumerate(args.python)]
  for it in interpreters:
    print(f"{it.label}: {it.path}: " + ", ".join(
        f"{k} {v}" for k, v in it.versions.items()), flush=True)
  plan = plan_of(args.small, args.data_dir)
  for i in range(args.quickstart_repeats):
    for it in interpreters:
      folder = os.path.join(workdir, f"{it.label}_quickstart_{i}")
      os.makedirs(folder)
      it.quickstarts.append(accelerator.quickstart(plan, folder, it.path))
  for i in range(args.repeats):
    for it in interpreters:
      it.train_steps.append(train_step_run(
          it.path, args, os.path.join(workdir, f"{it.label}_train_step_{i}"
                                      ".log")))
  return interpreters


def main():
  args = parse_flags()
  if args.child:
    child_main(args)
    return
  start = time.perf_counter()
  print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{flops.cpu_model()}, {os.cpu_count()} cores; load average "
        f"{common.load_average():.2f}; {' '.join(sys.orig_argv)}",
        flush=True)
  workdir = args.workdir or tempfile.mkdtemp(prefix="mha_jax_versions_")
  os.makedirs(workdir, exist_ok=True)
  try:
    interpreters = run_all(args, workdir)
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  print(f"\n== total {time.perf_counter() - start:.0f} s; load average "
        f"{common.load_average():.2f} at the end; train step: "
        f"{interpreters[0].train_steps[0]['setting']}")
  print(common.table(HEADERS, table_cells(interpreters)))


if __name__ == "__main__":
  main()
