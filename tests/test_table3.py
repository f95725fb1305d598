"""configs/table3.py (the Table 3 rows at small scale) and scripts/table3.py
(train each row, measure dev perplexity and BLEU, write the README table)."""
import json
import math
import pathlib
import re

import jax
import numpy as np
import pytest

import paper_reference as ref
from scripts import table3 as script
from configs import multi30k
from configs import table3
from mha import evaluator

REPO = pathlib.Path(__file__).resolve().parents[1]

# What each row must change relative to the `base` row, written out here
# independently of configs/table3.py (d_model 256, 4 heads, d_k = d_v = 64).
EXPECTED_CHANGES = {
    "base": {},
    "A1": dict(num_heads=1, d_k=256, d_v=256),
    "A3": dict(num_heads=16, d_k=16, d_v=16),
    "B1": dict(d_k=16),
    "B2": dict(d_k=32),
    "D1": dict(dropout_rate=0.0),
    "D3": dict(label_smoothing=0.0),
    "E": dict(position_encoding="learned"),
    "dot": dict(attention_type="dot"),
    "additive": dict(attention_type="additive"),
    "location": dict(attention_type="location"),
    "multires": dict(attention_type="location",
                     location_filter_sizes=[1, 3, 5, 7]),
}
EXPECTED_PAPER = {"base": "base", "A1": "A", "A3": "A", "B1": "B", "B2": "B",
                  "D1": "D", "D3": "D", "E": "E", "dot": "§3.2.1",
                  "additive": "§3.2.1", "location": "location",
                  "multires": "location"}


def as_dict(config) -> dict:
  return json.loads(config.to_json())


def diff(a: dict, b: dict) -> dict:
  assert a.keys() == b.keys()
  return {k: b[k] for k in a if a[k] != b[k]}


def test_row_names_order_and_metadata():
  assert list(table3.ROW_NAMES) == list(EXPECTED_CHANGES)
  for name, row in table3.ROWS.items():
    assert row.name == name
    assert row.paper == EXPECTED_PAPER[name]
    assert row.description and "\n" not in row.description
  listing = script.list_rows().splitlines()
  assert [line.split()[0] for line in listing] == list(table3.ROW_NAMES)


def test_base_row_is_multi30k_with_the_fixed_budget():
  changed = diff(as_dict(multi30k.get_config()), as_dict(table3.get_config()))
  assert changed == dict(
      pack_examples=False,  # length buckets, as the table was measured
      max_tokens=4096, grad_accum_steps=1,  # one micro-batch, as measured
      num_train_steps=200, warmup_steps=100, learning_rate_scale=0.35,
      checkpoint_every_steps=200, keep_checkpoints=1, eval_every_steps=200,
      eval_bleu_sentences=0)  # log_every_steps is multi30k's 50 already
  assert table3.get_config().log_every_steps == 50
  assert as_dict(table3.get_config("base")) == as_dict(table3.get_config())
  # The noam peak, scale · d^-0.5 · warmup^-0.5, equals multi30k's (~2.2e-3).
  def peak(c):
    return c.learning_rate_scale * c.d_model ** -0.5 * c.warmup_steps ** -0.5
  assert peak(table3.get_config()) == pytest.approx(
      peak(multi30k.get_config()))
  assert peak(table3.get_config()) == pytest.approx(2.1875e-3)
  c = table3.get_config()
  assert (c.d_model, c.num_heads, c.num_layers, c.d_ff, c.vocab_size,
          c.max_tokens, c.dropout_rate, c.label_smoothing, c.eval_split) == (
              256, 4, 3, 1024, 8000, 4096, 0.2, 0.1, "val")


@pytest.mark.parametrize("row", list(EXPECTED_CHANGES))
def test_row_changes_exactly_its_fields(row):
  base = as_dict(table3.get_config("base"))
  assert diff(base, as_dict(table3.get_config(row))) == EXPECTED_CHANGES[row]


