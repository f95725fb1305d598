"""configs/table3.py (the Table 3 rows at small scale, at the Multi30k
budget) and scripts/table3.py (runs by row and seed, their JSON files, the
seed-spread rule, the rebuilt docs/table3.md)."""
import gzip
import json
import math
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import paper_reference as ref
from configs import multi30k
from configs import table3
from mha import data
from mha.store import trained
from mha.model.transformer import Transformer
from mha.model.transformer import TransformerConfig
from scripts import table3 as script

REPO = pathlib.Path(__file__).resolve().parents[1]

# What each row must change relative to the `base` row, written out here
# independently of configs/table3.py (N 3, d_model 256, d_ff 1024, 4 heads,
# d_k = d_v = 64).
EXPECTED_CHANGES = {
    "base": {},
    "A1": dict(num_heads=1, d_k=256, d_v=256),
    "A3": dict(num_heads=16, d_k=16, d_v=16),
    "A4": dict(num_heads=32, d_k=8, d_v=8),
    "B1": dict(d_k=16),
    "B2": dict(d_k=32),
    "N2": dict(num_layers=2),
    "N4": dict(num_layers=4),
    "dff512": dict(d_ff=512),
    "dff2048": dict(d_ff=2048),
    "dmodel128": dict(d_model=128, d_k=32, d_v=32),
    "dmodel512": dict(d_model=512, d_k=128, d_v=128),
    "D1": dict(dropout_rate=0.0),
    "D3": dict(label_smoothing=0.0),
    "E": dict(position_encoding="learned"),
    "dot": dict(attention_type="dot"),
    "additive": dict(attention_type="additive"),
    "location": dict(attention_type="location"),
    "multires": dict(attention_type="location",
                     location_filter_sizes=[1, 3, 5, 7]),
}
EXPECTED_PAPER = {"base": "base", "A1": "A", "A3": "A", "A4": "A", "B1": "B",
                  "B2": "B", "N2": "C", "N4": "C", "dff512": "C",
                  "dff2048": "C", "dmodel128": "C", "dmodel512": "C",
                  "D1": "D", "D3": "D", "E": "E", "dot": "§3.2.1",
                  "additive": "§3.2.1", "location": "location",
                  "multires": "location"}


def as_dict(config) -> dict:
  return json.loads(config.to_json())


def diff(a: dict, b: dict) -> dict:
  assert a.keys() == b.keys()
  return {k: b[k] for k in a if a[k] != b[k]}


# ------------------------------------------------------------------ configs


def test_row_names_order_and_metadata():
  assert list(table3.ROW_NAMES) == list(EXPECTED_CHANGES)
  for name, row in table3.ROWS.items():
    assert row.name == name
    assert row.paper == EXPECTED_PAPER[name]
    assert row.description and "\n" not in row.description
  listing = script.list_rows().splitlines()
  assert [line.split()[0] for line in listing] == list(table3.ROW_NAMES)


def test_base_row_is_the_whole_multi30k_recipe():
  # Only the in-training BLEU goes (decoded after training instead): the
  # steps, schedule, batch and checkpoints are configs/multi30k.py's.
  changed = diff(as_dict(multi30k.get_config()), as_dict(table3.get_config()))
  assert changed == dict(eval_bleu_sentences=0)
  assert as_dict(table3.get_config("base")) == as_dict(table3.get_config())
  c = table3.get_config()
  assert (c.num_train_steps, c.keep_checkpoints, c.checkpoint_every_steps,
          c.max_tokens * c.grad_accum_steps, c.pack_examples, c.seed) == (
              1200, 5, 100, 4096, True, 0)


@pytest.mark.parametrize("row", list(EXPECTED_CHANGES))
def test_row_changes_exactly_its_fields(row):
  base = as_dict(table3.get_config("base"))
  assert diff(base, as_dict(table3.get_config(row))) == EXPECTED_CHANGES[row]


