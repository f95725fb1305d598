r"""The paper's Table 3 at small scale, at convergence, with seeds.

    python scripts/table3.py --workdir_root=/work/table3_runs       # the plan
    python scripts/table3.py --workdir_root=/work/table3_runs \
        --rows=A1 --seeds=0,1
    python scripts/table3.py --table_only       # rebuild docs/table3.md
    python scripts/table3.py --status           # done, pending, second seeds
    python scripts/table3.py --list             # the rows

Each run (a row of configs/table3.py and a seed) trains the whole
configs/multi30k.py recipe with the row's change into
`<workdir_root>/<row>_seed<seed>` with `mha.train.trainer.train_and_evaluate`
(a workdir with checkpoints resumes), then is measured:

* dev perplexity: exp(per-token NLL of the dev split, SentencePiece
  pieces, no label smoothing), the trainer's evaluation at the last step
  (metrics.jsonl);
* dev BLEU of the last checkpoint (the paper's Table 3 protocol) and of
  the average of the last 5 checkpoints, and test_2016_flickr BLEU of the
  average: `mha.evaluation.evaluator.evaluate`, beam 4, α 0.6 (sacreBLEU,
  cased);
* parameters, steps, training time (summed over the sessions that trained
  it), the machine and the load while it ran (`LoadSampler`).

Each run's figures go to one JSON file, `<results_dir>/<row>_seed<seed>.json`
(default docs/table3/, in the repository): a run whose file exists is not
run again (`--force` measures it again, from its trained workdir). What a
run has finished (training sessions, evaluations) is kept in its workdir's
`table3_progress.json`, so an interrupted run resumes where it stopped.

Without --rows, the script follows the plan (`planned_runs`): base seed 0;
A1, B1, D1 (the rows most likely to show the paper's conclusions); base
seeds 1 and 2 (the seed spread); every other row with seed 0; then seed 1
of each row whose dev BLEU differs from the base's mean by at most twice
the seed spread (`needs_second_seed`), each decided once its figures are in.
`--max_runs=N` stops after N runs. After each run, the table between the
`<!-- table3:start -->` and `<!-- table3:end -->` markers of `--page`
(default docs/table3.md) is rebuilt from every JSON file.

For tests: `--config_args=tiny` adds configs/table3.py's `tiny` to every
row, `--set=NAME=VALUE` (and `--data_dir`, `--train_split`,
`--eval_split`, `--test_split`) overrides a field of every run.
"""
import argparse
import ast
import dataclasses
import datetime
import functools
import glob
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import ml_collections  # pylint: disable=g-import-not-at-top,wrong-import-position

from configs import table3 as table3_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.store import checkpoints  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model import flops  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.evaluation import evaluator  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.store import trained
from mha.store import metrics as metrics_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model import optim  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.train import evals as train_evals  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.train import trainer  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.errors import UserError  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model.transformer import TransformerConfig  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model.transformer import create_model  # pylint: disable=g-import-not-at-top,wrong-import-position

START_MARKER = "<!-- table3:start -->"
END_MARKER = "<!-- table3:end -->"
PROGRESS_FILE = "table3_progress.json"
NOT_RUN = "not yet measured"
# The paper's Table 3 protocol: beam 4, α 0.6; we add the average of the
# last 5 checkpoints (the paper's Table 2 protocol) and the test split.
BEAM_SIZE = 4
ALPHA = 0.6
AVERAGE_LAST = 5
DEFAULT_RESULTS = os.path.join(REPO, "docs", "table3")
DEFAULT_PAGE = os.path.join(REPO, "docs", "table3.md")
# The plan: these first (seed 0), then the base's other seeds, then the rest.
FIRST_ROWS = ("base", "A1", "B1", "D1")
BASE_SEEDS = (0, 1, 2)
SECOND_SEED = 1
# The figure the seed rule compares: dev BLEU of the last checkpoint, the
# paper's Table 3 protocol.
RULE_METRIC = "dev_bleu_last"
RULE_FACTOR = 2.0  # a second seed when |row - base| <= 2 · spread


class Table3Error(ValueError):
  """Bad arguments or inputs, with a message naming them."""


# ------------------------------------------------------------------ configs


def parse_rows(text: str | None) -> list[str]:
  """Row names from 'base,A1' ('' or 'all': every row), in the table's order.

  Raises:
    Table3Error: an unknown name (the message lists the known ones).
  """
  if text is None or text.strip() in ("", "all"):
    return list(table3_config.ROW_NAMES)
  names = [n.strip() for n in text.split(",") if n.strip()]
  unknown = [n for n in names if n not in table3_config.ROWS]
  if unknown:
    raise Table3Error(
        f"Unknown row(s) {', '.join(unknown)}; known rows: "
        f"{', '.join(table3_config.ROW_NAMES)} (or 'all').")
  return [n for n in table3_config.ROW_NAMES if n in names]


def parse_seeds(text: str) -> list[int]:
  """'0,1' -> [0, 1]."""
  try:
    seeds = sorted({int(s) for s in text.split(",") if s.strip()})
  except ValueError:
    raise Table3Error(f"--seeds takes comma-separated integers, got "
                      f"{text!r}.") from None
  if not seeds or seeds[0] < 0:
    raise Table3Error(f"--seeds must name seeds >= 0, got {text!r}.")
  return seeds


def parse_config_args(text: str | None) -> list[str]:
  """Extra configs/table3.py arguments for every row, e.g. 'tiny'."""
  args = [a.strip() for a in (text or "").split(",") if a.strip()]
  bad = [a for a in args if a in table3_config.ROWS or a.startswith("seed")]
  if bad:
    raise Table3Error(f"--config_args must not name a row or a seed ({bad}); "
                      "use --rows and --seeds.")
  return args


