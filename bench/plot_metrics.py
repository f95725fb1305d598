r"""Plots a workdir's training and validation NLL (and BLEU, when logged).

    python bench/plot_metrics.py --workdir=/tmp/m30k --out=docs/multi30k_loss.png
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mha import metrics  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True, help="PNG file to write")
  parser.add_argument("--title", default=None)
  args = parser.parse_args()
  records = metrics.read_metrics(args.workdir)
  train = [r for r in records if "nll" in r]
  evals = [r for r in records if "eval_nll" in r]
  bleu = [r for r in evals if "eval_bleu" in r]
  if not train:
    sys.exit(f"{args.workdir}/metrics.jsonl holds no training metrics.")
  fig, ax = plt.subplots(figsize=(6, 3.6))
  ax.plot([r["step"] for r in train], [r["nll"] for r in train],
          label="train NLL")
  ax.plot([r["step"] for r in evals], [r["eval_nll"] for r in evals], "o-",
          label="eval NLL")
  ax.set_xlabel("step")
  ax.set_ylabel("nats / target token")
  ax.set_yscale("log")
  ax.grid(alpha=0.3)
  if bleu:
    right = ax.twinx()
    right.plot([r["step"] for r in bleu], [r["eval_bleu"] for r in bleu],
               "s--", color="tab:green", label="eval BLEU")
    right.set_ylabel("BLEU")
    right.legend(loc="center right")
  ax.legend(loc="upper right")
  ax.set_title(args.title or os.path.basename(os.path.normpath(args.workdir)))
  fig.tight_layout()
  fig.savefig(args.out, dpi=100)
  print(f"Wrote {args.out}")


if __name__ == "__main__":
  main()
