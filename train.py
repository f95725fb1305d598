"""Trains a Transformer: `python train.py --config=... --workdir=...`.

The mha-train command (mha/cli/train.py has its flags and docs), run from
the repository without installing it.
"""
# main and parse_flags: the tests call them.
from mha.cli.train import main, parse_flags, run  # noqa: F401

if __name__ == "__main__":
  run()