def _parse_value(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text  # a bare string, e.g. a path or a split name


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
  """['vocab_size=600', 'train_split=train[:2000]'] -> {name: value}."""
  overrides = {}
  for item in items:
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
      raise Table3Error(f"--set takes NAME=VALUE, got {item!r}.")
    overrides[name.strip()] = _parse_value(value.strip())
  return overrides


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every run of one invocation shares.

  Attributes:
    workdir_root: one workdir per run below it.
    results_dir: one JSON file per run in it.
    config_args: extra configs/table3.py arguments (e.g. `tiny`).
    overrides: config fields set on every run.
  """
  workdir_root: str
  results_dir: str
  config_args: tuple[str, ...] = ()
  overrides: tuple[tuple[str, Any], ...] = ()

  def config(self, row: str, seed: int = 0) -> ml_collections.ConfigDict:
    return row_config(row, seed, self.config_args, dict(self.overrides))

  def workdir(self, row: str, seed: int) -> str:
    return os.path.join(self.workdir_root, run_name(row, seed))


def run_name(row: str, seed: int) -> str:
  return f"{row}_seed{seed}"


def row_config(row: str, seed: int = 0, config_args: Sequence[str] = (),
               overrides: dict[str, Any] | None = None
               ) -> ml_collections.ConfigDict:
  """configs/table3.py:<row>,seed=<seed>[,<config_args>] with `overrides`."""
  if row not in table3_config.ROWS:
    parse_rows(row)  # raises with the list of known rows
  try:
    config = table3_config.get_config(
        ",".join([row, f"seed={seed}", *config_args]))
  except ValueError as e:
    raise Table3Error(str(e)) from None
  for name, value in (overrides or {}).items():
    if name not in config:
      raise Table3Error(f"--set {name}=...: the config has no field {name!r}.")
    try:
      config[name] = value
    except (TypeError, ValueError) as e:
      raise Table3Error(f"--set {name}={value!r}: {e}") from None
  return config


def count_params(config: ml_collections.ConfigDict) -> int:
  """The model's parameter count, from shapes only (`jax.eval_shape`)."""
  return _count_params(TransformerConfig.from_config(config))


@functools.cache
def _count_params(model_config: TransformerConfig) -> int:
  model = create_model(model_config)
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), ids, ids))["params"]
  return sum(math.prod(leaf.shape)
             for leaf in jax.tree_util.tree_leaves(shapes))


def _quote(value: Any) -> str:
  if isinstance(value, tuple):
    value = ",".join(str(v) for v in value)
  return shlex.quote(str(value))


def commands(row: str, seed: int, workdir: str,
             config: ml_collections.ConfigDict, setup: Setup) -> list[str]:
  """The train.py and eval.py commands that reproduce a run by hand."""
  arg = ",".join([row, f"seed={seed}", *setup.config_args])
  train = (f"python train.py --config=configs/table3.py:{arg} "
           f"--workdir={workdir}")
  for name, value in setup.overrides:
    train += f" --config.{name}={_quote(value)}"
  evaluate = f"python eval.py --workdir={workdir} --split="
  return [train,
          evaluate + _quote(config.eval_split),
          evaluate + f"{_quote(config.eval_split)} --average_last="
          f"{AVERAGE_LAST}",
          evaluate + f"{_quote(config.test_split)} --average_last="
          f"{AVERAGE_LAST}"]


# ----------------------------------------------------------------- results


def _config_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return json.loads(config.to_json())


def same_config(stored: dict[str, Any] | None, current: dict[str, Any]
                ) -> bool:
  """Whether a run made with `stored` still stands for `current`: every
  stored field has the same value now (fields added to the configs since
  do not count; a removed one does)."""
  return stored is not None and all(
      key in current and current[key] == value
      for key, value in stored.items())


def _read_json(path: str) -> dict[str, Any] | None:
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, ValueError) as e:
    raise Table3Error(f"{path} cannot be read: {e}") from None
  if not isinstance(value, dict):
    raise Table3Error(f"{path} does not hold a JSON object.")
  return value


def _write_json(path: str, value: dict[str, Any]) -> None:
  """Writes `value` atomically (a temporary file, then a rename)."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2, ensure_ascii=False)
    f.write("\n")
  os.replace(tmp, path)


def result_path(results_dir: str, row: str, seed: int) -> str:
  return os.path.join(results_dir, run_name(row, seed) + ".json")


_RESULT_NAME = re.compile(r"^(?P<row>.+)_seed(?P<seed>\d+)\.json$")


def load_results(results_dir: str) -> dict[tuple[str, int], dict[str, Any]]:
  """Every run's JSON file in `results_dir`: {(row, seed): result}.

  Raises:
    Table3Error: a file named for an unknown row, whose row or seed
      fields disagree with its name, or whose figures are not numbers
      (`check_figures`).
  """
  found = {}
  for path in sorted(glob.glob(os.path.join(results_dir, "*_seed*.json"))):
    match = _RESULT_NAME.match(os.path.basename(path))
    if not match:
      continue
    row, seed = match["row"], int(match["seed"])
    if row not in table3_config.ROWS:
      raise Table3Error(f"{path}: no row {row!r} in configs/table3.py.")
    result = _read_json(path)
    if result.get("row") != row or result.get("seed") != seed:
      raise Table3Error(f"{path} holds row {result.get('row')!r} seed "
                        f"{result.get('seed')!r}, not its name's.")
    check_figures(path, result)
    found[(row, seed)] = result
  return found


# What the tables read of every run, done or failed (`_row_cells`,
# `_run_cells`, the machines' note): (keys, type).
RECORD_FIELDS = (
    (("config",), dict), (("params",), int), (("steps",), int),
    (("train",), dict), (("train", "seconds"), (int, float)),
    (("load",), dict), (("measured", "finished"), str), (("code",), str),
    (("machine", "cpu"), str), (("machine", "cores"), int))
_KIND_NAMES = {dict: "an object", int: "an integer", str: "a string",
               (int, float): "a number"}


def check_figures(path: str, result: dict[str, Any]) -> None:
  """Raises Table3Error naming `path` and the field unless `result` has a
  status ('done' or 'failed'), each of RECORD_FIELDS of its type and, if
  done, a finite number in each of FIELDS: the seed rule and the tables
  compute with them, so a hand-edited or damaged file is named here rather
  than failing in the arithmetic (a KeyError, a TypeError)."""
  if "status" not in result:
    raise Table3Error(f"{path}: a run without \"status\".")
  if result["status"] not in ("done", "failed"):
    raise Table3Error(f"{path}: \"status\" is "
                      f"{json.dumps(result['status'])[:40]}, not \"done\" "
                      "or \"failed\".")
  for keys, kind in RECORD_FIELDS:
    value, where = result, []
    for key in keys:
      where.append(key)
      named = ".".join(f'"{k}"' for k in where)
      if not isinstance(value, dict) or key not in value:
        raise Table3Error(f"{path}: a run without {named}.")
      value = value[key]
    if isinstance(value, bool) or not isinstance(value, kind):
      raise Table3Error(f"{path}: {named} is {json.dumps(value)[:40]}, not "
                        f"{_KIND_NAMES[kind]}.")
  if result["status"] != "done":
    return
  for field in FIELDS.values():
    if field not in result:
      raise Table3Error(f"{path}: a done run without \"{field}\".")
    value = result[field]
    if (isinstance(value, bool) or not isinstance(value, (int, float))
        or not math.isfinite(value)):
      raise Table3Error(f"{path}: \"{field}\" is {json.dumps(value)[:40]}, "
                        "not a number.")


# ------------------------------------------------------------- seed rule


def seed_values(results: dict[tuple[str, int], dict[str, Any]], row: str,
                metric: str = RULE_METRIC) -> list[float]:
  """`metric` of `row`'s measured (not diverged) runs, by seed."""
  return [r[metric] for (name, _), r in sorted(results.items())
          if name == row and r.get("status") == "done"]