def test_seed_argument_changes_only_the_seed():
  a1 = as_dict(table3.get_config("A1"))
  assert diff(a1, as_dict(table3.get_config("A1,seed=2"))) == {"seed": 2}
  assert as_dict(script.row_config("A1", 2)) == as_dict(
      table3.get_config("seed=2,A1"))
  with pytest.raises(ValueError, match="seed=-1 must be >= 0"):
    table3.get_config("A1,seed=-1")
  with pytest.raises(script.Table3Error, match="must not name a row or a "
                     "seed"):
    script.parse_config_args("tiny,seed=1")


def test_rows_a_keep_heads_times_key_size_at_d_model_also_when_tiny():
  for arg in ("A1", "A3", "A4", "A1,tiny", "tiny,A3"):
    c = table3.get_config(arg)
    assert c.num_heads * c.d_k == c.d_model == c.num_heads * c.d_v, arg
  assert table3.get_config("A4").d_k == 8
  tiny_a1 = table3.get_config("A1,tiny")
  assert (tiny_a1.d_model, tiny_a1.num_heads, tiny_a1.d_k) == (32, 1, 32)


def test_unknown_rows_and_seeds_are_named():
  with pytest.raises(ValueError, match=r"C1.*known: base, A1"):
    table3.get_config("C1")
  with pytest.raises(script.Table3Error, match=r"nope.*known rows: base"):
    script.parse_rows("base,nope")
  with pytest.raises(script.Table3Error, match="--seeds takes"):
    script.parse_seeds("0,x")
  with pytest.raises(script.Table3Error, match="no field 'nope'"):
    script.row_config("base", overrides={"nope": 1})
  assert script.parse_rows("E,base") == ["base", "E"]  # the table's order


def expected_params(c: dict) -> int:
  """The parameter count from the paper's shapes (no attention biases)."""
  h = c["num_heads"]
  return ref.param_count(
      c["num_layers"], c["d_model"], c["d_ff"], h,
      c["d_k"] or c["d_model"] // h, c["d_v"] or c["d_model"] // h,
      c["vocab_size"],
      learned_positions=(c["max_len"] if c["position_encoding"] == "learned"
                         else 0),
      attention_type=c["attention_type"],
      location_filter_sizes=c["location_filter_sizes"],
      location_num_filters=c["location_num_filters"])


def test_parameter_counts_from_eval_shape():
  counts = {row: script.count_params(table3.get_config(row))
            for row in table3.ROW_NAMES}
  assert counts["base"] == 7_568_384
  for row, count in counts.items():
    assert count == expected_params(as_dict(table3.get_config(row))), row
  assert {counts[r] for r in ("A1", "A3", "A4", "D1", "D3", "dot")} == {
      counts["base"]}
  for smaller, larger in (("N2", "N4"), ("dff512", "dff2048"),
                          ("dmodel128", "dmodel512"), ("B1", "B2")):
    assert counts[smaller] < counts["base"], smaller
    assert counts[larger] > counts["base"] or larger == "B2", larger
  assert counts["B2"] < counts["base"]


# ------------------------------------------------- seed rule and the plan


def result(row, seed, bleu=None, *, status="done", **fields):
  """A hand-written run record, as load_results returns it."""
  config = as_dict(script.row_config(row, seed))
  record = {
      "row": row, "seed": seed, "status": status, "steps": 1200,
      "num_train_steps": 1200, "params": 7_568_384, "config": config,
      "train": {"seconds": 600.0 + seed * 60, "timing_complete": True,
                "steps_per_sec": 1.5},
      "load": {"seconds": 600.0, "samples": 20, "load_average_mean": 2.5,
               "load_average_max": 3.0, "other_busy_cores": 0.25},
      "machine": {"cpu": "Test CPU", "cores": 2},
      "measured": {"finished": "2026-11-25 11:00 UTC"}, "code": "abc",
  }
  if status == "done":
    record.update(dev_perplexity=5.0 + seed, dev_bleu_last=bleu,
                  dev_bleu_avg5=bleu + 0.5, test_bleu_avg5=bleu + 1.0,
                  sacrebleu_signature="sig")
  record.update(fields)
  return record


