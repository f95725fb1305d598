r"""The paper's Table 3 at small scale: train each variant, measure it on dev.

    python scripts/table3.py --workdir_root=workdirs/table3  # every row
    python scripts/table3.py --workdir_root=workdirs/table3 --rows=base,A1,A3
    python scripts/table3.py --workdir_root=workdirs/table3 --table_only
    python scripts/table3.py --list  # the rows, their paper row, what changes

Each row of configs/table3.py (rows A, B, D, E of the paper's Table 3 scaled
to d_model 256 / 4 heads, the §3.2.1 compatibility functions, location-aware
and multi-resolution attention) is trained with the same fixed budget by
`mha.trainer.train_and_evaluate` into `<workdir_root>/<row>` (a workdir with
checkpoints resumes; a finished one only loads), then measured on the dev
split (`config.eval_split`, Multi30k `val`), as the paper's Table 3:

* dev perplexity: exp(per-token NLL of the dev split, without label
  smoothing), the trainer's evaluation at the last step as logged in
  `metrics.jsonl` (recomputed from the checkpoint if that entry is missing);
* dev BLEU: `mha.evaluator.evaluate` on the last checkpoint (no averaging),
  beam 4, α 0.6 (sacreBLEU, cased, detokenized);
* parameters (counted from `jax.eval_shape`), the wall time of the training
  call (vocabulary, tokenization, compilation and the step-200 loss
  evaluation included) and the loop's steps/s (median of the logged windows
  after the first, which holds the compilation).

Each row's figures go to `<workdir_root>/<row>/table3.json`, so the rows can be
run in stages (`--rows=base,A1` today, `--rows=location,multires` later);
a row whose table3.json holds the same resolved config (every stored field
equal; fields added to the configs since do not count) is not run again
(`--force` re-measures it). A row whose loss turns non-finite is recorded
as diverged, with its step, and the next row runs. The table is built from
every table3.json under `--workdir_root`, printed, and written between the
`<!-- table3:start -->` and `<!-- table3:end -->` markers of `--readme`
(default: the repository's README.md; `--readme=` writes nothing). Rows
without a result show "not run"; no figure is written that was not measured.

For tests and quick checks, `--config_args=tiny` adds configs/table3.py's
`tiny` to every row and `--set=NAME=VALUE` (also `--data_dir`,
`--train_split`, `--eval_split`) overrides a config field of every row; the
table's commands then carry the same arguments.
"""
import argparse
import ast
import datetime
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
from typing import Any, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import ml_collections  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench import common  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import table3 as table3_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha import checkpoints  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha import evaluator  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha import metrics as metrics_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha import optim  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha import trainer  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.errors import UserError  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.transformer import Transformer  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.transformer import TransformerConfig  # pylint: disable=g-import-not-at-top,wrong-import-position

RESULT_FILE = "table3.json"
START_MARKER = "<!-- table3:start -->"
END_MARKER = "<!-- table3:end -->"
NOT_RUN = "not run"
FINAL = ("done", "failed")  # statuses of a finished row (failed: diverged)
# The paper's Table 3 protocol: beam 4, α 0.6, no checkpoint averaging.
BEAM_SIZE = 4
ALPHA = 0.6
DEFAULT_README = os.path.join(REPO, "README.md")


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


def parse_config_args(text: str | None) -> list[str]:
  """Extra configs/table3.py arguments for every row, e.g. 'tiny'."""
  args = [a.strip() for a in (text or "").split(",") if a.strip()]
  rows = [a for a in args if a in table3_config.ROWS]
  if rows:
    raise Table3Error(f"--config_args must not name a row ({rows}); use "
                      "--rows.")
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


def row_config(row: str, config_args: Sequence[str] = (),
               overrides: dict[str, Any] | None = None
               ) -> ml_collections.ConfigDict:
  """configs/table3.py:<row>[,<config_args>] with `overrides` applied."""
  if row not in table3_config.ROWS:
    parse_rows(row)  # raises with the list of known rows
  try:
    config = table3_config.get_config(",".join([row, *config_args]))
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
  model = Transformer(TransformerConfig.from_config(config))
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), ids, ids))["params"]
  return common.count_params(shapes)


def _value_text(value: Any) -> str:
  text = str(value)
  return shlex.quote(text) if text != shlex.quote(text) else text


