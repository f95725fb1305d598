r"""Estimated cost of the paper's WMT14 recipes (configs/wmt14.py) on accelerators.

    python scripts/wmt14_cost.py            # prints the README's cost table

No accelerator is at hand in this project, so every figure is an ESTIMATE:

    hours = num_train_steps · FLOPs per step / (peak FLOP/s · MFU) / 3600

* FLOPs per step: `mha/model/flops.py: training_flops` (every matrix product of
  the forward and backward pass; bench/train_step.py checks it against
  XLA's own count) for
  the paper's batch of 25,000 source + 25,000 target tokens, as rows of
  `TYPICAL_LENGTH` tokens (SentencePiece sentences of newstest average about
  30 pieces; the attention products grow with the length, the rest does not).
* Peak: the vendors' dense bfloat16 matmul peak of all chips of the slice
  (float32 for the paper's P100s, which had no bfloat16), an assumption of
  datasheets, not a measurement.
* MFU: `ASSUMED_MFU` of that peak for the accelerators, ASSUMED from what
  tuned JAX Transformer training commonly reaches (no run here); the
  paper's own row solves for the MFU its published time implies. (On this
  project's CPUs the base shape measures about 51% of the float32 peak,
  bench/README.md, which says nothing about an accelerator.)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mha.model.flops import training_flops  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import wmt14  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model.transformer import TransformerConfig  # pylint: disable=g-import-not-at-top,wrong-import-position

TYPICAL_LENGTH = 32
ASSUMED_MFU = 0.40
# (name, dense peak FLOP/s of the whole slice, what the peak is).
ACCELERATORS = (
    ("TPU v3-8", 4 * 123e12, "4 chips x 123 TFLOP/s bf16"),
    ("TPU v4-8", 4 * 275e12, "4 chips x 275 TFLOP/s bf16"),
    ("8x A100", 8 * 312e12, "8 x 312 TFLOP/s bf16"),
    ("8x H100 SXM", 8 * 989e12, "8 x 989 TFLOP/s bf16"),
)
# The paper (§5.2): 8 P100 GPUs; base 100k steps in 12 hours, big 300k steps
# in 3.5 days. P100 SXM2: 10.6 TFLOP/s float32.
PAPER = ("8x P100 (the paper)", 8 * 10.6e12, "8 x 10.6 TFLOP/s fp32")
PAPER_HOURS = {"base": 12.0, "big": 3.5 * 24}


def step_flops(model: str) -> tuple[float, int]:
  """(FLOPs of one update of configs/wmt14.py:<model>, num_train_steps)."""
  config = wmt14.get_config(model)
  tokens = config.max_tokens * config.grad_accum_steps  # per side, per update
  rows = tokens // TYPICAL_LENGTH
  flops = training_flops(TransformerConfig.from_config(config), rows,
                         TYPICAL_LENGTH, TYPICAL_LENGTH)
  return flops, config.num_train_steps


def hours(flops_per_step: float, steps: int, peak: float, mfu: float
          ) -> float:
  return steps * flops_per_step / (peak * mfu) / 3600


def table(mfu: float = ASSUMED_MFU) -> str:
  """The cost table as Markdown."""
  lines = ["| hardware | peak (datasheet) | MFU | base: 100k steps | "
           "big: 300k steps |", "| --- | --- | --- | --- | --- |"]
  cost = {m: step_flops(m) for m in ("base", "big")}
  for name, peak, what in ACCELERATORS:
    cells = [f"{hours(*cost[m], peak, mfu):.1f} h (estimate)"
             for m in ("base", "big")]
    lines.append(f"| {name} | {what} | {mfu:.0%} assumed | " +
                 " | ".join(cells) + " |")
  name, peak, what = PAPER
  implied = {m: hours(*cost[m], peak, 1.0) / PAPER_HOURS[m] for m in cost}
  lines.append(
      f"| {name} | {what} | implied: base {implied['base']:.0%}, big "
      f"{implied['big']:.0%} | 12 h (published) | 84 h (published) |")
  per_step = ", ".join(f"{m} {cost[m][0] / 1e12:.1f} TFLOP"
                       for m in ("base", "big"))
  lines.append("")
  lines.append(f"FLOPs per update ({TYPICAL_LENGTH}-token rows, 25k tokens "
               f"per side): {per_step}.")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mfu", type=float, default=ASSUMED_MFU,
                      help="Assumed model-FLOP utilisation (default 0.40).")
  args = parser.parse_args()
  print(table(args.mfu))


if __name__ == "__main__":
  main()
