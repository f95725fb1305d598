r"""One command for a new machine: quickstart, train step, decoding, one table.

    python bench/accelerator.py            # meant for < 10 min on a GPU/TPU
    python bench/accelerator.py --small    # every part, a smoke test's size
    python bench/accelerator.py --decode_workdir=/tmp/m30k  # decode that

On whatever JAX sees (a CPU here; a GPU or TPU where one is at hand), in
order, each part an existing command or bench run as a function:

1. the README's quickstart, as a user runs it: `train.py
   --config=configs/quickstart.py`, then `eval.py` on its workdir, each a
   fresh process, with a fresh compilation cache, before this process
   touches the devices (a TPU is one process's at a time): the commands'
   wall time, the trainer's steady steps/s (the median of its logged
   windows after the first), eval.py's decoding time, compile time, BLEU;
2. the float32 matmul peak of the first device (`bench/common.py`: a jitted
   N x N `jnp.dot`, N 2048 on a CPU, 8192 on an accelerator; the best of
   every measurement of the run, as `bench/train_step.py` keeps it);
3. `bench/train_step.py`'s train step (`run_shape`) at the reference shape
   (configs/multi30k.py on Multi30k packed batches, synthetic ones where
   Multi30k is not found) and the base shape (configs/base.py, 64 x 32+32):
   seconds a step, non-padding tokens/s, model FLOP/s, and MFU against the
   peak of 2;
4. `bench/decode.py`'s timed passes (`Path`, `_timed`), greedy and beam 4,
   on the quickstart's trained model (or `--decode_workdir`) and the split
   eval.py translated: sentences/s, the first pass's compile time, BLEU
   (beam 4's equals eval.py's in 1: the same model, sentences and search).

The parts print their own figures as they go; the table at the end has one
row per figure, with its work, seconds and rate (= work / seconds), and
MFU = achieved / peak. `--small`: the same parts at a smoke test's size
(the quickstart for 100 steps without the in-training BLEU, eval.py and
decoding on 128 test sentences, the `tiny` models of configs/multi30k.py
and configs/base.py on synthetic batches, one timed pass per search); its
figures say that every part runs, not how fast. mha runs here on the
process's JAX devices as they are (one CPU device for all cores, as
`bench/train_step.py`; decode.py's `--cpu_devices=1`). Nothing is asserted
about time.
"""
import argparse
import dataclasses
import json
import math
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
import jax

from bench import common
from bench import decode
from bench import train_step
from mha.runtime import host_memory
# pylint: enable=g-import-not-at-top,wrong-import-position