def commands(row: str, workdir: str, config: ml_collections.ConfigDict,
             config_args: Sequence[str] = (),
             overrides: dict[str, Any] | None = None) -> tuple[str, str]:
  """The train.py and eval.py commands that reproduce a row by hand."""
  arg = ",".join([row, *config_args])
  train = (f"python train.py --config=configs/table3.py:{arg} "
           f"--workdir={workdir}")
  for name, value in (overrides or {}).items():
    if isinstance(value, tuple):
      value = ",".join(str(v) for v in value)
    train += f" --config.{name}={_value_text(value)}"
  evaluate = (f"python eval.py --workdir={workdir} "
              f"--split={_value_text(config.eval_split)}")
  if config.beam_size != BEAM_SIZE:
    evaluate += f" --beam_size={BEAM_SIZE}"
  if config.alpha != ALPHA:
    evaluate += f" --alpha={ALPHA}"
  return train, evaluate


# ---------------------------------------------------------------- measuring


def _config_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return json.loads(config.to_json())


def same_config(stored: dict[str, Any] | None, current: dict[str, Any]
                ) -> bool:
  """Whether a row measured with `stored` (its table3.json) still stands for
  `current`: every stored field has the same value now. Fields added to the
  configs since (absent from `stored`) do not count, so a new config field
  does not make every measured row run again; a removed one does.
  """
  return stored is not None and all(
      key in current and current[key] == value
      for key, value in stored.items())