def results_of(*records):
  return {(r["row"], r["seed"]): r for r in records}


def test_seed_spread_is_the_sample_deviation_of_the_three_base_seeds():
  base = [result("base", 0, 30.0), result("base", 1, 30.6)]
  assert script.seed_spread(results_of(*base)) is None  # 2 of 3 seeds
  three = results_of(*base, result("base", 2, 30.3))
  # Mean 30.3, deviations -0.3, 0.3, 0: variance 0.18 / 2 = 0.09.
  assert script.seed_spread(three) == pytest.approx(0.3)


def test_second_seed_for_rows_within_twice_the_spread():
  runs = results_of(
      result("base", 0, 30.0), result("base", 1, 30.6),
      result("base", 2, 30.3),  # mean 30.3, spread 0.3: 2s = 0.6
      result("A1", 0, 29.0),    # Δ -1.3: beyond 2s
      result("B1", 0, 29.8),    # Δ -0.5: within
      result("D1", 0, 30.89),   # Δ +0.59: within
      result("E", 0, 30.91),    # Δ +0.61: beyond
      result("dot", 0, status="failed", error="loss nan at step 9"))
  decision = script.needs_second_seed(runs)
  assert {r for r, need in decision.items() if need} == {"B1", "D1"}
  assert decision["A1"] is False and decision["E"] is False
  assert decision["dot"] is False  # diverged: no BLEU to compare
  assert decision["A3"] is None    # not measured yet
  # Until the base's three seeds are in, nothing is decided.
  early = {k: v for k, v in runs.items() if k != ("base", 2)}
  assert set(script.needs_second_seed(early).values()) == {None}


def test_plan_order_and_what_it_skips():
  plan = script.planned_runs({})
  assert plan[:6] == [("base", 0), ("A1", 0), ("B1", 0), ("D1", 0),
                      ("base", 1), ("base", 2)]
  rest = [r for r in table3.ROW_NAMES if r not in ("base", "A1", "B1", "D1")]
  assert plan[6:] == [(r, 0) for r in rest]  # no second seed decided yet
  runs = results_of(
      result("base", 0, 30.0), result("base", 1, 30.6),
      result("base", 2, 30.3), result("A1", 0, 29.0), result("B1", 0, 29.8),
      result("D1", 0, 30.2))
  plan = script.planned_runs(runs)
  assert plan[:len(rest)] == [(r, 0) for r in rest]
  assert plan[len(rest):] == [("B1", 1), ("D1", 1)]
  text = script.status(runs)
  assert "seed spread: 0.300" in text
  assert "second seed needed: B1, D1" in text
  assert f"planned next: {rest[0]}_seed0, " in text
  assert text.endswith("multires_seed0, B1_seed1, D1_seed1")
  runs[("B1", 1)] = result("B1", 1, 29.9)
  assert ("B1", 1) not in script.planned_runs(runs)
  assert script.planned_runs(runs, rows=["D1", "E"]) == [("E", 0), ("D1", 1)]


# ------------------------------------------------------ files and the table


def write_results(folder: pathlib.Path, *records) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  for r in records:
    (folder / f"{r['row']}_seed{r['seed']}.json").write_text(json.dumps(r))


def table_rows(section: str, first_column: str = "row"
               ) -> dict[str, dict[str, str]]:
  """The Markdown table whose header starts with `first_column`."""
  lines = section.splitlines()
  start = next(i for i, line in enumerate(lines)
               if line.startswith(f"| {first_column} |"))
  header = [c.strip() for c in lines[start].strip("|").split("|")]
  rows = {}
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
    assert len(cells) == len(header), line
    rows[cells[0]] = dict(zip(header, cells))
  return rows


