"""One process of the two-process data test (tests/test_distributed.py).

    python tests/multiprocess_data.py OUT WORKDIR OVERRIDES_JSON

Started twice by the test with a SLURM job's environment variables (two
tasks on localhost), so that `mha.runtime.distributed.initialize('auto')`
detects the cluster through JAX. It then does what train.py and the trainer do
with the data (prepare the splits, get the vocabulary, read training and
evaluation batches) and writes to OUT.npz what it saw: its batches, the
vocabulary's hash, the log line, and how many times it trained a
vocabulary, prepared a TFDS folder and wrote a file.
"""
import collections
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging
from configs import quickstart
from mha.runtime import distributed
from mha import data
from mha.runtime import files
from mha.data import sources
from mha.data import parallel_text
from mha.data import tokenizer
import numpy as np

_counts = collections.Counter()


def _counted(owner, name: str) -> None:
  """Counts the calls of `owner.name`."""
  original = getattr(owner, name)

  def wrapper(*args, **kwargs):
    _counts[name] += 1
    return original(*args, **kwargs)

  setattr(owner, name, wrapper)


def main(out: str, workdir: str, overrides: str) -> None:
  logging.set_verbosity(logging.INFO)  # as under absl's app.run
  distributed.initialize("auto")
  _counted(tokenizer, "train_model")
  _counted(files, "write_bytes_atomic")
  _counted(parallel_text.ParallelText, "download_and_prepare")
  config = quickstart.get_config("tiny")
  config.update(json.loads(overrides))
  sources.prepare_splits(config)  # as train.py
  tok = data.get_tokenizer(config, workdir)  # as the trainer's set-up
  train = list(itertools.islice(data.train_batches(config, tok), 3))
  evaluation = data.eval_batches(config, tok, config.eval_split)
  arrays = {f"train{i}_{k}": v for i, b in enumerate(train)
            for k, v in b.items()}
  arrays.update({f"eval{i}_{k}": v for i, b in enumerate(evaluation)
                 for k, v in b.items()})
  import jax  # pylint: disable=g-import-not-at-top
  np.savez(out, **arrays, sha256=tok.sha256, line=distributed.describe(),
           process_index=jax.process_index(),
           counts=json.dumps(dict(_counts)))


if __name__ == "__main__":
  main(*sys.argv[1:])