def seed_spread(results: dict[tuple[str, int], dict[str, Any]],
                metric: str = RULE_METRIC) -> float | None:
  """The sample standard deviation of the base's `metric` over its seeds;
  None until all of BASE_SEEDS are measured."""
  values = seed_values(results, "base", metric)
  if len(values) < len(BASE_SEEDS):
    return None
  return statistics.stdev(values)


def needs_second_seed(results: dict[tuple[str, int], dict[str, Any]]
                      ) -> dict[str, bool | None]:
  """For every row but the base: whether it needs a second seed.

  True when its seed-0 dev BLEU is within RULE_FACTOR × the seed spread of
  the base's mean (the difference could be noise); False when farther, or
  when the run diverged; None while the base's seeds or the row's first
  run are not measured.
  """
  spread = seed_spread(results)
  base = seed_values(results, "base")
  decision: dict[str, bool | None] = {}
  for row in table3_config.ROW_NAMES[1:]:
    first = results.get((row, 0))
    if first is None or spread is None:
      decision[row] = None
    elif first.get("status") != "done":
      decision[row] = False
    else:
      difference = abs(first[RULE_METRIC] - statistics.mean(base))
      decision[row] = difference <= RULE_FACTOR * spread
  return decision


def planned_runs(results: dict[tuple[str, int], dict[str, Any]],
                 rows: Sequence[str] | None = None) -> list[tuple[str, int]]:
  """The runs still to make, in the plan's order (see the module doc).

  Second seeds appear once the rule can decide them; `rows` keeps only
  those rows.
  """
  order = [(r, 0) for r in FIRST_ROWS]
  order += [("base", s) for s in BASE_SEEDS if s != 0]
  order += [(r, 0) for r in table3_config.ROW_NAMES if r not in FIRST_ROWS]
  order += [(r, SECOND_SEED) for r, need in needs_second_seed(results).items()
            if need]
  keep = set(rows) if rows is not None else set(table3_config.ROW_NAMES)
  return [run for run in order if run not in results and run[0] in keep]


# ---------------------------------------------------------------- the load


def _read_cpu_jiffies() -> tuple[float, float]:
  """(busy jiffies of every CPU since boot, jiffies of this process)."""
  with open("/proc/stat") as f:
    fields = [float(x) for x in f.readline().split()[1:]]
  # user nice system idle iowait irq softirq steal (guest: inside user)
  busy = sum(fields[:8]) - fields[3] - fields[4]
  with open("/proc/self/stat") as f:
    after_name = f.read().rsplit(")", 1)[1].split()
  own = float(after_name[11]) + float(after_name[12])  # utime + stime
  return busy, own


def other_busy_cores(before: tuple[float, float], after: tuple[float, float],
                     seconds: float, ticks_per_second: float) -> float:
  """CPU cores kept busy by other processes between two `_read_cpu_jiffies`
  snapshots `seconds` apart: (all busy − this process) / elapsed."""
  busy = after[0] - before[0]
  own = after[1] - before[1]
  return max(busy - own, 0.0) / ticks_per_second / max(seconds, 1e-9)


class LoadSampler:
  """The machine's load while a run works, as a context manager.

  Samples the 1-minute load average every `interval` seconds (a thread),
  and measures, from /proc/stat, the cores other processes kept busy over
  the whole span (None where /proc is missing). The load average counts
  this process too (about 2 on a 2-core machine while it trains).
  """

  def __init__(self, interval: float = 30.0):
    self._interval = interval
    self._samples: list[float] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._begin = self._cpu = None
    self.summary: dict[str, Any] = {}

  def _sample(self) -> None:
    while True:
      self._samples.append(os.getloadavg()[0])
      if self._stop.wait(self._interval):
        return

  def __enter__(self) -> "LoadSampler":
    self._begin = time.perf_counter()
    try:
      self._cpu = _read_cpu_jiffies()
    except (OSError, ValueError, IndexError):
      self._cpu = None
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()
    self._samples.append(os.getloadavg()[0])
    seconds = time.perf_counter() - self._begin
    others = None
    if self._cpu is not None:
      others = other_busy_cores(self._cpu, _read_cpu_jiffies(), seconds,
                                os.sysconf("SC_CLK_TCK"))
    self.summary = {"seconds": seconds, "samples": len(self._samples),
                    "load_average_mean": statistics.mean(self._samples),
                    "load_average_max": max(self._samples),
                    "other_busy_cores": others}