def test_table_rebuilt_from_hand_written_files(tmp_path):
  results_dir = tmp_path / "table3"
  write_results(
      results_dir, result("base", 0, 30.0), result("base", 1, 30.6),
      result("base", 2, 30.3), result("A1", 0, 29.0, dev_perplexity=7.5),
      result("B1", 0, 29.8), result("B1", 1, 30.2),
      result("D1", 0, 31.0, dev_perplexity=5.5),
      result("dot", 0, status="failed", error="loss nan at step 9"))
  (results_dir / "notes.json").write_text("{}")  # not a run's file: ignored
  page = tmp_path / "table3.md"
  page.write_text("# Title\n\nintro\n\n<!-- table3:start -->\n"
                  "the old table\n"
                  "<!-- table3:end -->\n\n## Conclusions\ntext\n")
  table = script.main([f"--results_dir={results_dir}", f"--page={page}",
                       "--table_only"])
  text = page.read_text()
  assert text.startswith("# Title\n\nintro\n\n<!-- table3:start -->\n")
  assert text.endswith("<!-- table3:end -->\n\n## Conclusions\ntext\n")
  assert "the old table" not in text and table.strip() in text
  rows = table_rows(table)
  assert list(rows) == list(table3.ROW_NAMES)
  base, a1, b1 = rows["base"], rows["A1"], rows["B1"]
  assert (base["seeds"], base["dev BLEU"], base["dev BLEU avg 5"],
          base["test BLEU avg 5"], base["dev PPL"]) == (
              "3", "30.30", "30.80", "31.30", "6.00")
  assert base["Δ dev BLEU"] == "s = 0.30"
  assert base["train min"] == "11.0"  # (600 + 660 + 720) / 3 s
  assert a1["Δ dev BLEU"] == "-1.30 (> 2s)"
  assert (b1["seeds"], b1["dev BLEU"]) == ("2", "30.00")
  assert b1["Δ dev BLEU"] == "-0.30 (≤ 2s)"
  assert (a1["h"], a1["d_k"], base["h"], b1["h"], b1["d_k"]) == (
      "1", "256", "4", "", "16")
  assert rows["dot"]["dev PPL"] == "diverged (seed 0)"
  assert rows["dot"]["dev BLEU"] == "—"
  assert rows["E"]["dev BLEU"] == script.NOT_RUN
  assert rows["E"]["params"] == "7,699,456" and rows["E"]["seeds"] == ""
  assert "Seed spread s: the sample standard deviation" in table
  assert "Rows that need a second seed: B1 (measured)." in table
  assert f"5 of {len(table3.ROW_NAMES)} rows measured (8 runs)" in table
  # Against the base, figure by figure: the base's perplexities 5, 6, 7
  # (s = 1), its BLEU figures each spread as dev BLEU (s = 0.3; means
  # 30.3, 30.8, 31.3); bold beyond 2s.
  assert ("seeds 0, 1, 2: dev PPL 1.00, dev BLEU 0.30, dev BLEU avg 5 "
          "0.30, test BLEU avg 5 0.30)") in table
  compare = table_rows(table[table.index("Against the base"):])
  assert list(compare) == ["A1", "B1", "D1"]  # measured; dot diverged
  assert [compare["A1"][f"Δ {c}"] for c in script.MEASURED] == [
      "+1.50 (+1.5s)", "**-1.30 (-4.3s)**", "**-1.30 (-4.3s)**",
      "**-1.30 (-4.3s)**"]
  assert (compare["A1"]["beyond 2s"], compare["A1"]["against the base"]) == (
      "3 of 4", "worse on all")
  assert [compare["B1"][f"Δ {c}"] for c in script.MEASURED] == [
      "-0.50 (-0.5s)", "-0.30 (-1.0s)", "-0.30 (-1.0s)", "-0.30 (-1.0s)"]
  assert (compare["B1"]["seeds"], compare["B1"]["beyond 2s"],
          compare["B1"]["against the base"]) == (
              "2", "0 of 4", "worse on 3, better on 1")
  assert compare["D1"]["Δ dev BLEU"] == "**+0.70 (+2.3s)**"
  assert compare["D1"]["against the base"] == "better on all"
  runs = table_rows(table, "run")
  assert list(runs) == ["base_seed0", "base_seed1", "base_seed2",
                        "A1_seed0", "B1_seed0", "B1_seed1", "D1_seed0",
                        "dot_seed0"]
  assert runs["B1_seed1"]["dev BLEU"] == "30.20"
  assert runs["base_seed1"]["load avg (mean / max)"] == "2.5 / 3.0"


