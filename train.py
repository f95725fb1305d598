r"""Trains a Transformer from a config file; resumes from the workdir.

    python train.py --config=configs/base.py --workdir=/tmp/base
    python train.py --config=configs/base.py:A1 --config.warmup_steps=8000 ...

--distributed=auto (the default) starts jax.distributed when JAX detects a
cluster (Cloud TPU pod slices, SLURM, Open MPI, Kubernetes); =on starts it
or stops with one line; =off never does. Several processes JAX does not
detect (GPU clusters, CPU processes on one host) take
--coordinator_address=HOST:PORT --num_processes=N --process_id=I. With
several processes, process 0 prepares the dataset, trains the vocabulary and
writes the tokenized cache while the others wait, then they read them.

A bad config file, config field, workdir (or one that another run holds) or
data file, a non-finite loss, and a full disk or read-only folder print one
line naming the problem and exit with status 1 (--traceback shows the
stack); a refused run writes nothing, and earlier checkpoints stay as they
were. SIGTERM (preemption) saves a checkpoint at the next step boundary and
exits with status 0; Ctrl-C does the same and exits with status 130 (a
second Ctrl-C stops at once, without saving).
"""
import os
import re
import sys

from mha import host_memory

if __name__ == "__main__":
  # XLA:CPU's per-step buffers in transparent huge pages: the process starts
  # again once, now, with glibc's tunable set (nothing elsewhere than Linux,
  # or with MHA_NO_HUGE_PAGES=1; mha/host_memory.py).
  host_memory.reexec_with_huge_pages()

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from mha import library_logs  # noqa: E402

# TensorFlow's start-up lines are hidden unless --verbose_libraries, if a
# dataset imports it (a TFDS dataset by name; mha/library_logs.py).
library_logs.quiet_native(sys.argv)

from mha import compilation_cache  # noqa: E402
from mha import distributed  # noqa: E402
from mha import trainer  # noqa: E402
from mha.data import sources  # noqa: E402
from mha.errors import ConfigError  # noqa: E402
from mha.errors import UserError  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and vocabulary.")
flags.DEFINE_enum("distributed", "auto", distributed.MODES,
                  "Multi-process start-up: auto = when JAX detects a cluster "
                  "(TPU pod slice, SLURM, Open MPI, Kubernetes), on = always "
                  "(or fail), off = never.")
flags.DEFINE_string("coordinator_address", None,
                    "HOST:PORT of process 0, for multi-process runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes.")
flags.DEFINE_integer("process_id", None, "This process's index.")
flags.DEFINE_bool("traceback", False,
                  "On a bad config, workdir or data, raise with the stack "
                  "instead of printing only the message.")
compilation_cache.define_flag()
library_logs.define_flag()
flags.mark_flags_as_required(["config", "workdir"])


def _fail(message: str, exit_code: int = 1) -> None:
  print(f"train.py: {message}", file=sys.stderr)
  sys.exit(exit_code)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag or config file as one line.

  A config file that raises while it is loaded (e.g. an unknown config
  argument, `configs/base.py:Z9`) is reported by ml_collections as the
  file's whole traceback inside the flag error: only its last line, the
  exception, is printed. --traceback shows absl's own report.
  """
  try:
    return FLAGS(argv)
  except flags.Error as e:
    if "--traceback" in argv:
      raise
    message = str(e)
    if "Error whilst parsing config file" in message:
      path = next((a.split("=", 1)[1] for a in argv
                   if a.startswith("--config=")), "")
      last = message.strip().splitlines()[-1].strip()  # "ValueError: ..."
      message = f"--config={path}: " + re.sub(r"^[\w.]+: ", "", last)
    _fail(" ".join(message.split()))


def _config():
  """FLAGS.config; a config file that could not be read as a ConfigError.

  ml_collections defers a missing or unreadable config file to the first
  access of the config, as an OSError.
  """
  config = FLAGS.config
  try:
    config.get("workdir")
  except OSError:
    path = config_flags.get_config_filename(FLAGS["config"])
    reason = "does not exist" if not os.path.exists(path) else "cannot be read"
    raise ConfigError(
        f"--config: the config file {path} {reason} (relative paths start in "
        f"{os.getcwd()}; the project's configs are in configs/).") from None
  return config


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  library_logs.configure(FLAGS.verbose_libraries)
  try:
    config = _config()
    compilation_cache.enable(FLAGS.compilation_cache_dir)
    distributed.initialize(FLAGS.distributed, FLAGS.coordinator_address,
                           FLAGS.num_processes, FLAGS.process_id)
    # Several processes: process 0 prepares the dataset, the others wait.
    sources.prepare_splits(config)
    trainer.train_and_evaluate(config, FLAGS.workdir)
  except UserError as e:
    # Bad input (a config field, the workdir or its lock, a data file, a
    # checkpoint) and a diverged run: the message names what is wrong, and
    # the checkpoints already written are left as they were. Any other
    # exception is a bug and keeps its stack.
    if FLAGS.traceback:
      raise
    _fail(str(e), getattr(e, "exit_code", 1))
  except KeyboardInterrupt:  # Ctrl-C before training started
    if FLAGS.traceback:
      raise
    _fail("Interrupted (Ctrl-C) before training started.", 130)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