def combine_loads(loads: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """One summary of several `LoadSampler` summaries: means weighted by
  their seconds, the highest maximum."""
  loads = [x for x in loads if x]
  if not loads:
    return {}
  seconds = sum(x["seconds"] for x in loads)
  def mean(key):
    values = [(x[key], x["seconds"]) for x in loads if x[key] is not None]
    if not values:
      return None
    return sum(v * s for v, s in values) / max(sum(s for _, s in values),
                                               1e-9)
  return {"seconds": seconds, "samples": sum(x["samples"] for x in loads),
          "load_average_mean": mean("load_average_mean"),
          "load_average_max": max(x["load_average_max"] for x in loads),
          "other_busy_cores": mean("other_busy_cores")}


def machine() -> dict[str, Any]:
  """The host and its devices."""
  devices = jax.local_devices()
  return {"cpu": flops.cpu_model(), "cores": os.cpu_count(),
          "jax": jax.__version__, "devices": len(devices),
          "platform": devices[0].platform}


@functools.cache
def code_version() -> str:
  """The repository's commit (with `+changes` if mha/, configs/ or scripts/
  differ from it), read once: `main` reads it before the first run, so a
  long run names the code it started with."""
  try:
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=10",
                             "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "diff", "--quiet", "HEAD",
                            "--", "mha", "configs", "scripts"]).returncode
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return commit + ("+changes" if dirty else "")


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime(
      "%Y-%m-%d %H:%M UTC")


# -------------------------------------------------------------- measuring


def logged_dev_loss(workdir: str, step: int) -> dict[str, float] | None:
  """The trainer's dev-split evaluation at `step`, from metrics.jsonl."""
  found = None
  for record in metrics_lib.read_metrics(workdir):
    if record.get("step") == step and "eval_nll" in record:
      found = record  # the last one: a resumed run rewrites its steps
  if found is None:
    return None
  return {k: float(found[k]) for k in ("eval_loss", "eval_nll",
                                       "eval_accuracy") if k in found}


def computed_dev_loss(workdir: str, step: int | None = None
                      ) -> dict[str, float]:
  """The same evaluation recomputed from the checkpoint at `step`
  (`train_evals.DevLoss` on the stored config, vocabulary and parameters)."""
  config, tokenizer = trained.load_workdir(workdir)
  params, _, _ = trained.load_params(workdir, step)
  return train_evals.DevLoss(config, tokenizer).evaluate_params(params)


def loop_speed(workdir: str, last_step: int) -> dict[str, float]:
  """Steps/s and tokens/s of the training loop, from metrics.jsonl: the
  median over the logged windows after the first (which holds the
  compilation); the first if it is the only one."""
  windows = [r for r in metrics_lib.read_metrics(workdir)
             if "steps_per_sec" in r and r.get("step", 0) <= last_step]
  if not windows:
    return {}
  steady = windows[1:] or windows
  return {"steps_per_sec": statistics.median(r["steps_per_sec"]
                                             for r in steady),
          "tokens_per_sec": statistics.median(r["tokens_per_sec"]
                                              for r in steady)}


def _save_progress(workdir: str, progress: dict[str, Any]) -> None:
  _write_json(os.path.join(workdir, PROGRESS_FILE), progress)


def _train(name: str, config: ml_collections.ConfigDict, workdir: str,
           progress: dict[str, Any]) -> str | None:
  """Trains (or resumes) to `num_train_steps`; each session's time and load
  go to `progress["sessions"]`.

  Returns:
    None, or the error of a run whose loss diverged.

  Raises:
    RuntimeError: training stopped early (preempted): run again to resume.
  """
  start = checkpoints.latest_step(workdir) or 0
  if start >= config.num_train_steps:
    return None
  print(f"[{name}] training {workdir} from step {start} to "
        f"{config.num_train_steps}", flush=True)
  session = {"start_step": start, "started": _now()}
  error = None
  sampler = LoadSampler()
  try:
    with sampler:
      trainer.train_and_evaluate(config, workdir)
  except FloatingPointError as e:  # a diverged run is a result too
    error = str(e)
  finally:
    session.update(end_step=checkpoints.latest_step(workdir) or 0,
                   seconds=sampler.summary.get("seconds"),
                   load=sampler.summary)
    progress.setdefault("sessions", []).append(session)
    _save_progress(workdir, progress)
  if error is None and session["end_step"] < config.num_train_steps:
    raise RuntimeError(
        f"[{name}] training stopped at step {session['end_step']} < "
        f"num_train_steps={config.num_train_steps} (preempted?); run again "
        "to resume.")
  return error


def evaluations(config: ml_collections.ConfigDict
                ) -> dict[str, dict[str, Any]]:
  """The decodes of a run: name -> evaluator.evaluate's arguments."""
  return {
      "dev_last": dict(split=config.eval_split, average_last=None),
      f"dev_avg{AVERAGE_LAST}": dict(split=config.eval_split,
                                     average_last=AVERAGE_LAST),
      f"test_avg{AVERAGE_LAST}": dict(split=config.test_split,
                                      average_last=AVERAGE_LAST),
  }


EVAL_FIELDS = ("bleu", "chrf", "sacrebleu_signature", "num_sentences",
               "checkpoint_step", "averaged_steps", "decode_seconds",
               "split")


def _evaluate(name: str, config: ml_collections.ConfigDict, workdir: str,
              progress: dict[str, Any]) -> None:
  """Decodes what `progress["evaluations"]` lacks (beam 4, α 0.6)."""
  done = progress.setdefault("evaluations", {})
  for key, kwargs in evaluations(config).items():
    if key in done:
      continue
    print(f"[{name}] decoding {key}: {kwargs}", flush=True)
    with LoadSampler() as sampler:
      scores = evaluator.evaluate(
          workdir, checkpoint_step=config.num_train_steps,
          beam_size=BEAM_SIZE, alpha=ALPHA, **kwargs)
    done[key] = {k: scores[k] for k in EVAL_FIELDS}
    done[key]["load"] = sampler.summary
    _save_progress(workdir, progress)