def test_a_file_that_disagrees_with_its_name_is_refused(tmp_path):
  record = result("A1", 0, 29.0)
  (tmp_path / "A3_seed0.json").write_text(json.dumps(record))
  with pytest.raises(script.Table3Error, match="A3_seed0.json holds row "
                     "'A1' seed 0"):
    script.load_results(str(tmp_path))
  (tmp_path / "A3_seed0.json").unlink()
  (tmp_path / "C9_seed0.json").write_text(json.dumps(record))
  with pytest.raises(script.Table3Error, match="no row 'C9'"):
    script.load_results(str(tmp_path))


PAGE = ("# Title\n\n<!-- table3:start -->\nthe measured rows\n"
        "<!-- table3:end -->\n")


def test_a_results_dir_that_is_not_a_folder_is_refused(tmp_path):
  # A mistyped --results_dir used to rebuild the page with every row
  # emptied (--table_only) or report "measured: none" (--status).
  page = tmp_path / "table3.md"
  page.write_text(PAGE)
  (tmp_path / "afile").write_text("x")
  missing, afile = tmp_path / "nope", tmp_path / "afile"
  for mode, folder, problem in (("--table_only", missing, "does not exist"),
                                ("--status", missing, "does not exist"),
                                ("--table_only", afile, "is not a folder"),
                                ("--rows=base", afile, "is not a folder")):
    with pytest.raises(script.Table3Error) as error:
      script.main([mode, f"--results_dir={folder}", f"--page={page}",
                   f"--workdir_root={tmp_path / 'runs'}"])
    assert str(error.value).startswith(f"--results_dir={folder} {problem}")
  assert page.read_text() == PAGE and afile.read_text() == "x"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "table3.md"]


def test_a_page_is_not_rebuilt_from_a_folder_without_its_runs(tmp_path):
  # A mistyped --results_dir in training mode used to be created, and the
  # page rebuilt from its one run.
  results_dir, other = tmp_path / "results", tmp_path / "other"
  write_results(results_dir, result("base", 0, 30.0), result("A1", 0, 29.0))
  write_results(other, result("base", 0, 30.0))
  page = tmp_path / "table3.md"
  page.write_text(PAGE)
  script.main(["--table_only", f"--results_dir={results_dir}",
               f"--page={page}"])
  built = page.read_text()
  assert "| base_seed0 |" in built and "| A1_seed0 |" in built
  typo = tmp_path / "resluts"
  for mode, folder, missing in (("--table_only", other, "1 run(s)"),
                                ("--rows=base", other, "1 run(s)"),
                                ("--rows=base", typo, "2 run(s)")):
    with pytest.raises(script.Table3Error) as error:
      script.main([mode, f"--results_dir={folder}", f"--page={page}",
                   f"--workdir_root={tmp_path / 'runs'}"])
    assert str(error.value).startswith(
        f"--page={page} lists {missing} that --results_dir={folder} does "
        "not hold (A1_seed0")
  assert page.read_text() == built
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "other", "results", "table3.md"]


def test_a_missing_page_is_named_before_anything_runs(tmp_path):
  results_dir = tmp_path / "results"
  results_dir.mkdir()
  page = tmp_path / "nope.md"
  for mode in ("--table_only", "--rows=base"):
    with pytest.raises(script.Table3Error) as error:
      script.main([mode, f"--results_dir={results_dir}", f"--page={page}",
                   f"--workdir_root={tmp_path / 'runs'}"])
    assert str(error.value) == f"--page={page} does not exist."
  assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


