r"""mha-import: a Hugging Face MarianMT folder as an mha workdir.

    mha-import --from=huggingface --source=/data/opus-mt-de-en \
        --workdir=/tmp/opus --config=configs/base.py

(or `python -m mha.cli.import_ ...`). --config is the recipe the workdir
records (data, training, search: eval.py's default split, a fine-tune's
schedule); its model fields become the imported model's. Nothing is
downloaded: --source is a folder on disk. A refused import (one line
naming the file or field) leaves no workdir (`mha.huggingface.importer`).
"""
from absl import app
from absl import flags
from ml_collections import config_flags

from mha.cli import startup

FLAGS = flags.FLAGS
FORMATS = ("huggingface",)
config_flags.DEFINE_config_file(
    "config", None, "The config the workdir records; its model fields "
    "become the imported model's.", lock_config=False)
startup.define_once(flags.DEFINE_string, "workdir", None,
                    "The new workdir (a new or empty local folder).")
_FROM = flags.DEFINE_enum("from", "huggingface", FORMATS,
                          "The format of --source.")
_SOURCE = flags.DEFINE_string("source", None,
                              "The model folder (e.g. a MarianMT folder "
                              "downloaded from the Hugging Face Hub).")
startup.define_flags()
flags.mark_flag_as_required("workdir")


def parse_flags(argv: list[str]) -> list[str]:
  """`startup.parse_flags`, then a missing --source or --config as one
  line."""
  remaining = startup.parse_flags(argv)
  if not FLAGS.source:
    startup.fail("--source is required: the Hugging Face MarianMT folder "
                 "to import.")
  if FLAGS.config is None:
    startup.fail("--config is required: the recipe the workdir records, "
                 "e.g. --config=configs/base.py.")
  return remaining


@startup.guarded
@startup.stops_on_sigterm
def main(argv: list[str]) -> int:
  """Imports --source into --workdir."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  # pylint: disable=g-import-not-at-top  (JAX)
  from mha.huggingface import importer
  config = importer.import_model(FLAGS.source, FLAGS.workdir,
                                 startup.loaded_config())
  print(f"Imported {FLAGS.source} ({_FROM.value}) as {FLAGS.workdir}. "
        f"Fine-tune it with: mha-train --config=CONFIG "
        f"--workdir=NEW --config.init_from={FLAGS.workdir} "
        f"{importer.train_overrides(config)}")
  return 0


def run() -> None:
  """The `mha-import` command."""
  startup.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
