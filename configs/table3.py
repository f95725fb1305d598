r"""The paper's Table 3 variants at small scale: Multi30k German->English.

    python train.py --config=configs/table3.py:A1 --workdir=workdirs/table3/A1
    python eval.py --workdir=workdirs/table3/A1 --split=val
    python scripts/table3.py --workdir_root=workdirs/table3 --rows=base,A1

Starts from configs/multi30k.py (3+3 layers, d_model 256, 4 heads, d_ff 1024,
dropout 0.2, label smoothing 0.1, one shared 8,000-piece vocabulary, 4,096
padded tokens per side and batch in one micro-batch, in the paper's length
buckets: the table was measured so, before multi30k.py packed its rows and
split its updates in two) and shortens the run to a fixed budget,
the same for every row: 200 steps (about 1.4 epochs of the 29,000 training
pairs, 145 steps per epoch), warmup 100, learning-rate scale 0.35 (the noam
formula's peak 0.35 · 256^-0.5 · 100^-0.5 ≈ 2.2e-3, the multi30k config's
peak). Why so short: the project's machine is a 2-core CPU (0.63 steps/s at
this shape in the README's Multi30k run), and the twelve rows should fit in
about an hour and a half (expected: ~6 minutes of training and ~1 minute of
dev-set decoding per row). The
models are far from converged, so the table compares the variants early in
training, not at the end as the paper does.

One checkpoint, at step 200; the trainer's evaluation at step 200 logs the
dev split's (`val`) loss, NLL and perplexity to metrics.jsonl. No BLEU during
training (`eval_bleu_sentences=0`): scripts/table3.py decodes the whole dev
split afterwards with beam 4, α 0.6 and no checkpoint averaging, the
paper's Table 3 protocol.

Config arguments (after the colon, comma-separated, in configs/base.py's
`apply_args` order): one row name of ROWS below (the rows of configs/base.py's
TABLE3_ROWS, applied to d_model 256 / 4 heads instead of the paper's 512 / 8:
d_k = d_v = 64 in both, so row B's key sizes are the paper's), and `tiny`
(configs/base.py's few-second model and loop, for tests: applied before the
rows, wherever it appears, so `A1,tiny` is the tiny model with one head of
size d_model).
"""
import dataclasses
from typing import Any, Callable

import ml_collections

from configs import base
from configs import multi30k

# The fixed budget of every row (fields of configs/multi30k.py changed).
BUDGET = dict(
    pack_examples=False, max_tokens=4096, grad_accum_steps=1,
    num_train_steps=200, warmup_steps=100, learning_rate_scale=0.35,
    checkpoint_every_steps=200, keep_checkpoints=1, eval_every_steps=200,
    eval_bleu_sentences=0, log_every_steps=50,
)


@dataclasses.dataclass(frozen=True)
class Row:
  """One variant: its paper row, a one-line description and its changes.

  `changes` maps the config to the fields to update: the row's entry in
  configs/base.py's TABLE3_ROWS (where Table 3 is defined), with row A's
  d_k = d_v = None written out as d_model / h of the model it applies to
  (`tiny` included).
  """
  name: str
  paper: str
  description: str
  changes: Callable[[ml_collections.ConfigDict], dict[str, Any]]


def _paper_row(name: str) -> Callable[[ml_collections.ConfigDict],
                                      dict[str, Any]]:
  """configs/base.py's row `name`, head sizes resolved on the config."""
  def changes(config: ml_collections.ConfigDict) -> dict[str, Any]:
    row = dict(base.TABLE3_ROWS[name])
    heads = row.get("num_heads", config.num_heads)
    d_model = row.get("d_model", config.d_model)
    for field in ("d_k", "d_v"):
      if field in row and row[field] is None:
        row[field] = d_model // heads
    return row
  return changes


def _row(name: str, paper: str, description: str) -> Row:
  changes = _paper_row(name) if name != "base" else (lambda c: {})
  return Row(name, paper, description, changes)


ROWS = {r.name: r for r in [
    _row("base", "base", "the multi30k model: h 4, d_k = d_v = 64, P_drop "
         "0.2, ε_ls 0.1, sinusoids, scaled dot-product"),
    _row("A1", "A", "one head, d_k = d_v = d_model (h·d_k constant)"),
    _row("A3", "A", "16 heads, d_k = d_v = d_model / 16 (h·d_k constant)"),
    _row("B1", "B", "attention key size d_k 16 (d_v stays 64)"),
    _row("B2", "B", "attention key size d_k 32 (d_v stays 64)"),
    _row("D1", "D", "no dropout (P_drop 0)"),
    _row("D3", "D", "no label smoothing (ε_ls 0)"),
    _row("E", "E", "learned positional embedding instead of sinusoids"),
    _row("dot", "§3.2.1", "unscaled dot-product attention (no 1/√d_k)"),
    _row("additive", "§3.2.1", "additive attention (a one-hidden-layer "
         "compatibility function)"),
    _row("location", "location", "location-aware encoder-decoder attention, "
         "filter width 7 for all heads"),
    _row("multires", "location", "multi-resolution encoder-decoder "
         "attention, filter widths 1, 3, 5, 7 (one per head)"),
]}
ROW_NAMES = tuple(ROWS)  # the fixed order of the table


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """configs/multi30k.py with the fixed budget, then `apply_args`'s rule:
  `tiny`, then the rows."""
  config = multi30k.get_config()
  config.update(BUDGET)
  variants = {name: row.changes for name, row in ROWS.items()}
  return base.apply_args(config, arg, {**variants, "tiny": base.TINY})