def test_rows_a_keep_heads_times_key_size_at_d_model_also_when_tiny():
  for arg in ("A1", "A3", "A1,tiny", "tiny,A3"):
    c = table3.get_config(arg)
    assert c.num_heads * c.d_k == c.d_model == c.num_heads * c.d_v, arg
  tiny_a1 = table3.get_config("A1,tiny")
  assert (tiny_a1.d_model, tiny_a1.num_heads, tiny_a1.d_k) == (32, 1, 32)
  assert as_dict(tiny_a1) == as_dict(table3.get_config("tiny,A1"))
  # tiny keeps the row's change and shrinks the rest.
  assert table3.get_config("B1,tiny").d_k == 16
  assert table3.get_config("multires,tiny").location_filter_sizes == (
      1, 3, 5, 7)


def test_unknown_config_argument_lists_the_rows():
  with pytest.raises(ValueError, match=r"A4.*known: base, A1.*multires.*tiny"):
    table3.get_config("A4")
  with pytest.raises(script.Table3Error, match=r"C1.*known rows: base"):
    script.parse_rows("base,C1")
  with pytest.raises(script.Table3Error, match="must not name a row"):
    script.parse_config_args("tiny,A1")
  with pytest.raises(script.Table3Error, match="no field 'nope'"):
    script.row_config("base", overrides={"nope": 1})
  assert script.parse_rows("E,base") == ["base", "E"]  # the table's order
  assert script.parse_rows("all") == list(table3.ROW_NAMES)


