"""bench/accelerator.py: `--small` runs every part, and its table's figures
agree with each other (nothing about time is asserted)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from bench import accelerator
from conftest import xla_flags
from configs import base as base_configs
from configs import multi30k
from mha.model import flops
from mha.model.transformer import TransformerConfig

REPO = pathlib.Path(__file__).resolve().parents[1]
ROWS = ["matmul peak", "quickstart train.py", "quickstart eval.py",
        "train step reference", "train step base", "decode greedy",
        "decode beam 4"]
SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def table_rows(output: str) -> list[dict[str, str]]:
  """The rows of the last table printed, as {header: cell}."""
  lines = output.splitlines()
  start = max(i for i, line in enumerate(lines)
              if line.startswith("| ") and line.split("|")[1].strip()
              == "part")
  headers = [c.strip() for c in lines[start].strip("|").split("|")]
  rows = []
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    rows.append(dict(zip(headers, (c.strip() for c in
                                   line.strip("|").split("|")))))
  return rows


def amount(cell: str) -> tuple[float, str]:
  """'17.18 GFLOP/s' -> (1.718e10, 'FLOP/s'); '128 sentences' -> (128, ...)."""
  value, unit = cell.split(" ", 1)
  prefix = re.match(r"([kMGT]?)(?=FLOP)", unit)
  if prefix:
    return float(value) * SI[prefix.group(1)], unit[len(prefix.group(1)):]
  return float(value), unit


def close(a: float, b: float, rel: float, abs_: float = 0.0) -> bool:
  return abs(a - b) <= rel * abs(b) + abs_


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> tuple[str, list[dict[str, str]]]:
  workdir = tmp_path_factory.mktemp("accelerator")
  # On 2 CPU devices, not the suite's 4: still several (the train steps'
  # batches sharded, their FLOPs counted over all devices), and on 2 cores
  # each compile and step of the run costs less: 72 s of CPU against 79 s,
  # 3.1 min of wall time against 4.5 at load average 6 to 8.
  done = subprocess.run(
      [sys.executable, str(REPO / "bench" / "accelerator.py"), "--small",
       f"--workdir={workdir}"], cwd=workdir, capture_output=True, text=True,
      env=dict(os.environ, XLA_FLAGS=xla_flags(2)),
      timeout=1800)  # 17 min at load average 14 on 2 shared cores
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  return done.stdout, table_rows(done.stdout)


@pytest.mark.slow
def test_small_run_prints_every_part_once(small_run):
  output, rows = small_run
  assert "\n== 2 cpu device(s), cpu; total " in output  # small_run's
  assert [r["part"] for r in rows] == ROWS
  work = {r["part"]: amount(r["work"]) for r in rows}
  assert work["quickstart train.py"] == (100, "steps")  # SMALL's steps
  # eval.py and the decode bench translate the same 128 test sentences.
  for part in ("quickstart eval.py", "decode greedy", "decode beam 4"):
    assert work[part] == (128, "sentences"), part


@pytest.mark.slow
def test_small_run_rates_and_mfu_follow_from_the_printed_figures(small_run):
  _, rows = small_run
  peak = rows[0]
  peak_flops, unit = amount(peak["achieved"])
  assert unit == "FLOP/s"
  assert amount(peak["work"]) == (pytest.approx(2 * 2048 ** 3, rel=1e-3),
                                  "FLOP")
  for row in rows:
    work, unit = amount(row["work"])
    rate, rate_unit = amount(row["rate"])
    assert rate_unit == unit + "/s", row
    # 4 significant digits each: rate = work / seconds within rounding.
    assert close(rate, work / float(row["seconds"]), 2e-3), row
  assert close(amount(peak["rate"])[0], peak_flops, 1e-2)
  for row in rows[3:5]:
    achieved, _ = amount(row["achieved"])
    mfu = float(row["MFU"].rstrip("%")) / 100
    assert close(mfu, achieved / peak_flops, 1e-2, 1e-3), row
    assert float(row["compile s"]) > 0, row


@pytest.mark.slow
def test_small_run_counts_the_model_flops_of_its_batches(small_run):
  # The train steps' achieved FLOP/s times their seconds a step are the
  # model FLOPs of bench/train_step.py's synthetic batches of the tiny
  # models: reference 64 rows x 64+64, base 64 x 32+32.
  _, rows = small_run
  shapes = {"train step reference": (multi30k, (64, 64, 64)),
            "train step base": (base_configs, (64, 32, 32))}
  for row in rows[3:5]:
    config_module, shape = shapes[row["part"]]
    model = TransformerConfig.from_config(config_module.get_config("tiny"))
    expected = flops.training_flops(model, *shape)
    achieved, _ = amount(row["achieved"])
    assert close(achieved * float(row["seconds"]), expected, 1e-2), row


@pytest.mark.slow
def test_small_run_decodes_as_eval_py_does(small_run):
  # The decode bench's beam search (in the bench's process) translates the
  # quickstart's model as eval.py (its own process) did: the same BLEU.
  _, rows = small_run
  bleu = {r["part"]: float(r["BLEU"]) for r in rows if r["BLEU"]}
  assert set(bleu) == {"quickstart eval.py", "decode greedy",
                       "decode beam 4"}
  assert bleu["decode beam 4"] == bleu["quickstart eval.py"]
  assert bleu["quickstart eval.py"] > 1.0  # 100 steps learn something


@pytest.mark.parametrize("flags, named", [
    (["--parts=train_step,sing"], "--parts"),
    (["--parts=decode"], "--decode_workdir"),
    (["--peak_size=0"], "--peak_size"),
])
def test_a_bad_flag_is_one_error_naming_it(flags, named, capsys):
  with pytest.raises(SystemExit) as exit_info:
    accelerator.parse_flags(flags)
  assert exit_info.value.code == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert named in error, error


def test_a_workdir_with_a_quickstart_run_is_refused(tmp_path, capsys):
  # train.py would resume the run there: no training would be timed.
  accelerator.parse_flags([f"--workdir={tmp_path}"])
  (tmp_path / "quickstart").mkdir()
  with pytest.raises(SystemExit):
    accelerator.parse_flags([f"--workdir={tmp_path}"])
  assert f"--workdir={tmp_path}" in capsys.readouterr().err
  accelerator.parse_flags([f"--workdir={tmp_path}", "--parts=train_step"])


def test_parts_given_are_the_parts_run():
  args = accelerator.parse_flags(["--parts=train_step", "--small"])
  assert args.parts == ["train_step"] and args.small
  args = accelerator.parse_flags(["--parts=decode",
                                  "--decode_workdir=/tmp/m30k"])
  assert args.parts == ["decode"]


def test_table_figures_by_hand(capsys):
  peak = accelerator.train_step.Peak(2048)
  peak.best = 2 * 2048 ** 3 / 0.5  # one product in 0.5 s
  accelerator.print_table([
      accelerator.peak_row(peak),
      accelerator.Row("train step base", "b", 4096, "tokens", 0.25,
                      achieved=peak.best / 4, compile_seconds=3.0),
      accelerator.Row("decode beam 4", "d", 128, "sentences", 0.7118,
                      compile_seconds=51.234, bleu=29.8149)], peak.best)
  rows = table_rows(capsys.readouterr().out)
  assert [[r[h] for h in ("part", "work", "seconds", "rate", "achieved",
                          "MFU", "compile s", "BLEU")] for r in rows] == [
      ["matmul peak", "17.18 GFLOP", "0.5000", "34.36 GFLOP/s",
       "34.36 GFLOP/s", "", "", ""],
      ["train step base", "4096 tokens", "0.2500", "16384 tokens/s",
       "8.59 GFLOP/s", "25.0%", "3", ""],
      ["decode beam 4", "128 sentences", "0.7118", "179.8 sentences/s", "",
       "", "51.23", "29.81"]]
