"""bench/jax_versions.py: `--small` with this interpreter given twice runs
every part in each, and its table holds the runs' figures (nothing about
time is asserted); its flags and interpreters are checked."""
import os
import pathlib
import platform
import stat
import subprocess
import sys

import flax
import jax
import jaxlib
import numpy as np
import pytest

from bench import accelerator
from bench import jax_versions
from bench import train_step
from configs import multi30k
from mha.model import flops
from mha.model.transformer import TransformerConfig

REPO = pathlib.Path(__file__).resolve().parents[1]
SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def table_rows(output: str) -> list[dict[str, str]]:
  """The rows of the last table printed, as {header: cell}."""
  lines = output.splitlines()
  start = max(i for i, line in enumerate(lines)
              if line.startswith("| ") and "interpreter" in line)
  headers = [c.strip() for c in lines[start].strip("|").split("|")]
  return [dict(zip(headers, (c.strip() for c in line.strip("|").split("|"))))
          for line in lines[start + 2:] if line.startswith("|")]


def number(cell: str) -> float:
  """'12.5%' -> 0.125, '1.20 GFLOP/s' -> 1.2e9, '0.3040' -> 0.304."""
  if cell.endswith("%"):
    return float(cell[:-1]) / 100
  value, _, unit = cell.partition(" ")
  return float(value) * SI.get(unit[:1], 1.0)


def close(a: float, b: float, rel: float) -> bool:
  return abs(a - b) <= rel * abs(b)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> tuple[list[dict[str, str]], str,
                                         list[str]]:
  """The table of a `--small` run of this interpreter (A) and of a wrapper
  of it (B) that logs its command lines; the wrapper and its log."""
  workdir = tmp_path_factory.mktemp("jax_versions")
  wrapper = _fake_python(
      workdir / "python",
      f'echo "$@" >> {workdir / "calls.log"}\nexec {sys.executable} "$@"\n')
  done = subprocess.run(
      [sys.executable, str(REPO / "bench" / "jax_versions.py"), "--small",
       f"--python={sys.executable}", f"--python={wrapper}", "--repeats=1",
       f"--workdir={workdir / 'runs'}"], cwd=workdir, capture_output=True,
      text=True, timeout=1800)  # 3.5 min at load average 7 to 10, 2 cores
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  calls = (workdir / "calls.log").read_text().splitlines()
  return table_rows(done.stdout), wrapper, calls


@pytest.mark.slow
def test_small_run_runs_each_part_in_each_interpreter(small_run):
  rows, wrapper, calls = small_run
  assert [r["interpreter"] for r in rows] == [
      f"A: {sys.executable}", f"B: {wrapper}", "B/A"]
  for row in rows[:2]:
    assert (row["Python"], row["jax"], row["jaxlib"], row["flax"]) == (
        platform.python_version(), jax.__version__, jaxlib.__version__,
        flax.__version__)
    assert row["runs"] == "1 + 1"
  # B's processes, once each: the probe, train.py, eval.py, the train step.
  assert [c.split()[0] for c in calls] == [
      "-c", "train.py", "eval.py", str(REPO / "bench" / "jax_versions.py")]
  assert "--child" in calls[3].split()


@pytest.mark.slow
def test_small_run_bleu_is_the_quickstarts_deterministic_score(small_run):
  # Two fresh processes of one interpreter train and translate alike.
  a, b, ratio = small_run[0]
  assert a["BLEU"] == b["BLEU"] and number(ratio["BLEU"]) == 1.0
  assert number(a["BLEU"]) > 1.0  # 100 steps learn something
  for row in (a, b):
    assert number(row["train.py s"]) > 0 and number(row["eval.py s"]) > 0


@pytest.mark.slow
def test_small_run_mfu_and_tokens_follow_from_the_timed_batches(small_run):
  # The tiny reference model on train_step.py's synthetic 64 x 64+64
  # batches: s/step x MFU x peak = its model FLOPs; s/step x tokens/s = the
  # non-padding tokens of the two timed batches (the 2nd and 3rd).
  config = multi30k.get_config("tiny")
  model_flops = flops.training_flops(TransformerConfig.from_config(config),
                                     64, 64, 64)
  batches = train_step.synthetic_batches(config, 64, 64, 64, seed=0,
                                         fill=0.82)
  tokens = np.mean([(b["inputs"] > 0).sum() + (b["targets"] > 0).sum()
                    for b in batches[1:3]])
  for row in small_run[0][:2]:
    seconds = number(row["s/step"])
    assert row["s/step min-max"] == f"{row['s/step']}-{row['s/step']}"
    assert close(seconds * number(row["MFU"]) * number(row["peak FLOP/s"]),
                 model_flops, 1e-2), row
    assert close(seconds * number(row["tokens/s"]), tokens, 1e-3), row
  a, b, ratio = small_run[0]
  for key in ("s/step", "tokens/s", "MFU", "train.py s", "eval.py s"):
    assert close(number(ratio[key]), number(b[key]) / number(a[key]),
                 2e-3), key