@pytest.mark.parametrize("field, value, message", [
    ("dev_bleu_last", None, '"dev_bleu_last" is null, not a number.'),
    ("dev_bleu_last", "29.0", '"dev_bleu_last" is "29.0", not a number.'),
    ("test_bleu_avg5", True, '"test_bleu_avg5" is true, not a number.'),
    ("dev_bleu_last", "delete", 'a done run without "dev_bleu_last".'),
    ("status", "delete", 'a run without "status".'),
    ("status", "ok", '"status" is "ok", not "done" or "failed".'),
    ("machine", "delete", 'a run without "machine".'),
    ("train.seconds", "delete", 'a run without "train"."seconds".'),
    ("train.seconds", "600", '"train"."seconds" is "600", not a number.'),
    ("measured", [], 'a run without "measured"."finished".'),
    ("params", 7.5, '"params" is 7.5, not an integer.'),
    ("config", "base", '"config" is "base", not an object.'),
], ids=["null", "string", "boolean", "missing", "no_status", "bad_status",
        "no_machine", "no_seconds", "string_seconds", "measured_list",
        "float_params", "string_config"])
def test_a_run_file_with_a_bad_figure_is_named(tmp_path, field, value,
                                               message):
  # Such files used to fail in the seed rule or the tables (KeyError,
  # TypeError).
  results_dir = tmp_path / "results"
  bad = result("base", 1, 30.6)
  *parents, key = field.split(".")
  holder = bad
  for parent in parents:
    holder = holder[parent]
  if value == "delete":
    del holder[key]
  else:
    holder[key] = value
  write_results(results_dir, result("base", 0, 30.0), bad,
                result("base", 2, 30.3), result("A1", 0, 29.0))
  with pytest.raises(script.Table3Error) as error:
    script.load_results(str(results_dir))
  assert str(error.value) == f"{results_dir / 'base_seed1.json'}: {message}"
  page = tmp_path / "table3.md"
  page.write_text(PAGE)
  for mode in ("--table_only", "--status"):
    with pytest.raises(script.Table3Error, match="base_seed1.json"):
      script.main([mode, f"--results_dir={results_dir}", f"--page={page}"])
  assert page.read_text() == PAGE


def test_the_script_fails_in_one_line_with_status_1(tmp_path):
  page = tmp_path / "table3.md"
  page.write_text(PAGE)
  done = subprocess.run(
      [sys.executable, str(REPO / "scripts" / "table3.py"), "--table_only",
       f"--results_dir={tmp_path / 'nope'}", f"--page={page}"],
      capture_output=True, text=True, cwd=tmp_path, check=False)
  assert done.returncode == 1
  lines = [l for l in done.stderr.splitlines()
           if not re.match(r"[IWE]\d{4} ", l)]  # absl's log lines
  assert lines == [f"table3.py: --results_dir={tmp_path / 'nope'} does not "
                   "exist (the folder of the runs' JSON files)."]
  assert page.read_text() == PAGE


def test_other_busy_cores_from_two_snapshots():
  # 100 ticks a second, 10 s: 1,500 busy ticks of which 600 are ours.
  assert script.other_busy_cores((1000.0, 200.0), (2500.0, 800.0), 10.0,
                                 100.0) == pytest.approx(0.9)
  assert script.other_busy_cores((0.0, 0.0), (100.0, 100.0), 1.0,
                                 100.0) == 0.0
  loads = [dict(seconds=100.0, samples=3, load_average_mean=2.0,
                load_average_max=2.5, other_busy_cores=0.5),
           dict(seconds=300.0, samples=9, load_average_mean=4.0,
                load_average_max=6.0, other_busy_cores=None)]
  combined = script.combine_loads(loads)
  assert combined == dict(seconds=400.0, samples=12, load_average_mean=3.5,
                          load_average_max=6.0, other_busy_cores=0.5)


