r"""mha-export: a trained workdir as a CTranslate2 or Hugging Face folder.

    mha-export --workdir=/tmp/run --format=ctranslate2 \
        --output_dir=/tmp/run_ct2 [--quantization=int8] \
        [--step=S | --average_last=N]
    mha-export --workdir=/tmp/run --format=huggingface \
        --output_dir=/tmp/run_hf [--step=S | --average_last=N]

(or `python -m mha.cli.export ...`). A CTranslate2 folder holds the model,
its vocabulary and the workdir's spm.model: `ctranslate2.Translator(folder)`
and SentencePiece are all a user needs (`mha.export`'s docstring shows the
lines); it needs the optional `ctranslate2` package. A Hugging Face folder
is a MarianMT model and tokenizer (`mha.huggingface.export`); writing it
needs the optional `safetensors` package, reading it `transformers`.
"""
from absl import app
from absl import flags

from mha import validation  # no JAX: may be imported before the restart
from mha.errors import ConfigError
from mha.cli import startup

FLAGS = flags.FLAGS
# Flags that other commands define too (one process may import several).
startup.define_once(flags.DEFINE_string, "workdir", None,
                    "The training workdir (local or gs://); only read.")
startup.define_once(flags.DEFINE_integer, "step", None,
                    "The checkpoint step; default: the latest.")
startup.define_once(flags.DEFINE_integer, "average_last", None,
                    "Export the mean of the last N checkpoints (up to "
                    "--step).")
startup.define_once(flags.DEFINE_string, "output_dir", None,
                    "A new or empty local folder, or an earlier export "
                    "(replaced); a symbolic link: the folder it points at.")
_FORMAT = flags.DEFINE_enum("format", "ctranslate2", validation.EXPORT_FORMATS,
                            "The export format.")
_QUANTIZATION = flags.DEFINE_enum(
    "quantization", "float32", validation.QUANTIZATIONS,
    "Weights: float32, or int8 (CTranslate2's 8-bit quantisation; "
    "ctranslate2 only).")
startup.define_flags()
# --workdir is required by every command; --output_dir is checked in main:
# marked required, it would be required of eval.py too in a process that
# imports both (the flag is shared).
flags.mark_flag_as_required("workdir")


@startup.guarded
@startup.stops_on_sigterm
def main(argv: list[str]) -> int:
  """Exports --workdir's checkpoint into --output_dir."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS.output_dir:
    raise ConfigError("--output_dir is required: the folder to write the "
                      "exported model into.")
  # pylint: disable=g-import-not-at-top  (JAX)
  if _FORMAT.value == "huggingface":
    from mha.huggingface import export as hf_export
    write, keywords = hf_export.export_model, {}
  else:
    from mha import export
    write, keywords = export.export, {"export_format": _FORMAT.value}
  manifest = write(
      FLAGS.workdir, FLAGS.output_dir, quantization=_QUANTIZATION.value,
      step=FLAGS.step, average_last=FLAGS.average_last, **keywords)
  print(f"Exported step(s) {manifest['averaged_steps']} of {FLAGS.workdir} "
        f"to {FLAGS.output_dir} ({manifest['format']}, "
        f"{manifest['quantization']}).")
  return 0


def run() -> None:
  """The `mha-export` command."""
  startup.run(main)


if __name__ == "__main__":
  run()