def _interpreter(label, bleus, train_seconds, steps, peaks):
  quickstarts = [accelerator.Quickstart(t, 2 * t, 100, 5.0, {"bleu": bleu})
                 for bleu, t in zip(bleus, train_seconds)]
  runs = [{"seconds_per_step": s, "tokens_per_sec": 1000 / s, "mfu": 0.1 / s,
           "peak": p, "setting": "x"} for s, p in zip(steps, peaks)]
  return jax_versions.Interpreter(
      label, f"/py/{label}", {"Python": "3.1x", "jax": label, "jaxlib": label,
                              "flax": "0.12"}, quickstarts, runs)


def test_table_cells_by_hand():
  a = _interpreter("A", [30.0, 30.0], [40.0, 60.0], [0.5, 0.4, 0.3],
                   [1e11, 2e11, 1.5e11])
  b = _interpreter("B", [27.0, 27.0], [50.0, 50.0], [0.6, 0.2, 0.8],
                   [1e11, 1e11, 1e11])
  rows = [dict(zip(jax_versions.HEADERS, r))
          for r in jax_versions.table_cells([a, b])]
  keys = ["interpreter", "jax", "BLEU", "train.py s", "eval.py s", "s/step",
          "s/step min-max", "tokens/s", "MFU", "peak FLOP/s", "runs"]
  assert [[r[k] for k in keys] for r in rows] == [
      # medians: train 50, eval 100, s/step 0.4; tokens/s 1000 / 0.4; MFU
      # 0.1 / 0.4; the best peak.
      ["A: /py/A", "A", "30.00", "50", "100", "0.4000", "0.3000-0.5000",
       "2500", "25%", "200.00 GFLOP/s", "2 + 3"],
      ["B: /py/B", "B", "27.00", "50", "100", "0.6000", "0.2000-0.8000",
       "1667", "16.67%", "100.00 GFLOP/s", "2 + 3"],
      ["B/A", "", "0.900", "1.000", "1.000", "1.500", "", "0.667", "0.667",
       "0.500", ""]]


@pytest.mark.parametrize("flags, named", [
    (["--python=/usr/bin/python3"], "--python=/usr/bin/python3"),
    (["--repeats=0"], "--repeats=0"),
    (["--quickstart_repeats=0"], "--quickstart_repeats=0"),
    (["--data_dir=/no/such/multi30k"], "--data_dir=/no/such/multi30k"),
])
def test_a_bad_flag_is_one_error_naming_it(flags, named, capsys):
  with pytest.raises(SystemExit) as exit_info:
    jax_versions.parse_flags(flags)
  assert exit_info.value.code == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert named in error, error


def test_a_used_workdir_is_refused(tmp_path, capsys):
  jax_versions.parse_flags([f"--workdir={tmp_path}"])
  (tmp_path / "A_quickstart_0").mkdir()
  with pytest.raises(SystemExit):
    jax_versions.parse_flags([f"--workdir={tmp_path}"])
  assert f"--workdir={tmp_path}" in capsys.readouterr().err


def _fake_python(path: pathlib.Path, script: str) -> str:
  path.write_text("#!/bin/sh\n" + script)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


@pytest.mark.parametrize("script, says", [
    ("echo \"ModuleNotFoundError: No module named 'jax'\" >&2; exit 1",
     "cannot import jax, jaxlib, flax and mha: ModuleNotFoundError: No "
     "module named 'jax'"),
    ("echo '{\"Python\": \"3.12.1\", \"mha\": \"/elsewhere/mha/__init__.py\"}'",
     f"imports mha from /elsewhere, not from this tree {REPO}"),
])
def test_an_unfit_interpreter_is_one_line_naming_it(tmp_path, script, says):
  python = _fake_python(tmp_path / "python", script)
  with pytest.raises(SystemExit) as exit_info:
    jax_versions.probe(python)
  assert str(exit_info.value) == (
      f"bench/jax_versions.py: --python={python}: {says}")
  with pytest.raises(SystemExit) as exit_info:
    jax_versions.probe(str(tmp_path / "missing"))
  assert f"--python={tmp_path / 'missing'}: no such interpreter" in str(
      exit_info.value)


def test_this_interpreter_probes_as_this_process():
  assert jax_versions.probe(sys.executable) == {
      "Python": platform.python_version(), "jax": jax.__version__,
      "jaxlib": jaxlib.__version__, "flax": flax.__version__}
  assert os.path.realpath(jax_versions.REPO) == os.path.realpath(REPO)