PARTS = ("quickstart", "train_step", "decode")
TRAIN_SHAPES = ("reference", "base")


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sizes of a run.

  Attributes:
    quickstart_flags: train.py flags after the README's quickstart command.
    split: the split that eval.py and the decode bench translate (None: the
      config's test split).
    config_arg: the train-step shapes' config argument (None: as they are).
    train_flags: bench/train_step.py flags.
    decode_flags: bench/decode.py flags.
  """
  quickstart_flags: tuple[str, ...]
  split: str | None
  config_arg: str | None
  train_flags: tuple[str, ...]
  decode_flags: tuple[str, ...]


FULL = Plan(quickstart_flags=(), split=None, config_arg=None, train_flags=(),
            decode_flags=())
SMALL = Plan(
    quickstart_flags=("--config.num_train_steps=100",
                      "--config.eval_every_steps=100",
                      "--config.checkpoint_every_steps=100",
                      "--config.eval_bleu_sentences=0"),
    split="test[:128]",
    config_arg="tiny", train_flags=("--batching=synthetic", "--steps=2"),
    decode_flags=("--repeats=1",))


@dataclasses.dataclass
class Row:
  """One figure of the table: `work` `unit` in `seconds`.

  Attributes:
    part: what ran (e.g. 'train step reference').
    setting: its shape, data and settings.
    work: how much was done (steps, sentences, tokens a step, FLOP).
    unit: the unit of `work`.
    seconds: the time `work` took.
    achieved: model FLOP/s, where counted.
    compile_seconds: compilation within or before `seconds`, where known.
    bleu: sacreBLEU of the outputs, where there are some.
    note: anything else.
  """
  part: str
  setting: str
  work: float
  unit: str
  seconds: float
  achieved: float | None = None
  compile_seconds: float | None = None
  bleu: float | None = None
  note: str = ""


def significant(x: float, digits: int = 4) -> str:
  """`x` with `digits` significant digits, without an exponent."""
  if not math.isfinite(x):
    return str(x)
  if float(x).is_integer():
    return f"{x:.0f}"
  decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
  return f"{x:.{decimals}f}"


def run_command(argv: list[str], log_path: str) -> float:
  """Runs `argv` from the repository root; its output goes to `log_path`.

  Returns:
    its wall seconds.

  Raises:
    SystemExit: the command failed (the end of its log is shown).
  """
  start = time.perf_counter()
  with open(log_path, "w") as log:
    done = subprocess.run(argv, cwd=REPO, stdout=log,
                          stderr=subprocess.STDOUT, check=False)
  seconds = time.perf_counter() - start
  if done.returncode:
    with open(log_path) as log:
      tail = log.read()[-3000:]
    me = os.path.relpath(os.path.abspath(sys.argv[0]), REPO)  # this bench
    sys.exit(f"{me}: {' '.join(argv[1:3])} failed (status "
             f"{done.returncode}; log {log_path}):\n{tail}")
  return seconds


def _train_log(workdir: str) -> tuple[int, float]:
  """(last step, median logged steps/s after the first window) of the
  workdir's metrics.jsonl."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  rates = [r["steps_per_sec"] for r in records if "steps_per_sec" in r]
  last = max(r["step"] for r in records)
  return last, statistics.median(rates[1:] or rates)


@dataclasses.dataclass(frozen=True)
class Quickstart:
  """The figures of one run of the quickstart's commands.

  Attributes:
    train_seconds: train.py's wall seconds.
    eval_seconds: eval.py's wall seconds.
    steps: the last step trained.
    steady: the trainer's median logged steps/s after the first window.
    metrics: eval.py's metrics.json (bleu, decode_seconds, ...).
  """
  train_seconds: float
  eval_seconds: float
  steps: int
  steady: float
  metrics: dict


def quickstart(plan: Plan, workdir: str,
               python: str = sys.executable) -> Quickstart:
  """The README's quickstart commands run by `python` in fresh processes,
  with a fresh compilation cache, in `workdir` (its logs there too)."""
  cache = os.path.join(workdir, "jax_cache")
  run = os.path.join(workdir, "quickstart")
  config = os.path.join(REPO, "configs", "quickstart.py")
  print(f"\n== quickstart ({python}): " + " ".join(
      ["train.py", f"--config={config}", f"--workdir={run}",
       *plan.quickstart_flags]) + ", then eval.py", flush=True)
  train_seconds = run_command(
      [python, "train.py", f"--config={config}", f"--workdir={run}",
       f"--compilation_cache_dir={cache}", *plan.quickstart_flags],
      os.path.join(workdir, "train.log"))
  steps, steady = _train_log(run)
  output = os.path.join(workdir, "eval")
  eval_seconds = run_command(
      [python, "eval.py", f"--workdir={run}", f"--output_dir={output}",
       f"--compilation_cache_dir={cache}"]
      + ([f"--split={plan.split}"] if plan.split else []),
      os.path.join(workdir, "eval.log"))
  with open(os.path.join(output, "metrics.json")) as f:
    metrics = json.load(f)
  print(f"train.py {train_seconds:.1f} s ({steps} steps, {steady:.1f} "
        f"steps/s after the first window); eval.py {eval_seconds:.1f} s, "
        f"BLEU {metrics['bleu']:.2f}", flush=True)
  return Quickstart(train_seconds, eval_seconds, steps, steady, metrics)


def run_quickstart(plan: Plan, workdir: str) -> list[Row]:
  """The README's quickstart commands in fresh processes, a fresh cache."""
  q = quickstart(plan, workdir)
  metrics = q.metrics
  return [
      Row("quickstart train.py", "configs/quickstart.py, a fresh process "
          "and compilation cache", q.steps, "steps", q.train_seconds,
          note=f"steady {significant(q.steady)} steps/s"),
      Row("quickstart eval.py", f"split {metrics['split']}, beam "
          f"{metrics['beam_size']}",
          metrics["num_sentences"], "sentences", metrics["decode_seconds"],
          compile_seconds=metrics["compile_seconds"], bleu=metrics["bleu"],
          note=f"eval.py {significant(q.eval_seconds)} s in all")]


def run_train_steps(plan: Plan, peak: train_step.Peak,
                    shapes: tuple[str, ...] = TRAIN_SHAPES) -> list[Row]:
  """`bench/train_step.py`'s run at `shapes` (the reference and base)."""
  args = train_step.make_parser().parse_args(list(plan.train_flags))
  rows = []
  for name in shapes:
    config, epoch, description = train_step.shape_setup(name, args,
                                                        plan.config_arg)
    summary = train_step.run_shape(name, config, epoch, description, peak,
                                   args)
    model = (f"{config.num_layers}+{config.num_layers} layers, d_model "
             f"{config.d_model}, vocab {config.vocab_size}")
    rows.append(Row(
        f"train step {name}", f"{model}; {description}",
        summary["nonpad_per_step"], "tokens", summary["seconds_per_step"],
        achieved=summary["achieved_flops"],
        compile_seconds=summary["compile_seconds"],
        note=f"{summary['compiles']} compiles, {summary['shapes']} shapes"))
  return rows


def run_decode(plan: Plan, workdir: str) -> list[Row]:
  """`bench/decode.py`'s timed passes of the current search on a trained
  workdir, greedy then beam search."""
  # pylint: disable=protected-access
  args = decode.make_parser().parse_args(
      [f"--workdir={workdir}", "--baseline=none", *plan.decode_flags]
      + ([f"--split={plan.split}"] if plan.split else []))
  print(f"\n== decode: {workdir}", flush=True)
  setup = decode._workdir_setup(args)
  encoded = setup.encoded
  path = decode.Path("new", decode.translate, setup.model_config, encoded,
                     args.batch_size, setup.cache_extra)
  rows = []
  for search, beam in (("greedy", 1), (f"beam {args.beam_size}",
                                       args.beam_size)):
    r = decode._timed([path], setup.model_config, setup.params, len(encoded),
                      repeats=args.repeats, beam_size=beam,
                      alpha=setup.alpha, max_decode_extra=setup.extra,
                      eos_id=setup.eos_id)[path.name]
    bleu = decode.bleu([setup.tokenizer.decode(out) for out in r["outputs"]],
                       setup.references)
    print(f"{search}: {r['sentences_per_sec']:.1f} sentences/s, first pass "
          f"~{r['compile_seconds']:.1f} s more (compiling), BLEU {bleu:.2f}",
          flush=True)
    rows.append(Row(
        f"decode {search}", f"batches of {args.batch_size}, best of "
        f"{args.repeats} pass(es)", len(encoded), "sentences", r["seconds"],
        compile_seconds=r["compile_seconds"], bleu=bleu,
        note=f"{significant(r['tokens_per_sec'])} tokens/s"))
  return rows


def start_peak(size: int | None = None) -> train_step.Peak:
  """The matmul peak, measured once: N x N `jnp.dot`, N `size` (default:
  2048 on a CPU, 8192 on an accelerator)."""
  accelerator = jax.default_backend() != "cpu"
  peak = train_step.Peak(size or (8192 if accelerator else 2048))
  peak.measure("start")
  return peak


def peak_row(peak: train_step.Peak) -> Row:
  """The peak as a row: one product's FLOPs in the best product's time."""
  work = 2.0 * peak.size ** 3
  return Row("matmul peak", f"float32 {peak.size}x{peak.size} jnp.dot, "
             "best of every measurement", work, "FLOP", work / peak.best,
             achieved=peak.best)


def _amount(x: float, unit: str) -> str:
  """FLOPs with an SI prefix ('17.18 GFLOP'), others as numbers."""
  if unit.startswith("FLOP"):
    return common.fmt_si(x, unit)
  return f"{significant(x)} {unit}"


def print_table(rows: list[Row], peak: float) -> None:
  """The rows as one Markdown table; MFU = achieved / `peak`."""
  cells = []
  for r in rows:
    cells.append([
        r.part, r.setting, _amount(r.work, r.unit), significant(r.seconds),
        _amount(r.work / r.seconds, f"{r.unit}/s"),
        "" if r.achieved is None else common.fmt_si(r.achieved, "FLOP/s"),
        "" if r.achieved is None or r.unit == "FLOP" else
        f"{r.achieved / peak:.1%}",
        "" if r.compile_seconds is None else significant(r.compile_seconds),
        "" if r.bleu is None else f"{r.bleu:.2f}", r.note])
  print(common.table(["part", "setting", "work", "seconds", "rate",
                      "achieved", "MFU", "compile s", "BLEU", "note"],
                     cells))


def make_parser() -> argparse.ArgumentParser:
  """The command's flags."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--small", action="store_true",
                      help="every part at a smoke test's size (about a "
                      "minute on 2 CPU cores)")
  parser.add_argument("--parts", default=",".join(PARTS),
                      help="comma-separated, of: " + ", ".join(PARTS))
  parser.add_argument("--workdir", default=None,
                      help="where the quickstart trains and logs (kept); "
                      "default: a temporary folder, removed at the end")
  parser.add_argument("--decode_workdir", default=None,
                      help="a trained workdir to decode (default: the "
                      "quickstart's)")
  parser.add_argument("--peak_size", type=int, default=None,
                      help="N of the N x N matmul peak (default: 2048 on a "
                      "CPU, 8192 on an accelerator)")
  return parser


def parse_flags(argv: list[str] | None = None) -> argparse.Namespace:
  """The flags, checked: a bad one exits with one line naming it."""
  parser = make_parser()
  args = parser.parse_args(argv)
  args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
  unknown = [p for p in args.parts if p not in PARTS]
  if unknown or not args.parts:
    parser.error(f"--parts={','.join(args.parts)}: not parts of "
                 f"{', '.join(PARTS)}")
  if ("decode" in args.parts and "quickstart" not in args.parts
      and not args.decode_workdir):
    parser.error("--parts: decode without quickstart needs --decode_workdir "
                 "(a trained workdir)")
  if (args.workdir and "quickstart" in args.parts
      and os.path.exists(os.path.join(args.workdir, "quickstart"))):
    parser.error(f"--workdir={args.workdir}: holds a quickstart run already "
                 "(train.py would resume it): give a new folder")
  if args.peak_size is not None and args.peak_size < 1:
    parser.error(f"--peak_size={args.peak_size}: must be at least 1")
  return args


def main():
  args = parse_flags()
  host_memory.start()  # the commands' rule: huge pages on CPU hosts
  plan = SMALL if args.small else FULL
  start = time.perf_counter()
  print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{'--small' if args.small else 'full'} run of "
        f"{', '.join(args.parts)}", flush=True)
  workdir = args.workdir or tempfile.mkdtemp(prefix="mha_accelerator_")
  os.makedirs(workdir, exist_ok=True)
  rows = []
  try:
    # The quickstart's processes first: until they end, this process leaves
    # the devices alone (a TPU is one process's at a time; a GPU's memory
    # is taken by the first process's allocator).
    if "quickstart" in args.parts:
      rows += run_quickstart(plan, workdir)
    print(f"\n{common.machine_line()}", flush=True)
    peak = start_peak(args.peak_size)
    if "train_step" in args.parts:
      rows += run_train_steps(plan, peak)
    if "decode" in args.parts:
      rows += run_decode(plan, args.decode_workdir
                         or os.path.join(workdir, "quickstart"))
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  peak.measure("at the end")
  print(f"\n== {jax.device_count()} {jax.default_backend()} device(s), "
        f"{jax.devices()[0].device_kind}; total "
        f"{time.perf_counter() - start:.0f} s; load average "
        f"{common.load_average():.2f} at the end")
  print_table([peak_row(peak)] + rows, peak.best)


if __name__ == "__main__":
  main()