def test_load_sampler_reads_this_machine():
  with script.LoadSampler(interval=0.01) as sampler:
    sum(i * i for i in range(200_000))  # some work of this process
  s = sampler.summary
  assert s["samples"] >= 2 and s["seconds"] > 0
  assert s["load_average_max"] >= s["load_average_mean"] >= 0
  # Over a span this short the clock ticks make the figure coarse: only
  # its presence and sign are checked (the formula is, above).
  assert math.isfinite(s["other_busy_cores"]) and s["other_busy_cores"] >= 0


def test_unknown_row_fails_before_anything_runs(tmp_path):
  with pytest.raises(script.Table3Error, match=r"nope.*known rows: base, A1"):
    script.main([f"--workdir_root={tmp_path / 'r'}", "--rows=base,nope",
                 "--page=", f"--results_dir={tmp_path / 'res'}"])
  page = tmp_path / "table3.md"
  page.write_text("# no markers\n")
  with pytest.raises(script.Table3Error, match="no <!-- table3:start -->"):
    script.main([f"--workdir_root={tmp_path / 'r'}", "--rows=base",
                 f"--page={page}", f"--results_dir={tmp_path / 'res'}"])
  assert not (tmp_path / "r").exists() and not (tmp_path / "res").exists()


def test_docs_page_has_one_table_section_and_every_row():
  text = (REPO / "docs" / "table3.md").read_text()
  assert text.count(script.START_MARKER) == text.count(script.END_MARKER) == 1
  start = text.index(script.START_MARKER)
  rows = table_rows(text[start:text.index(script.END_MARKER)])
  assert list(rows) == list(table3.ROW_NAMES)
  measured = script.load_results(str(REPO / "docs" / "table3"))
  for (row, seed), record in measured.items():
    assert record["num_train_steps"] == 1200, (row, seed)
    if record["status"] == "done":  # else diverged, at the step it names
      assert record["steps"] == 1200, (row, seed)
    else:
      assert record["status"] == "failed" and record["error"], (row, seed)
    # The run's config is the row's today (fields added since aside; the
    # data folder is the machine's).
    stored = dict(record["config"], data_dir=None)
    assert script.same_config(
        stored, dict(as_dict(script.row_config(row, seed)), data_dir=None)
    ), (row, seed)


# ------------------------------------------------------- one run, end to end


def slice_args(data_dir, root: pathlib.Path, rows="base"):
  """scripts/table3.py on a Multi30k slice with the tiny model cut to one
  layer, 5 steps and a checkpoint at each (the average of the last 5)."""
  return [
      f"--workdir_root={root / 'runs'}", f"--results_dir={root / 'results'}",
      f"--rows={rows}", "--config_args=tiny", "--page=",
      f"--data_dir={data_dir}", "--train_split=train[:1000]",
      "--eval_split=val[:40]", "--test_split=test_2016_flickr[:40]",
      "--set=vocab_size=600", "--set=max_source_length=40",
      "--set=max_target_length=40", "--set=max_tokens=1024",
      "--set=num_train_steps=5", "--set=checkpoint_every_steps=1",
      "--set=eval_every_steps=5", "--set=log_every_steps=1",
      "--set=max_decode_extra=8", "--set=num_layers=1",
  ]


