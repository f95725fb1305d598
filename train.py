"""Trains a Transformer: `python train.py --config=... --workdir=...`.

The mha-train command (mha/cli/train.py has its flags and docs), run from
the repository without installing it.
"""
from mha.cli.train import main, parse_flags, run  # noqa: F401  (tests call main)

if __name__ == "__main__":
  run()
