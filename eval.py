"""Evaluates a workdir's checkpoints: `python eval.py --workdir=...`.

The mha-eval command (mha/cli/eval.py has its flags and docs), run from the
repository without installing it.
"""
from mha.cli.eval import main, run  # noqa: F401  (the tests call main)

if __name__ == "__main__":
  run()
