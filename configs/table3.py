r"""The paper's Table 3 variants at small scale: Multi30k German->English.

    python train.py --config=configs/table3.py:A1 --workdir=/work/table3_runs/A1_seed0
    python train.py --config=configs/table3.py:A1,seed=1 --workdir=/work/table3_runs/A1_seed1
    python eval.py --workdir=/work/table3_runs/A1_seed0 --split=val --average_last=5
    python scripts/table3.py --workdir_root=/work/table3_runs  # every run, in order

Every row trains with the whole `configs/multi30k.py` recipe (3+3 layers,
d_model 256, 4 heads, d_ff 1024, P_drop 0.2, ε_ls 0.1, one shared
8,000-piece vocabulary, packed rows of 4,096 tokens per side and update,
1,200 steps, warmup 400, scale 0.7, the last 5 checkpoints kept): only the
row's change differs, so each row is measured at the end of the whole
recipe (10 epochs), as the paper's table measures each row at the end of
its training. One departure that changes no update: no BLEU during training
(`eval_bleu_sentences=0`); scripts/table3.py decodes the dev split after
training (beam 4, α 0.6, the last checkpoint as the paper's Table 3, and
the average of the last 5).

Config arguments (after the colon, comma-separated, configs/base.py's
`apply_args` order): one row name of ROWS below; `seed=N` (the model's
initialization, dropout and data order; default 0); and `tiny` (configs/
base.py's few-second model and loop, for tests: applied before the rows,
wherever it appears, so `A1,tiny` is the tiny model with one head of size
d_model).

The rows follow the paper's Table 3 on this model (d_model 256, h 4,
d_k = d_v = 64: the paper's base has the same head size, so row B's key
sizes are the paper's):
  A   h 1, 16 and 32 at constant computation (h·d_k = d_model; 32 heads of
      size 8 is the paper's largest h, and the most this model allows at
      the paper's smallest head size ratio);
  B   d_k 16 and 32;
  C   the model's size: N 2 and 4 (the paper: 6 -> 2, 4, 8), d_ff 512 and
      2048 (the paper: 2048 -> 1024, 4096), d_model 128 and 512 at h 4
      (d_k = d_v = d_model / 4; the paper: 512 -> 256, 1024 at h 8). The
      noam schedule's peak follows d_model (scale · d_model^-0.5 ·
      warmup^-0.5), as in the paper;
  D   no dropout, no label smoothing;
  E   learned positions;
  and the §3.2.1 compatibility functions (dot, additive) and the
  location-aware (one filter width) and multi-resolution (one width per
  head) encoder-decoder attention.
"""
import dataclasses
from typing import Any, Callable

import ml_collections

from configs import base
from configs import multi30k

# What the table changes in configs/multi30k.py for every row: nothing the
# updates see (the BLEU is decoded after training, on the whole dev split).
BUDGET = dict(eval_bleu_sentences=0)


@dataclasses.dataclass(frozen=True)
class Row:
  """One variant: its paper row, a one-line description and its changes.

  Attributes:
    name: the config argument (`A1`, `N2`, ...).
    paper: the paper's Table 3 row letter, or where the variant comes from.
    description: one line for the table's listing.
    changes: the config -> the fields to update (d_k = d_v = None resolved
      to d_model / h of the model it applies to, `tiny` included).
  """
  name: str
  paper: str
  description: str
  changes: Callable[[ml_collections.ConfigDict], dict[str, Any]]


def _resolved(fields: dict[str, Any]) -> Callable[
    [ml_collections.ConfigDict], dict[str, Any]]:
  """`fields`, with d_k = d_v = None written out as d_model / h."""
  def changes(config: ml_collections.ConfigDict) -> dict[str, Any]:
    row = dict(fields)
    heads = row.get("num_heads", config.num_heads)
    d_model = row.get("d_model", config.d_model)
    for field in ("d_k", "d_v"):
      if field in row and row[field] is None:
        row[field] = d_model // heads
    return row
  return changes


def _row(name: str, paper: str, description: str,
         fields: dict[str, Any] | None = None) -> Row:
  """A row from `fields`, or from configs/base.py's TABLE3_ROWS[name]."""
  if fields is None:
    fields = {} if name == "base" else base.TABLE3_ROWS[name]
  return Row(name, paper, description, _resolved(fields))


ROWS = {r.name: r for r in [
    _row("base", "base", "the multi30k model: N 3, d_model 256, d_ff 1024, "
         "h 4, d_k = d_v = 64, P_drop 0.2, ε_ls 0.1, sinusoids, scaled "
         "dot-product"),
    _row("A1", "A", "one head, d_k = d_v = d_model (h·d_k constant)"),
    _row("A3", "A", "16 heads, d_k = d_v = d_model / 16 (h·d_k constant)"),
    _row("A4", "A", "32 heads, d_k = d_v = d_model / 32 = 8 (h·d_k "
         "constant)"),
    _row("B1", "B", "attention key size d_k 16 (d_v stays 64)"),
    _row("B2", "B", "attention key size d_k 32 (d_v stays 64)"),
    _row("N2", "C", "N 2 layers (encoder and decoder)", dict(num_layers=2)),
    _row("N4", "C", "N 4 layers (encoder and decoder)", dict(num_layers=4)),
    _row("dff512", "C", "d_ff 512", dict(d_ff=512)),
    _row("dff2048", "C", "d_ff 2048", dict(d_ff=2048)),
    _row("dmodel128", "C", "d_model 128, h 4, d_k = d_v = 32",
         dict(d_model=128, d_k=None, d_v=None)),
    _row("dmodel512", "C", "d_model 512, h 4, d_k = d_v = 128",
         dict(d_model=512, d_k=None, d_v=None)),
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


def _seed(seed: int) -> dict[str, int]:
  if seed < 0:
    raise ValueError(f"seed={seed} must be >= 0.")
  return {"seed": seed}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """configs/multi30k.py (no in-training BLEU), then `apply_args`'s rule:
  `seed=N`, then `tiny`, then the row."""
  config = multi30k.get_config()
  config.update(BUDGET)
  variants = {name: row.changes for name, row in ROWS.items()}
  return base.apply_args(config, arg, {**variants, "tiny": base.TINY},
                         options={"seed": (int, 0, _seed)})