def mean_nll_by_hand(workdir: pathlib.Path, data_dir: pathlib.Path,
                     count: int) -> float:
  """The dev split's per-token NLL, computed here: the first `count` raw
  lines of val.{de,en}.gz, targets ending with EOS, one batch padded with 0
  (masked on the source side; after each target, so causal attention keeps
  it out of the real positions), log-softmax in float64."""
  config, tokenizer = trained.load_workdir(str(workdir))
  params, _, _ = trained.load_params(str(workdir))
  model = Transformer(TransformerConfig.from_config(config,
                                                    deterministic=True))
  def ids(lang):
    with gzip.open(data_dir / f"val.{lang}.gz", "rt", encoding="utf-8") as f:
      rows = [tokenizer.encode(next(f).rstrip("\n")) + [data.EOS_ID]
              for _ in range(count)]
    out = np.zeros((count, max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
      out[i, :len(row)] = row
    return out
  src, tgt = ids("de"), ids("en")
  logits = np.asarray(model.apply({"params": params}, src, tgt), np.float64)
  top = logits.max(-1, keepdims=True)
  log_probs = logits - top - np.log(np.exp(logits - top).sum(-1,
                                                             keepdims=True))
  picked = np.take_along_axis(log_probs, tgt[..., None], -1)[..., 0]
  real = tgt > 0
  return -picked[real].sum() / real.sum()


@pytest.mark.slow
def test_one_run_end_to_end_its_json_and_resume(multi30k, tmp_path):
  args = slice_args(multi30k, tmp_path)
  # A run interrupted after step 3: its workdir resumes from there.
  workdir = tmp_path / "runs" / "base_seed0"
  from mha.train import trainer  # pylint: disable=import-outside-toplevel
  setup = script._setup(script.parse_args(args))  # pylint: disable=protected-access
  config = setup.config("base", 0)
  config.num_train_steps = 3
  trainer.train_and_evaluate(config, str(workdir))

  script.main(args)

  record = json.loads((tmp_path / "results" / "base_seed0.json").read_text())
  assert record["status"] == "done" and (record["row"], record["seed"]) == (
      "base", 0)
  assert record["steps"] == record["num_train_steps"] == 5
  assert record["train"]["sessions"] == 1
  assert not record["train"]["timing_complete"]  # steps 0-3 not timed here
  # Perplexity: exp of the mean NLL per SentencePiece token, by hand.
  assert record["dev_perplexity"] == pytest.approx(
      math.exp(mean_nll_by_hand(workdir, multi30k, 40)), rel=2e-4)
  assert record["dev_nll"] < record["dev_loss_smoothed"] + 1.0
  # BLEU: the evaluator's files, last checkpoint and the average of 1..5.
  scored = {p.parent.name: json.loads(p.read_text())
            for p in (workdir / "eval").glob("*/metrics.json")}
  assert scored["val_40_5"]["averaged_steps"] == [5]
  assert record["dev_bleu_last"] == scored["val_40_5"]["bleu"]
  assert scored["val_40_avg5_5"]["averaged_steps"] == [1, 2, 3, 4, 5]
  assert record["dev_bleu_avg5"] == scored["val_40_avg5_5"]["bleu"]
  assert record["test_bleu_avg5"] == scored[
      "test_2016_flickr_40_avg5_5"]["bleu"]
  assert scored["test_2016_flickr_40_avg5_5"]["num_sentences"] == 40
  params, _, _ = trained.load_params(str(workdir))
  assert record["params"] == sum(
      np.size(x) for x in jax.tree_util.tree_leaves(params))
  assert record["machine"]["cores"] > 0 and record["load"]["samples"] >= 2
  assert record["commands"][0].startswith(
      "python train.py --config=configs/table3.py:base,seed=0,tiny ")

  # Measured: not run again. Forced: measured again from the workdir,
  # without training or decoding (its progress file holds both).
  before = (workdir / "metrics.jsonl").read_text()
  path = tmp_path / "results" / "base_seed0.json"
  path.write_text(path.read_text().replace('"seed": 0', '"seed": 0, '
                                           '"marker": 1'))
  script.main(args)
  assert json.loads(path.read_text())["marker"] == 1
  progress = json.loads((workdir / script.PROGRESS_FILE).read_text())
  progress["evaluations"]["dev_last"]["bleu"] = 99.0
  (workdir / script.PROGRESS_FILE).write_text(json.dumps(progress))
  script.main(args + ["--force"])
  again = json.loads(path.read_text())
  assert "marker" not in again and again["dev_bleu_last"] == 99.0
  assert again["dev_bleu_avg5"] == record["dev_bleu_avg5"]
  assert (workdir / "metrics.jsonl").read_text() == before
  # Another config in the same workdir is refused, nothing written.
  with pytest.raises(script.Table3Error, match="of another config"):
    script.main(args + ["--force", "--set=d_ff=32"])
  assert json.loads(path.read_text()) == again