def load_result(workdir: str) -> dict[str, Any] | None:
  path = os.path.join(workdir, RESULT_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _write_result(workdir: str, result: dict[str, Any]) -> None:
  path = os.path.join(workdir, RESULT_FILE)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(result, f, indent=2, ensure_ascii=False)
    f.write("\n")
  os.replace(tmp, path)


def logged_dev_loss(workdir: str, step: int) -> dict[str, float] | None:
  """The trainer's dev-split evaluation at `step`, from metrics.jsonl."""
  found = None
  for record in metrics_lib.read_metrics(workdir):
    if record.get("step") == step and "eval_nll" in record:
      found = record  # the last one: a resumed run rewrites its steps
  if found is None:
    return None
  return {k: float(found[k]) for k in ("eval_loss", "eval_nll",
                                       "eval_perplexity", "eval_accuracy")
          if k in found}


def computed_dev_loss(workdir: str, step: int | None = None
                      ) -> dict[str, float]:
  """The same evaluation recomputed from the checkpoint at `step`.

  The trainer's code (`trainer.DevLoss`: per-token NLL over the whole
  `config.eval_split`, without label smoothing) on the stored config,
  vocabulary and parameters.
  """
  config, tokenizer = evaluator.load_workdir(workdir)
  params, _, _ = evaluator.load_params(workdir, step)
  return trainer.DevLoss(config, tokenizer).evaluate_params(params)


def loop_speed(workdir: str, last_step: int) -> dict[str, float]:
  """Steps/s and tokens/s of the training loop, from metrics.jsonl.

  The median over the logged windows after the first (the first holds the
  compilation); the first one if it is the only one.
  """
  windows = [r for r in metrics_lib.read_metrics(workdir)
             if "steps_per_sec" in r and r.get("step", 0) <= last_step]
  if not windows:
    return {}
  steady = windows[1:] or windows
  return {"steps_per_sec": statistics.median(r["steps_per_sec"]
                                             for r in steady),
          "tokens_per_sec": statistics.median(r["tokens_per_sec"]
                                              for r in steady)}


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime(
      "%Y-%m-%d %H:%M UTC")


def machine() -> str:
  """The host and its devices (common.machine_line without the load)."""
  devices = jax.local_devices()
  return (f"{common.cpu_model()}, {os.cpu_count()} cores, jax "
          f"{jax.__version__}, {len(devices)} {devices[0].platform} "
          "device(s)")


def run_row(row: str, workdir_root: str, config_args: Sequence[str] = (),
            overrides: dict[str, Any] | None = None,
            force: bool = False) -> dict[str, Any]:
  """Trains (or resumes) and measures one row; writes its table3.json.

  Steps: skip a row measured with the same config (unless `force`); train
  (a diverged row is a result too); dev perplexity; dev BLEU.
  """
  config = row_config(row, config_args, overrides)
  workdir = os.path.join(workdir_root, row)
  previous = load_result(workdir)
  if (not force and previous and previous.get("status") in FINAL
      and same_config(previous.get("config"), _config_dict(config))):
    print(f"[{row}] already {previous['status']} "
          f"({os.path.join(workdir, RESULT_FILE)}); skipped (--force runs it "
          "again).", flush=True)
    return previous
  train_command, eval_command = commands(row, workdir, config, config_args,
                                         overrides)
  definition = table3_config.ROWS[row]
  result: dict[str, Any] = {
      "row": row, "paper": definition.paper,
      "description": definition.description,
      "config_args": list(config_args), "overrides": dict(overrides or {}),
      "config": _config_dict(config), "params": count_params(config),
      "train_command": train_command, "eval_command": eval_command,
  }
  if not _train(row, config, workdir, result, previous):
    return result
  _measure_dev_loss(config, workdir, result)
  _measure_dev_bleu(row, config, workdir, result)
  print(f"[{row}] dev perplexity {result['dev_perplexity']:.2f}, dev BLEU "
        f"{result['dev_bleu']:.2f}, {result['params']:,} parameters, "
        f"training {result['train']['seconds'] / 60:.1f} min", flush=True)
  return result


def _train(row: str, config: ml_collections.ConfigDict, workdir: str,
           result: dict[str, Any], previous: dict[str, Any] | None) -> bool:
  """Trains (or resumes; a finished workdir only loads) into `result`.

  Returns:
    False if the loss diverged (`result` then says so, and is written).
  """
  start_step = checkpoints.latest_step(workdir) or 0
  same_training = (previous and same_config(previous.get("config"),
                                            result["config"])
                   and previous.get("train", {}).get("step") == start_step)
  if start_step >= config.num_train_steps and same_training:
    result["train"] = previous["train"]  # trained by an earlier call
  else:
    print(f"[{row}] training {workdir} from step {start_step} to "
          f"{config.num_train_steps}: {result['description']}", flush=True)
    begin = time.perf_counter()
    try:
      trained = trainer.train_and_evaluate(config, workdir)
    except FloatingPointError as e:  # a diverged row is a result too
      result.update(status="failed", error=str(e),
                    train={"seconds": time.perf_counter() - begin,
                           "start_step": start_step},
                    measured=_now(), machine=machine(),
                    load_average=common.load_average())
      _write_result(workdir, result)
      print(f"[{row}] FAILED: {e}", flush=True)
      return False
    seconds = time.perf_counter() - begin
    step = int(trained["step"])
    if step < config.num_train_steps:
      raise RuntimeError(
          f"[{row}] training stopped at step {step} < num_train_steps="
          f"{config.num_train_steps} (preempted?); run again to resume.")
    result["train"] = {"seconds": seconds, "start_step": start_step,
                       "step": step}
  result["train"].update(loop_speed(workdir, result["train"]["step"]))
  result["status"] = "trained"
  _write_result(workdir, result)
  return True


def _measure_dev_loss(config: ml_collections.ConfigDict, workdir: str,
                      result: dict[str, Any]) -> None:
  """Dev perplexity: the trainer's evaluation at the last step (recomputed
  from the checkpoint if metrics.jsonl lacks it)."""
  step = result["train"]["step"]
  dev = logged_dev_loss(workdir, step)
  result["dev_loss_source"] = "metrics.jsonl"
  if dev is None:
    dev = computed_dev_loss(workdir, step)
    result["dev_loss_source"] = "recomputed from the checkpoint"
  result.update(step=step, dev_split=config.eval_split,
                dev_loss=dev["eval_loss"], dev_nll=dev["eval_nll"],
                dev_perplexity=math.exp(dev["eval_nll"]),
                dev_accuracy=dev.get("eval_accuracy"))


def _measure_dev_bleu(row: str, config: ml_collections.ConfigDict,
                      workdir: str, result: dict[str, Any]) -> None:
  """Dev BLEU: the last checkpoint, beam 4, α 0.6, no averaging; writes the
  finished `result`."""
  print(f"[{row}] decoding {config.eval_split} with beam {BEAM_SIZE}, "
        f"alpha {ALPHA}", flush=True)
  scores = evaluator.evaluate(workdir, split=config.eval_split,
                              checkpoint_step=result["step"],
                              beam_size=BEAM_SIZE, alpha=ALPHA)
  result.update(
      dev_bleu=scores["bleu"], dev_chrf=scores["chrf"],
      sacrebleu_signature=scores["sacrebleu_signature"],
      dev_sentences=scores["num_sentences"], beam_size=scores["beam_size"],
      alpha=scores["alpha"], decode_seconds=scores["decode_seconds"],
      eval_output_dir=scores.get("output_dir"),
      measured=_now(), machine=machine(),
      load_average=common.load_average(), status="done")
  _write_result(workdir, result)


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
      "h": str(h),
      "d_k": str(c["d_k"] if c["d_k"] is not None else c["d_model"] // h),
      "d_v": str(c["d_v"] if c["d_v"] is not None else c["d_model"] // h),
      "P_drop": f"{c['dropout_rate']:g}",
      "ε_ls": f"{c['label_smoothing']:g}",
      "positions": c["position_encoding"],
      "attention": _attention_text(c),
  }


COLUMNS = ("row", "paper", "h", "d_k", "d_v", "P_drop", "ε_ls", "positions",
           "attention", "params", "dev PPL", "dev BLEU", "train min",
           "steps/s", "reproduce")
RIGHT = {"params", "dev PPL", "dev BLEU", "train min", "steps/s"}


def collect_results(workdir_root: str) -> dict[str, dict[str, Any]]:
  """Every finished (measured or diverged) row's table3.json under
  `workdir_root`."""
  found = {}
  for row in table3_config.ROW_NAMES:
    result = load_result(os.path.join(workdir_root, row))
    if result and result.get("status") in FINAL:
      found[row] = result
  return found


def build_table(results: dict[str, dict[str, Any]], workdir_root: str,
                config_args: Sequence[str] = (),
                overrides: dict[str, Any] | None = None) -> str:
  """The Markdown table (and its notes) of all rows; missing ones "not run".

  Rows without a result take their config columns, parameter count and
  commands from the current arguments; their measured columns say "not run".
  As in the paper, a row's h ... attention cells are blank where they equal
  the base row's.
  """
  current = _config_dict(row_config("base", config_args, overrides))
  lines = ["| " + " | ".join(COLUMNS) + " |",
           "|" + "|".join("--:" if c in RIGHT else "---" for c in COLUMNS)
           + "|"]
  for row in table3_config.ROW_NAMES:
    cells = _row_cells(row, results.get(row), current, workdir_root,
                       config_args, overrides)
    lines.append("| " + " | ".join(cells[c] for c in COLUMNS) + " |")
  return "\n".join(lines + _notes(results, current))


def _row_cells(row: str, result: dict[str, Any] | None,
               current: dict[str, Any], workdir_root: str,
               config_args: Sequence[str],
               overrides: dict[str, Any] | None) -> dict[str, str]:
  """One row's cells, from its result or (not run) the current arguments."""
  if result is None:
    config = row_config(row, config_args, overrides)
    resolved = _config_dict(config)
    params = count_params(config)
    train, evaluate = commands(row, os.path.join(workdir_root, row), config,
                               config_args, overrides)
  else:
    resolved = result["config"]
    params = result["params"]
    train, evaluate = result["train_command"], result["eval_command"]
  cols = describe(resolved)
  if row != "base":
    base_cols = describe(current)
    cols = {k: (v if v != base_cols[k] else "") for k, v in cols.items()}
  name = row
  if result is not None and (resolved["num_train_steps"]
                             != current["num_train_steps"]):
    name += f" ({resolved['num_train_steps']} steps)"
  cells = {"row": name, "paper": table3_config.ROWS[row].paper, **cols,
           "params": f"{params:,}",
           "reproduce": f"`{train}` then `{evaluate}`"}
  if result is None:
    cells.update({"dev PPL": NOT_RUN, "dev BLEU": NOT_RUN,
                  "train min": NOT_RUN, "steps/s": NOT_RUN})
  elif result["status"] == "failed":
    step = re.search(r"at step (\d+)", result.get("error", ""))
    failed = "diverged" + (f" (step {step.group(1)})" if step else "")
    cells.update({"dev PPL": failed, "dev BLEU": "—",
                  "train min": f"{result['train']['seconds'] / 60:.1f}",
                  "steps/s": "—"})
  else:
    train_info = result["train"]
    minutes = f"{train_info['seconds'] / 60:.1f}"
    if train_info.get("start_step"):
      minutes += f" (from step {train_info['start_step']})"
    speed = train_info.get("steps_per_sec")
    cells.update({"dev PPL": f"{result['dev_perplexity']:.2f}",
                  "dev BLEU": f"{result['dev_bleu']:.2f}",
                  "train min": minutes,
                  "steps/s": f"{speed:.2f}" if speed is not None else "—"})
  return cells


def _notes(results: dict[str, dict[str, Any]], c: dict[str, Any]
           ) -> list[str]:
  """The lines under the table: the budget, when and where, the signature."""
  peak = optim.peak_learning_rate(c["d_model"], c["warmup_steps"],
                                 c["learning_rate_scale"])
  peak_text = f"{peak:.1e}".replace("e-0", "e-")
  notes = [
      "",
      f"Budget per row: {c['num_train_steps']:,} steps of "
      f"`max_tokens` {c['max_tokens']:,} per side, warmup "
      f"{c['warmup_steps']:,}, peak learning rate {peak_text}; dev = "
      f"`{c['eval_split']}`, last checkpoint, beam {BEAM_SIZE}, α {ALPHA}. "
      f"{len(results)} of {len(table3_config.ROW_NAMES)} rows measured.",
  ]
  done = {k: r for k, r in results.items() if r["status"] == "done"}
  measured = sorted({(r["measured"], r["machine"]) for r in results.values()})
  if measured:
    machines = sorted({m for _, m in measured})
    loads = [r["load_average"] for r in results.values()]
    notes.append(
        f"Measured {measured[0][0]} to {measured[-1][0]} on "
        + "; ".join(machines) + f" (1-minute load average {min(loads):.1f} "
        f"to {max(loads):.1f} at the end of each row).")
    signatures = sorted({r["sacrebleu_signature"] for r in done.values()})
    if signatures:
      notes.append("BLEU signature "
                   + ", ".join(f"`{s}`" for s in signatures) + ".")
  return notes


def replace_section(text: str, table: str, path: str = "README") -> str:
  """`text` with the part between the table3 markers replaced by `table`."""
  start = text.find(START_MARKER)
  end = text.find(END_MARKER)
  if start < 0 or end < 0 or end < start:
    raise Table3Error(f"{path} has no {START_MARKER} ... {END_MARKER} "
                      "section to rewrite.")
  if text.count(START_MARKER) != 1 or text.count(END_MARKER) != 1:
    raise Table3Error(f"{path} has more than one table3 marker pair.")
  head = text[:start + len(START_MARKER)]
  return head + "\n" + table + "\n" + text[end:]


def write_readme(path: str, table: str) -> None:
  with open(path, encoding="utf-8") as f:
    text = f.read()
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir_root", default=None,
                      help="One workdir per row: <workdir_root>/<row>.")
  parser.add_argument("--rows", default="all",
                      help="Comma-separated rows to run (default: all): "
                      + ",".join(table3_config.ROW_NAMES))
  parser.add_argument("--config_args", default="",
                      help="configs/table3.py arguments added to every row, "
                      "e.g. 'tiny'.")
  parser.add_argument("--set", action="append", default=[],
                      metavar="NAME=VALUE",
                      help="Override a config field of every row (repeat), "
                      "e.g. --set=vocab_size=600.")
  parser.add_argument("--data_dir", default=None,
                      help="Shorthand for --set=data_dir=...")
  parser.add_argument("--train_split", default=None,
                      help="Shorthand for --set=train_split=...")
  parser.add_argument("--eval_split", default=None,
                      help="Shorthand for --set=eval_split=... (the dev "
                      "split measured)")
  parser.add_argument("--readme", default=DEFAULT_README,
                      help="Markdown file whose table3 section is rewritten "
                      "('' = none).")
  parser.add_argument("--table_only", action="store_true",
                      help="Run nothing; rebuild the table from the results.")
  parser.add_argument("--force", action="store_true",
                      help="Re-measure rows that already have a result.")
  parser.add_argument("--list", action="store_true",
                      help="Print the rows and exit.")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> str:
  """Runs the requested rows; returns (and prints) the table."""
  args = parse_args(argv)
  if args.list:
    print(list_rows())
    return ""
  if not args.workdir_root:
    raise Table3Error("--workdir_root is required (one workdir per row "
                      "below it).")
  rows = [] if args.table_only else parse_rows(args.rows)
  config_args = parse_config_args(args.config_args)
  overrides = parse_overrides(args.set)
  for name in ("data_dir", "train_split", "eval_split"):
    if getattr(args, name) is not None:
      overrides[name] = getattr(args, name)
  for row in parse_rows(args.rows):  # every config must build before training
    row_config(row, config_args, overrides)
  if args.readme:
    with open(args.readme, encoding="utf-8") as f:
      replace_section(f.read(), "", args.readme)  # fail now, not at the end

  for row in rows:
    run_row(row, args.workdir_root, config_args, overrides, force=args.force)
  table = build_table(collect_results(args.workdir_root), args.workdir_root,
                      config_args, overrides)
  print(table, flush=True)
  if args.readme:
    write_readme(args.readme, table)
    print(f"Wrote the table into {args.readme}.", flush=True)
  return table


if __name__ == "__main__":
  absl_logging.set_verbosity(absl_logging.INFO)
  try:
    main()
  except (Table3Error, UserError) as e:
    sys.exit(f"scripts/table3.py: {e}")