def run_one(row: str, seed: int, setup: Setup, force: bool = False
            ) -> dict[str, Any]:
  """Trains (or resumes) and measures one run; writes its JSON file.

  Steps: skip a run whose JSON file exists (unless `force`); check the
  workdir's progress is of this config; train; decode; write the result.

  Raises:
    Table3Error: the workdir was trained with another config.
  """
  name = run_name(row, seed)
  path = result_path(setup.results_dir, row, seed)
  if os.path.exists(path) and not force:
    print(f"[{name}] measured already ({path}); skipped.", flush=True)
    return _read_json(path)
  config = setup.config(row, seed)
  workdir = setup.workdir(row, seed)
  current = _config_dict(config)
  progress = _read_json(os.path.join(workdir, PROGRESS_FILE)) or {}
  if progress and not same_config(progress.get("config"), current):
    raise Table3Error(
        f"{os.path.join(workdir, PROGRESS_FILE)} is of another config than "
        f"{name}'s; give another --workdir_root or delete {workdir}.")
  progress["config"] = current
  error = _train(name, config, workdir, progress)
  if error is None:
    _evaluate(name, config, workdir, progress)
  result = compose_result(row, seed, config, setup, progress, error)
  _write_json(path, result)
  print(f"[{name}] " + ("diverged: " + error if error else
                        f"dev PPL {result['dev_perplexity']:.2f}, dev BLEU "
                        f"{result['dev_bleu_last']:.2f} (average of "
                        f"{AVERAGE_LAST}: {result['dev_bleu_avg5']:.2f}); "
                        f"wrote {path}"), flush=True)
  return result


def compose_result(row: str, seed: int, config: ml_collections.ConfigDict,
                   setup: Setup, progress: dict[str, Any],
                   error: str | None) -> dict[str, Any]:
  """A run's JSON record from its workdir and `progress`."""
  workdir = setup.workdir(row, seed)
  definition = table3_config.ROWS[row]
  sessions = progress.get("sessions", [])
  step = checkpoints.latest_step(workdir) or 0
  # Complete when the sessions chain from step 0 to the last step.
  chained = [s["start_step"] for s in sessions] == (
      [0] + [s["end_step"] for s in sessions[:-1]])
  result: dict[str, Any] = {
      "row": row, "seed": seed, "paper": definition.paper,
      "description": definition.description,
      "status": "failed" if error else "done",
      "steps": step, "num_train_steps": config.num_train_steps,
      "params": count_params(config),
      "train": {"seconds": sum(s["seconds"] or 0 for s in sessions),
                "sessions": len(sessions), "timing_complete": chained,
                **loop_speed(workdir, step)},
      "load": combine_loads([s["load"] for s in sessions]),
      "machine": machine(), "code": code_version(),
      "measured": {"started": sessions[0]["started"] if sessions else None,
                   "finished": _now()},
      "commands": commands(row, seed, workdir, config, setup),
      "config": _config_dict(config),
  }
  if error:
    result["error"] = error
    return result
  dev = logged_dev_loss(workdir, step)
  result["dev_loss_source"] = "metrics.jsonl"
  if dev is None:
    dev = computed_dev_loss(workdir, step)
    result["dev_loss_source"] = "recomputed from the checkpoint"
  done = progress["evaluations"]
  result.update(
      dev_split=config.eval_split, test_split=config.test_split,
      dev_nll=dev["eval_nll"], dev_perplexity=math.exp(dev["eval_nll"]),
      dev_loss_smoothed=dev["eval_loss"],
      dev_accuracy=dev.get("eval_accuracy"),
      dev_bleu_last=done["dev_last"]["bleu"],
      dev_bleu_avg5=done[f"dev_avg{AVERAGE_LAST}"]["bleu"],
      test_bleu_avg5=done[f"test_avg{AVERAGE_LAST}"]["bleu"],
      averaged_steps=done[f"dev_avg{AVERAGE_LAST}"]["averaged_steps"],
      beam_size=BEAM_SIZE, alpha=ALPHA,
      sacrebleu_signature=done["dev_last"]["sacrebleu_signature"],
      evaluations=done)
  return result


# ------------------------------------------------------------------- table


def _attention_text(c: dict[str, Any]) -> str:
  kind = c["attention_type"]
  if kind == "location":
    sizes = ",".join(str(w) for w in c["location_filter_sizes"])
    return f"location ({sizes})"
  return {"scaled_dot": "scaled dot", "dot": "dot (unscaled)"}.get(kind, kind)


