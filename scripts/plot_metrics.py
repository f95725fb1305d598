r"""Plots a workdir's training and validation NLL (and BLEU, when logged).

    python scripts/plot_metrics.py --workdir=/tmp/m30k \
        --out=docs/multi30k_loss.png
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mha.runtime import files  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.store import metrics  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.store import workdir as workdir_lib  # pylint: disable=g-import-not-at-top,wrong-import-position


def curves(records: list[dict]) -> dict[str, tuple[list, list]]:
  """(steps, values) of each curve in metrics.jsonl records.

  Training records carry `nll`, evaluation records `eval_nll` and, where
  BLEU was measured during training, `eval_bleu`.
  """
  def series(key):
    rows = [r for r in records if key in r]
    return [r["step"] for r in rows], [r[key] for r in rows]
  return {"train NLL": series("nll"), "eval NLL": series("eval_nll"),
          "eval BLEU": series("eval_bleu")}


def _fail(message: str) -> None:
  """Exits with `plot_metrics.py: <message>` (one line), status 1, as
  mha/cli/startup.py's `fail` does for the commands."""
  sys.exit(f"plot_metrics.py: {' '.join(str(message).split())}")


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True, help="PNG file to write")
  parser.add_argument("--title", default=None)
  args = parser.parse_args(argv)
  folder = os.path.dirname(os.path.abspath(args.out))
  if not os.path.isdir(folder) or os.path.isdir(args.out):
    _fail(f"--out={args.out}: " + ("is a folder, not a file to write."
                                   if os.path.isdir(args.out) else
                                   f"the folder {folder} does not exist."))
  path = workdir_lib.Workdir(args.workdir).metrics_path
  if not files.exists(path):
    _fail(f"{path} does not exist: --workdir must be a training workdir.")
  try:
    records = metrics.read_metrics(args.workdir)  # each line checked
  except ValueError as e:
    _fail(str(e))
  lines = curves(records)
  if not lines["train NLL"][0]:
    _fail(f"{path} holds no training metrics.")
  fig, ax = plt.subplots(figsize=(6, 3.6))
  ax.plot(*lines["train NLL"], label="train NLL")
  ax.plot(*lines["eval NLL"], "o-", label="eval NLL")
  ax.set_xlabel("step")
  ax.set_ylabel("nats / target token")
  ax.set_yscale("log")
  ax.grid(alpha=0.3)
  if lines["eval BLEU"][0]:
    right = ax.twinx()
    right.plot(*lines["eval BLEU"], "s--", color="tab:green",
               label="eval BLEU")
    right.set_ylabel("BLEU")
    right.legend(loc="center right")
  ax.legend(loc="upper right")
  ax.set_title(args.title or os.path.basename(os.path.normpath(args.workdir)))
  fig.tight_layout()
  fig.savefig(args.out, dpi=100)
  plt.close(fig)
  print(f"Wrote {args.out}")
  return args.out


if __name__ == "__main__":
  main()
