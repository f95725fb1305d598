r"""mha-train: trains a Transformer from a config file; resumes its workdir.

    mha-train --config=configs/base.py --workdir=/tmp/base
    mha-train --config=configs/base.py:A1 --config.warmup_steps=8000 ...

The same command as `python train.py` in the repository and `python -m
mha.cli.train`.

--distributed=auto (the default) starts jax.distributed when JAX detects a
cluster (Cloud TPU pod slices, SLURM, Open MPI, Kubernetes); =on starts it
or stops with one line; =off never does. Several processes JAX does not
detect (GPU clusters, CPU processes on one host) take
--coordinator_address=HOST:PORT --num_processes=N --process_id=I. With
several processes, process 0 prepares the dataset, trains the vocabulary and
writes the tokenized cache while the others wait, then they read them.

A bad config file, config field or override (`--config.num_train_step=4`:
one line with ml_collections' "did you mean"), workdir (or one that another
run holds) or data file, a non-finite loss, and a full disk or read-only
folder print one line naming the problem and exit with status 1
(--traceback shows the stack); a refused run writes nothing, and earlier
checkpoints stay as they were. SIGTERM (preemption) saves a checkpoint at
the next step boundary and exits with status 0; Ctrl-C does the same and
exits with status 130 (a second Ctrl-C stops at once, without saving).
Either signal during the set-up (the vocabulary, the tokenized cache), before
the first step, leaves the workdir as it was (SIGTERM: status 143).

On a CPU host the process restarts once with huge pages for XLA's host
buffers; `MHA_HUGE_PAGES=0/1` decides otherwise (mha/runtime/host_memory.py).
"""
from absl import app
from absl import flags
from ml_collections import config_flags

from mha.cli import startup

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file.",
                                lock_config=True)
startup.define_once(flags.DEFINE_string, "workdir", None,
                    "Checkpoints, metrics and vocabulary.")
# mha.runtime.distributed.MODES (that module imports JAX: not before the
# restart).
flags.DEFINE_enum("distributed", "auto", ("auto", "on", "off"),
                  "Multi-process start-up: auto = when JAX detects a cluster "
                  "(TPU pod slice, SLURM, Open MPI, Kubernetes), on = always "
                  "(or fail), off = never.")
flags.DEFINE_string("coordinator_address", None,
                    "HOST:PORT of process 0, for multi-process runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes.")
flags.DEFINE_integer("process_id", None, "This process's index.")
startup.define_flags()
# --config is checked by parse_flags: marked required, it would be required
# of the other commands too in a process that imports this module with
# theirs.
flags.mark_flag_as_required("workdir")


def parse_flags(argv: list[str]) -> list[str]:
  """`startup.parse_flags`, then a missing --config as one line."""
  remaining = startup.parse_flags(argv)
  if FLAGS.config is None:
    startup.fail("--config is required: the training config file, e.g. "
                 "--config=configs/base.py.")
  return remaining


@startup.guarded
def main(argv: list[str]) -> None:
  """Prepares the data (process 0 first) and trains into --workdir."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # pylint: disable=g-import-not-at-top  (JAX: after the restart)
  from mha.runtime import distributed
  from mha.train import trainer
  from mha.data import sources
  config = startup.loaded_config()  # loaded by parse_flags
  distributed.initialize(FLAGS.distributed, FLAGS.coordinator_address,
                         FLAGS.num_processes, FLAGS.process_id)
  # Several processes: process 0 prepares the dataset, the others wait.
  sources.prepare_splits(config)
  trainer.train_and_evaluate(config, FLAGS.workdir)


def run() -> None:
  """The mha-train command."""
  startup.run(main, parse_flags)


if __name__ == "__main__":
  run()