def describe(c: dict[str, Any]) -> dict[str, str]:
  """The Table 3 columns of a resolved config (dict from config.to_json)."""
  h = c["num_heads"]
  return {
      "N": str(c["num_layers"]), "d_model": str(c["d_model"]),
      "d_ff": str(c["d_ff"]), "h": str(h),
      "d_k": str(c["d_k"] if c["d_k"] is not None else c["d_model"] // h),
      "d_v": str(c["d_v"] if c["d_v"] is not None else c["d_model"] // h),
      "P_drop": f"{c['dropout_rate']:g}",
      "ε_ls": f"{c['label_smoothing']:g}",
      "positions": c["position_encoding"],
      "attention": _attention_text(c),
  }


COLUMNS = ("row", "paper", "N", "d_model", "d_ff", "h", "d_k", "d_v",
           "P_drop", "ε_ls", "positions", "attention", "params", "seeds",
           "dev PPL", "dev BLEU", "dev BLEU avg 5", "test BLEU avg 5",
           "Δ dev BLEU", "train min")
RUN_COLUMNS = ("run", "dev PPL", "dev BLEU", "dev BLEU avg 5",
               "test BLEU avg 5", "steps", "train min", "steps/s",
               "load avg (mean / max)", "other busy cores", "finished",
               "code")
NUMERIC = {"params", "seeds", "dev PPL", "dev BLEU", "dev BLEU avg 5",
           "test BLEU avg 5", "Δ dev PPL", "Δ dev BLEU", "Δ dev BLEU avg 5",
           "Δ test BLEU avg 5", "train min", "steps", "steps/s",
           "other busy cores"}
MEASURED = ("dev PPL", "dev BLEU", "dev BLEU avg 5", "test BLEU avg 5")
FIELDS = {"dev PPL": "dev_perplexity", "dev BLEU": "dev_bleu_last",
          "dev BLEU avg 5": "dev_bleu_avg5",
          "test BLEU avg 5": "test_bleu_avg5"}


def _markdown(columns: Sequence[str], rows: list[dict[str, str]]) -> list[str]:
  lines = ["| " + " | ".join(columns) + " |",
           "|" + "|".join("--:" if c in NUMERIC else "---" for c in columns)
           + "|"]
  return lines + ["| " + " | ".join(r[c] for c in columns) + " |"
                  for r in rows]


def mean_delta(results: dict[tuple[str, int], dict[str, Any]], row: str,
               field: str = RULE_METRIC) -> float | None:
  """`row`'s mean `field` over its measured seeds minus the base's; None
  while either has none."""
  values, base = (seed_values(results, row, field),
                  seed_values(results, "base", field))
  if not values or not base:
    return None
  return statistics.mean(values) - statistics.mean(base)


def _delta_text(row: str, results, spread: float | None) -> str:
  """The row's mean dev BLEU minus the base's, and whether it exceeds twice
  the seed spread."""
  if row == "base":
    return f"s = {spread:.2f}" if spread is not None else ""
  delta = mean_delta(results, row)
  if delta is None:
    return ""
  text = f"{delta:+.2f}"
  if spread is not None:
    text += (" (> 2s)" if abs(delta) > RULE_FACTOR * spread else " (≤ 2s)")
  return text


COMPARE_COLUMNS = ("row", "seeds", *(f"Δ {c}" for c in MEASURED),
                   "beyond 2s", "against the base")
LOWER_IS_BETTER = {"dev PPL"}


def figure_spreads(results: dict[tuple[str, int], dict[str, Any]]
                   ) -> dict[str, float] | None:
  """Each figure's seed spread (`seed_spread` of its field), None until
  the base's seeds are measured."""
  spreads = {c: seed_spread(results, f) for c, f in FIELDS.items()}
  return None if None in spreads.values() else spreads


def _comparison_cells(row: str, results, spreads: dict[str, float]
                      ) -> dict[str, str] | None:
  """The row's mean minus the base's on each figure, and in units of that
  figure's seed spread (bold beyond 2s); None for a row without a measured
  run."""
  seeds = seed_values(results, row)
  if not seeds:
    return None
  cells = {"row": row, "seeds": str(len(seeds))}
  beyond = worse = better = 0
  for column, field in FIELDS.items():
    delta = mean_delta(results, row, field)
    text = f"{delta:+.2f} ({delta / spreads[column]:+.1f}s)"
    if abs(delta) > RULE_FACTOR * spreads[column]:
      text, beyond = f"**{text}**", beyond + 1
    gain = -delta if column in LOWER_IS_BETTER else delta
    worse, better = worse + (gain < 0), better + (gain > 0)
    cells[f"Δ {column}"] = text
  cells["beyond 2s"] = f"{beyond} of {len(FIELDS)}"
  cells["against the base"] = (
      "worse on all" if worse == len(FIELDS) else
      "better on all" if better == len(FIELDS) else
      f"worse on {worse}, better on {better}")
  return cells


def comparison_table(results: dict[tuple[str, int], dict[str, Any]]
                     ) -> list[str]:
  """The lines of the table of each measured row against the base, figure
  by figure; none until the base's seeds are measured."""
  spreads = figure_spreads(results)
  if spreads is None:
    return []
  rows = [cells for row in table3_config.ROW_NAMES[1:]
          for cells in [_comparison_cells(row, results, spreads)] if cells]
  spread_text = ", ".join(f"{c} {spreads[c]:.2f}" for c in MEASURED)
  return ["Against the base, figure by figure: a row's mean minus the "
          "base's, and in units of that figure's seed spread s (the sample "
          "standard deviation of the base's seeds "
          f"{', '.join(str(s) for s in BASE_SEEDS)}: {spread_text}); "
          "beyond 2s in bold. Worse is a higher perplexity or a lower BLEU.",
          ""] + _markdown(COMPARE_COLUMNS, rows)


def _row_cells(row: str, results, setup: Setup, base_cols: dict[str, str],
               spread: float | None) -> dict[str, str]:
  """One row of the main table: means over its measured seeds."""
  runs = {seed: r for (name, seed), r in sorted(results.items())
          if name == row}
  config = (next(iter(runs.values()))["config"] if runs
            else _config_dict(setup.config(row)))
  params = (next(iter(runs.values()))["params"] if runs
            else count_params(setup.config(row)))
  cols = describe(config)
  if row != "base":
    cols = {k: (v if v != base_cols[k] else "") for k, v in cols.items()}
  done = {s: r for s, r in runs.items() if r["status"] == "done"}
  cells = {"row": row, "paper": table3_config.ROWS[row].paper, **cols,
           "params": f"{params:,}", "seeds": str(len(runs)) if runs else "",
           "Δ dev BLEU": _delta_text(row, results, spread)}
  for column, field in FIELDS.items():
    cells[column] = (f"{statistics.mean(r[field] for r in done.values()):.2f}"
                     if done else NOT_RUN)
  failed = [s for s, r in runs.items() if r["status"] != "done"]
  if failed and not done:
    cells["dev PPL"] = "diverged (seed " + ", ".join(map(str, failed)) + ")"
    for column in MEASURED[1:]:
      cells[column] = "—"
  cells["train min"] = (
      f"{statistics.mean(r['train']['seconds'] for r in runs.values()) / 60:.1f}"
      if runs else "")
  return cells


def _run_cells(result: dict[str, Any]) -> dict[str, str]:
  """One run's row of the per-run table."""
  done = result["status"] == "done"
  cells = {c: (f"{result[f]:.2f}" if done else "—")
           for c, f in FIELDS.items()}
  if not done:
    cells["dev PPL"] = "diverged"
  train, load = result["train"], result["load"]
  minutes = f"{train['seconds'] / 60:.1f}"
  if not train.get("timing_complete", True):
    minutes += " (part)"
  others = load.get("other_busy_cores")
  cells.update({
      "run": run_name(result["row"], result["seed"]),
      "steps": f"{result['steps']:,}", "train min": minutes,
      "steps/s": (f"{train['steps_per_sec']:.2f}"
                  if "steps_per_sec" in train else "—"),
      "load avg (mean / max)": (f"{load['load_average_mean']:.1f} / "
                                f"{load['load_average_max']:.1f}"
                                if load else "—"),
      "other busy cores": f"{others:.2f}" if others is not None else "—",
      "finished": result["measured"]["finished"], "code": result["code"]})
  return cells


def build_table(results: dict[tuple[str, int], dict[str, Any]],
                setup: Setup) -> str:
  """The Markdown tables (rows, then runs) and the notes under them.

  Rows without a result take their config columns and parameter count from
  `setup`; their measured columns say NOT_RUN. As in the paper, a row's
  N ... attention cells are blank where they equal the base row's.
  """
  base_config = _config_dict(setup.config("base"))
  base_cols = describe(base_config)
  spread = seed_spread(results)
  rows = [_row_cells(row, results, setup, base_cols, spread)
          for row in table3_config.ROW_NAMES]
  runs = [_run_cells(r) for _, r in sorted(
      results.items(),
      key=lambda kv: (table3_config.ROW_NAMES.index(kv[0][0]), kv[0][1]))]
  lines = _markdown(COLUMNS, rows) + [""] + _notes(results, base_config,
                                                   spread)
  comparison = comparison_table(results)
  if comparison:
    lines += [""] + comparison
  lines += ["", "Each run:", ""] + _markdown(RUN_COLUMNS, runs)
  return "\n".join(lines)


def _notes(results, c: dict[str, Any], spread: float | None) -> list[str]:
  """The lines under the main table: budget, protocol, seed rule, where."""
  peak = optim.peak_learning_rate(c["d_model"], c["warmup_steps"],
                                  c["learning_rate_scale"])
  tokens = c["max_tokens"] * c["grad_accum_steps"]
  measured_rows = {row for row, _ in results}
  notes = [
      f"Budget of every run: {c['num_train_steps']:,} steps of {tokens:,} "
      f"tokens per side and update "
      f"({'packed rows' if c['pack_examples'] else 'length buckets'}), "
      f"warmup {c['warmup_steps']:,}, peak learning rate "
      f"{peak:.2g} at d_model {c['d_model']}, the last {AVERAGE_LAST} "
      f"checkpoints kept. Dev = `{c['eval_split']}`, test = "
      f"`{c['test_split']}`; beam {BEAM_SIZE}, α {ALPHA}; dev BLEU of the "
      f"last checkpoint (the paper's Table 3 protocol) and of the average "
      f"of the last {AVERAGE_LAST}. Cells are means over the row's "
      f"measured seeds. {len(measured_rows)} of "
      f"{len(table3_config.ROW_NAMES)} rows measured ({len(results)} "
      f"run{'s' if len(results) != 1 else ''}).",
  ]
  base = seed_values(results, "base")
  if spread is None:
    notes.append(f"Seed spread: not yet measured ({len(base)} of "
                 f"{len(BASE_SEEDS)} base seeds).")
  else:
    notes.append(
        f"Seed spread s: the sample standard deviation of the base's dev "
        f"BLEU (last checkpoint) over seeds "
        f"{', '.join(str(s) for s in BASE_SEEDS)}: {spread:.2f} (values "
        f"{', '.join(f'{v:.2f}' for v in base)}). Δ is a row's mean minus "
        f"the base's mean; a row within 2s of it gets a second seed.")
    need = [r for r, n in needs_second_seed(results).items() if n]
    if need:
      notes.append("Rows that need a second seed: " + ", ".join(
          f"{r}{' (measured)' if (r, SECOND_SEED) in results else ''}"
          for r in need) + ".")
  machines = sorted({f"{r['machine']['cpu']}, {r['machine']['cores']} cores"
                     for r in results.values()})
  if machines:
    notes.append("Machine: " + "; ".join(machines) + ". The load average "
                 "counts the run itself (about 2 while it trains); other "
                 "busy cores are the CPU time of every other process.")
  signatures = sorted({r["sacrebleu_signature"] for r in results.values()
                       if "sacrebleu_signature" in r})
  if signatures:
    notes.append("BLEU signature " + ", ".join(f"`{s}`" for s in signatures)
                 + ".")
  return notes


def _section(text: str, path: str) -> tuple[int, int]:
  """Where the part between the table3 markers begins and ends in `text`."""
  start, end = text.find(START_MARKER), text.find(END_MARKER)
  if start < 0 or end < start:
    raise Table3Error(f"{path} has no {START_MARKER} ... {END_MARKER} "
                      "section to rewrite.")
  if text.count(START_MARKER) != 1 or text.count(END_MARKER) != 1:
    raise Table3Error(f"{path} has more than one table3 marker pair.")
  return start + len(START_MARKER), end


def replace_section(text: str, table: str, path: str) -> str:
  """`text` with the part between the table3 markers replaced by `table`."""
  start, end = _section(text, path)
  return text[:start] + "\n" + table + "\n" + text[end:]


# A run's line in the per-run table of a page's section.
_PAGE_RUN = re.compile(r"^\| (\S+_seed\d+) \|", re.MULTILINE)


def check_page(path: str, results_dir: str) -> None:
  """Raises Table3Error, before anything runs or is written, if `path`'s
  table lists runs that `results_dir` does not hold: the rebuilt page would
  drop them (a mistyped --results_dir, which a run would create)."""
  text = read_page(path)
  start, end = _section(text, path)
  held = {run_name(row, seed) for row, seed in load_results(results_dir)}
  missing = sorted(set(_PAGE_RUN.findall(text[start:end])) - held)
  if missing:
    shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
    raise Table3Error(
        f"--page={path} lists {len(missing)} run(s) that --results_dir="
        f"{results_dir} does not hold ({shown}): the rebuilt page would "
        "drop them. Give the folder of the page's runs, another --page, or "
        "--page='' (no page).")


def write_page(path: str, table: str) -> None:
  text = read_page(path)
  new = replace_section(text, table, path)
  if new != text:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(new)
    os.replace(tmp, path)


# -------------------------------------------------------------------- main


def list_rows() -> str:
  width = max(len(n) for n in table3_config.ROW_NAMES)
  return "\n".join(f"{r.name:<{width}}  {r.paper:<8}  {r.description}"
                   for r in table3_config.ROWS.values())


def status(results: dict[tuple[str, int], dict[str, Any]],
           workdir_root: str = "") -> str:
  """The measured runs, the seed spread, the rows that need a second seed
  and the runs still planned (with the step of their latest checkpoint
  under `workdir_root`, if any)."""
  spread = seed_spread(results)
  decision = needs_second_seed(results)
  def planned(run):
    step = (checkpoints.latest_step(os.path.join(workdir_root, run_name(*run)))
            if workdir_root else None)
    return run_name(*run) + (f" (at step {step})" if step else "")
  lines = ["measured: " + (", ".join(run_name(*k) for k in results)
                           or "none"),
           "seed spread: " + (f"{spread:.3f}" if spread is not None
                              else "not yet measured"),
           "second seed needed: " + (", ".join(
               r for r, n in decision.items() if n) or "none so far"),
           "undecided: " + (", ".join(
               r for r, n in decision.items() if n is None) or "none"),
           "planned next: " + (", ".join(
               planned(k) for k in planned_runs(results)) or "none")]
  return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  add = parser.add_argument
  add("--workdir_root", default=None, help="One workdir per run below it.")
  add("--results_dir", default=DEFAULT_RESULTS,
      help="One JSON file per run (default docs/table3/).")
  add("--page", default=DEFAULT_PAGE,
      help="Markdown page whose table3 section is rebuilt ('' = none).")
  add("--rows", default=None, help="Rows to run (default: the plan): "
      + ",".join(table3_config.ROW_NAMES))
  add("--seeds", default="0", help="Seeds of --rows (default 0).")
  add("--max_runs", type=int, default=None, help="Stop after N runs.")
  add("--config_args", default="",
      help="configs/table3.py arguments added to every row, e.g. 'tiny'.")
  add("--set", action="append", default=[], metavar="NAME=VALUE",
      help="Override a config field of every run (repeat).")
  for split in ("data_dir", "train_split", "eval_split", "test_split"):
    add(f"--{split}", default=None, help=f"Shorthand for --set={split}=...")
  add("--table_only", action="store_true",
      help="Run nothing; rebuild the table from the JSON files.")
  add("--status", action="store_true",
      help="Print what is measured and planned, and exit.")
  add("--force", action="store_true",
      help="Measure again runs that have a JSON file.")
  add("--list", action="store_true", help="Print the rows and exit.")
  return parser.parse_args(argv)


def _setup(args: argparse.Namespace) -> Setup:
  overrides = parse_overrides(args.set)
  for name in ("data_dir", "train_split", "eval_split", "test_split"):
    if getattr(args, name) is not None:
      overrides[name] = getattr(args, name)
  setup = Setup(args.workdir_root or "", args.results_dir,
                tuple(parse_config_args(args.config_args)),
                tuple(overrides.items()))
  for row in table3_config.ROW_NAMES:  # every config builds before training
    setup.config(row)
  return setup


def _next_runs(args, setup: Setup) -> Callable[[], list[tuple[str, int]]]:
  """What is left to run, asked again after each run (the plan's second
  seeds depend on the results)."""
  if args.rows is None:
    return lambda: planned_runs(load_results(setup.results_dir))
  explicit = [(r, s) for r in parse_rows(args.rows)
              for s in parse_seeds(args.seeds)]
  def left():
    if args.force:
      return explicit
    measured = load_results(setup.results_dir)
    return [run for run in explicit if run not in measured]
  return left


def main(argv: Sequence[str] | None = None) -> str:
  """Runs the requested runs; returns (and writes) the table."""
  args = parse_args(argv)
  if args.list:
    print(list_rows())
    return ""
  setup = _setup(args)
  check_paths(args)
  if args.status:
    text = status(load_results(setup.results_dir), setup.workdir_root)
    print(text)
    return text
  if not args.table_only and not args.workdir_root:
    raise Table3Error("--workdir_root is required (one workdir per run "
                      "below it).")
  if args.page:
    check_page(args.page, setup.results_dir)  # fail now
  left = _next_runs(args, setup)
  code_version()  # the code the runs start with
  done: list[tuple[str, int]] = []
  while not args.table_only and (args.max_runs is None
                                 or len(done) < args.max_runs):
    pending = [run for run in left() if run not in done]
    if not pending:
      break
    run_one(*pending[0], setup, force=args.force)
    done.append(pending[0])
    _rebuild(args, setup)
  return _rebuild(args, setup)


def check_paths(args: argparse.Namespace) -> None:
  """Raises Table3Error naming the flag for a --results_dir that is not a
  folder, or that does not exist where it is only read (--table_only,
  --status: an empty table would replace the page's rows), before
  anything is written; a run creates it with its first JSON file."""
  results_dir = args.results_dir
  if os.path.exists(results_dir) and not os.path.isdir(results_dir):
    raise Table3Error(f"--results_dir={results_dir} is not a folder.")
  if not os.path.exists(results_dir) and (args.table_only or args.status):
    raise Table3Error(f"--results_dir={results_dir} does not exist (the "
                      "folder of the runs' JSON files).")


def read_page(path: str) -> str:
  """The text of --page; Table3Error naming the flag if it cannot be read."""
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except FileNotFoundError:
    raise Table3Error(f"--page={path} does not exist.") from None
  except (OSError, UnicodeDecodeError) as e:
    raise Table3Error(f"--page={path} cannot be read: "
                      f"{getattr(e, 'strerror', None) or e}.") from None


def _rebuild(args, setup: Setup) -> str:
  table = build_table(load_results(setup.results_dir), setup)
  if args.page:
    write_page(args.page, table)
    print(f"Rebuilt the table of {args.page}.", flush=True)
  return table


if __name__ == "__main__":
  absl_logging.set_verbosity(absl_logging.INFO)
  try:
    main()
  except (Table3Error, UserError) as e:
    # One line, as mha/cli/startup.py's `fail` writes the commands' errors.
    sys.exit(f"table3.py: {' '.join(str(e).split())}")