def expected_params(c: dict) -> int:
  """The parameter count from the paper's shapes (no attention biases)."""
  h = c["num_heads"]
  return ref.param_count(
      c["num_layers"], c["d_model"], c["d_ff"], h, c["d_k"] or c["d_model"] // h,
      c["d_v"] or c["d_model"] // h, c["vocab_size"],
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
  same = ["A1", "A3", "D1", "D3", "dot"]
  assert {counts[r] for r in same} == {counts["base"]}
  assert counts["B1"] < counts["B2"] < counts["base"]
  for row in ("E", "additive", "location", "multires"):
    assert counts[row] > counts["base"], row
  assert counts["location"] != counts["multires"]


def readme_parts(text: str) -> tuple[str, str, str]:
  start = text.index(script.START_MARKER) + len(script.START_MARKER)
  end = text.index(script.END_MARKER)
  return text[:start], text[start:end], text[end:]


def table_rows(section: str) -> dict[str, dict[str, str]]:
  """The Markdown table of a table3 section: {row name: {column: cell}}."""
  lines = [line for line in section.splitlines() if line.startswith("|")]
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  assert tuple(header) == script.COLUMNS
  rows = {}
  for line in lines[2:]:
    cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
    assert len(cells) == len(header), line
    row = dict(zip(header, cells))
    rows[row["row"].split()[0]] = row
  return rows


def test_readme_has_the_table3_section_with_every_row():
  text = (REPO / "README.md").read_text()
  headings = re.findall(r"^## .+$", text, re.MULTILINE)
  assert "## Table 3 at small scale" in headings
  assert headings[headings.index("## Results") + 1] == (
      "## Table 3 at small scale")
  assert text.count(script.START_MARKER) == text.count(script.END_MARKER) == 1
  _, section, _ = readme_parts(text)
  rows = table_rows(section)
  assert list(rows) == list(table3.ROW_NAMES)
  for name, row in rows.items():
    assert f"--config=configs/table3.py:{name} " in row["reproduce"]
    assert "python eval.py --workdir=" in row["reproduce"]
    assert "--split=val`" in row["reproduce"]
    measured = [row[c] for c in ("dev PPL", "dev BLEU", "train min")]
    if measured[0] == script.NOT_RUN:
      assert measured == [script.NOT_RUN] * 3, name
    else:
      for cell in measured:
        assert math.isfinite(float(cell.split()[0])), name


def slice_args(data_dir, workdir_root, readme, rows):
  """scripts/table3.py on a Multi30k slice (as tests/test_configs.py's), with
  the tiny model cut to one layer and short outputs, to compile fast."""
  return [
      f"--workdir_root={workdir_root}", f"--rows={rows}", "--config_args=tiny",
      f"--readme={readme}", f"--data_dir={data_dir}",
      "--train_split=train[:1000]", "--eval_split=val[:40]",
      "--set=vocab_size=600", "--set=max_source_length=40",
      "--set=max_target_length=40", "--set=max_tokens=1024",
      "--set=num_train_steps=2", "--set=checkpoint_every_steps=2",
      "--set=eval_every_steps=2", "--set=log_every_steps=1",
      "--set=eval_bleu_sentences=0", "--set=max_decode_extra=8",
      "--set=num_layers=1",
  ]


def logged_eval(workdir: pathlib.Path, step: int) -> dict:
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  records = [json.loads(line) for line in lines if line.strip()]
  (record,) = [r for r in records if r["step"] == step and "eval_nll" in r]
  return record


@pytest.mark.slow
def test_script_runs_rows_in_stages_and_writes_the_readme(multi30k, tmp_path):
  readme = tmp_path / "README.md"
  original = (REPO / "README.md").read_text()
  readme.write_text(original)
  root = tmp_path / "table3"

  table = script.main(slice_args(multi30k, root, readme, "base"))

  assert [p.parent.name for p in root.glob("*/table3.json")] == ["base"]
  results = {}
  for row in ("base",):
    workdir = root / row
    result = json.loads((workdir / "table3.json").read_text())
    results[row] = result
    assert result["status"] == "done" and result["step"] == 2
    assert result["config"]["num_heads"] == 4
    # Perplexity: exp of the dev NLL the trainer logged at the last step.
    record = logged_eval(workdir, 2)
    assert result["dev_perplexity"] == pytest.approx(
        math.exp(record["eval_nll"]), rel=1e-12)
    # ... and the same NLL recomputed from the checkpoint.
    recomputed = script.computed_dev_loss(str(workdir))
    assert recomputed["eval_nll"] == pytest.approx(record["eval_nll"],
                                                   rel=1e-5)
    # BLEU: the evaluator's output for the last checkpoint, beam 4, α 0.6.
    (metrics_file,) = (workdir / "eval").glob("*/metrics.json")
    scored = json.loads(metrics_file.read_text())
    assert (scored["beam_size"], scored["alpha"], scored["averaged_steps"],
            scored["num_sentences"]) == (4, 0.6, [2], 40)
    assert result["dev_bleu"] == scored["bleu"]
    # Parameters: the trained checkpoint's.
    params, _, _ = evaluator.load_params(str(workdir))
    assert result["params"] == sum(
        np.size(x) for x in jax.tree_util.tree_leaves(params))
    assert result["train"]["seconds"] > 0
    assert result["train"]["steps_per_sec"] > 0

  text = readme.read_text()
  head, section, tail = readme_parts(text)
  old_head, _, old_tail = readme_parts(original)
  assert (head, tail) == (old_head, old_tail)  # nothing else rewritten
  assert section.strip() == table.strip()
  rows = table_rows(section)
  assert list(rows) == list(table3.ROW_NAMES)
  for name, row in rows.items():
    assert f"--config=configs/table3.py:{name},tiny " in row["reproduce"]
    if name in results:
      assert row["dev PPL"] == f"{results[name]['dev_perplexity']:.2f}"
      assert row["dev BLEU"] == f"{results[name]['dev_bleu']:.2f}"
      assert row["params"] == f"{results[name]['params']:,}"
      assert all(math.isfinite(float(row[c].split()[0]))
                 for c in ("dev PPL", "dev BLEU", "train min", "steps/s"))
    else:
      assert [row[c] for c in ("dev PPL", "dev BLEU", "train min",
                               "steps/s")] == [script.NOT_RUN] * 4
  assert rows["A1"]["h"] == "1" and rows["A1"]["d_k"] == "32"
  assert rows["base"]["h"] == "4" and rows["B1"]["h"] == ""
  assert "1 of 12 rows measured" in section

  # Second stage: `base` is not run again, `multires` is added, A1 stays
  # "not run".
  base_json = (root / "base" / "table3.json").read_text()
  base_metrics = (root / "base" / "metrics.jsonl").read_text()
  script.main(slice_args(multi30k, root, readme, "base,multires"))
  assert (root / "base" / "table3.json").read_text() == base_json
  assert (root / "base" / "metrics.jsonl").read_text() == base_metrics
  head2, section2, tail2 = readme_parts(readme.read_text())
  assert (head2, tail2) == (old_head, old_tail)
  rows2 = table_rows(section2)
  for name in ("base", "A1"):
    assert rows2[name] == rows[name]
  multires = json.loads((root / "multires" / "table3.json").read_text())
  assert multires["config"]["attention_type"] == "location"
  assert multires["config"]["location_filter_sizes"] == [1, 3, 5, 7]
  assert rows2["multires"]["dev PPL"] == f"{multires['dev_perplexity']:.2f}"
  nll = logged_eval(root / "multires", 2)["eval_nll"]
  assert rows2["multires"]["dev PPL"] == f"{math.exp(nll):.2f}"
  assert rows2["multires"]["attention"] == "location (1,3,5,7)"
  assert "2 of 12 rows measured" in section2

  # --table_only runs nothing and rebuilds the same table from table3.json.
  only = script.main(slice_args(multi30k, root, "", "base") + ["--table_only"])
  assert only.strip() == section2.strip()
  assert (root / "base" / "table3.json").read_text() == base_json
  assert sorted(p.name for p in root.iterdir()) == ["base", "multires"]


def test_a_measured_row_stands_until_one_of_its_fields_changes():
  current = as_dict(script.row_config("B1", ["tiny"]))
  # As run_row sees it: the table3.json written for the row, read back.
  assert script.same_config(json.loads(json.dumps(current)), current)
  older = {k: v for k, v in current.items() if k != "attention_impl"}
  assert script.same_config(older, current)  # a field added since
  assert not script.same_config(dict(current, d_k=current["d_k"] + 1),
                                current)
  assert not script.same_config(dict(current, gone_field=1), current)
  assert not script.same_config(None, current)


def test_unknown_row_fails_before_anything_runs(tmp_path):
  with pytest.raises(script.Table3Error, match=r"nope.*known rows: base, A1"):
    script.main([f"--workdir_root={tmp_path / 'r'}", "--rows=base,nope",
                 "--readme="])
  assert not (tmp_path / "r").exists()
  readme = tmp_path / "README.md"
  readme.write_text("# no markers\n")
  with pytest.raises(script.Table3Error, match="no <!-- table3:start -->"):
    script.main([f"--workdir_root={tmp_path / 'r'}", "--rows=base",
                 f"--readme={readme}"])
  assert not (tmp_path / "r").exists()


def test_a_diverged_row_is_shown_as_such_not_as_a_number(tmp_path):
  config = script.row_config("dot", ["tiny"])
  result = {
      "row": "dot", "paper": "§3.2.1", "status": "failed",
      "config": as_dict(config), "params": script.count_params(config),
      "error": "Training loss is nan at step 7; stopping. The checkpoints "
               "saved before this step are intact.",
      "train": {"seconds": 30.0, "start_step": 0},
      "train_command": "python train.py ...", "eval_command": "python eval.py",
      "measured": "2026-11-22 12:00 UTC", "machine": "test machine",
      "load_average": 1.0,
  }
  (tmp_path / "dot").mkdir()
  (tmp_path / "dot" / "table3.json").write_text(json.dumps(result))
  (tmp_path / "E").mkdir()  # a started row without a result: "not run"
  (tmp_path / "E" / "table3.json").write_text(json.dumps(
      dict(result, row="E", status="trained")))
  results = script.collect_results(str(tmp_path))
  assert list(results) == ["dot"]
  rows = table_rows(script.build_table(results, str(tmp_path), ["tiny"]))
  assert rows["dot"]["dev PPL"] == "diverged (step 7)"
  assert rows["dot"]["dev BLEU"] == "—"
  assert rows["E"]["dev PPL"] == script.NOT_RUN
