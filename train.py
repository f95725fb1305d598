r"""Trains a Transformer from a config file; resumes from the workdir.

    python train.py --config=configs/base.py --workdir=/tmp/base
    python train.py --config=configs/base.py:A1 --config.warmup_steps=8000 ...

Several processes (GPU clusters, CPU processes on one host) also take
--coordinator_address=HOST:PORT --num_processes=N --process_id=I; TPU pod
slices are detected without flags. A bad config, workdir or data file, and a
non-finite loss, print one message naming the problem and exit with status 1
(--traceback shows the stack); earlier checkpoints stay as they were.
"""
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from mha import compilation_cache
from mha import distributed
from mha import trainer

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and vocabulary.")
flags.DEFINE_string("coordinator_address", None,
                    "HOST:PORT of process 0, for multi-process runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes.")
flags.DEFINE_integer("process_id", None, "This process's index.")
flags.DEFINE_bool("traceback", False,
                  "On a bad config, workdir or data, raise with the stack "
                  "instead of printing only the message.")
compilation_cache.define_flag()
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  compilation_cache.enable(FLAGS.compilation_cache_dir)
  distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                         FLAGS.process_id)
  try:
    trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except (ValueError, FloatingPointError) as e:
    # Bad input (a config field, the workdir, a data file: DataError is a
    # ValueError) and a non-finite loss: every message names what is wrong,
    # and the checkpoints already written are left as they were.
    if FLAGS.traceback:
      raise
    print(f"train.py: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
