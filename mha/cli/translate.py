r"""mha-translate: a trained model translating line by line.

    mha-translate --workdir=/tmp/run                  # stdin -> stdout
    mha-translate --workdir=/tmp/run --input=src.txt --output=out.txt
    mha-translate --workdir=/tmp/run --nbest=4        # n-best lists
    mha-translate --workdir=/tmp/run --sample --temperature=0.8 --top_k=10

(also `python -m mha.cli.translate ...`). Loads the workdir's model once
(`mha.load`: the latest checkpoint, or --step, or the average of the last
--average_last), then reads standard input one line at a time and writes
each translation as soon as it is made, flushed: it never waits for more
input than the line it translates (lines that have already arrived are
translated together); at a terminal, the search for a typed line's length
is prepared (compiled, or loaded from the compilation cache) while the
first line is typed. Blank lines give blank lines. Log lines go to
standard error. The search defaults to the workdir's config (the paper:
beam 4, alpha 0.6, outputs of at most input length + 50 tokens).

--nbest=N writes the N best hypotheses of each line, one per line, tab-
separated: line number (1 = the first input line), rank (1 = the best),
the length-penalised score, log P(Y | X), the translation; a blank input
line is not translated: it gets N lines with scores 0 and an empty
translation (without --nbest, one empty line). --sample draws each translation
from the model (temperature, top_k: 0 = every token, seed): the same seed gives
the same samples however the input arrives.

--input reads a file (plain or .gz) instead of standard input ('-':
standard input), in batches of --batch_size (default:
`translate.batch_size_for`'s); --output writes a file instead of standard
output ('-': standard output), through a temporary file renamed
at the end, so an interrupted run (a Ctrl-C, or a SIGTERM: exit status
143) leaves no partial file and an existing one as it was; an existing
file keeps its mode, a symbolic link is written through (its target
replaced, the link kept), a device or pipe is written directly
(`mha.cli.output`); a folder it cannot write or a full disk is one
line. --temperature,
--top_k and --seed without --sample are refused (they would change
nothing). Bad input (a workdir, step, flag, file)
prints one line, `mha-translate: <message>`, and exits with status 1. A
reader that closes standard output early (`mha-translate ... | head -1`)
stops it quietly with SIGPIPE's status, 141, as it stops cat.
"""
import os
import signal
import sys

from absl import app
from absl import flags
from absl import logging

from mha import validation
from mha.cli import output
from mha.cli import startup
from mha.errors import ConfigError

startup.define_search_flags()
startup.define_once(flags.DEFINE_integer, "step", None,
                    "Checkpoint step (default: the latest).")
flags.DEFINE_integer("nbest", 0, "Write the N best hypotheses of each line "
                     "with their scores (0 = the best only, no scores).")
flags.DEFINE_bool("sample", False, "Sample each translation from the model "
                  "instead of the beam search.")
flags.DEFINE_float("temperature", 1.0, "Sampling temperature (0 = greedy).")
flags.DEFINE_integer("top_k", 0, "Sample from the k most probable tokens "
                     "(0 = all).")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_string("input", None, "A file to translate (default: standard "
                    "input, line by line).")
flags.DEFINE_string("output", None, "The file to write (default: standard "
                    "output).")
startup.define_flags()
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def _check_files(input_path: str | None, output_path: str | None) -> None:
  if input_path not in (None, "-") and os.path.isdir(input_path):
    raise ConfigError(f"--input={input_path} is a folder: give the file to "
                      "translate.")
  if input_path not in (None, "-") and not os.path.isfile(input_path):
    raise ConfigError(f"--input={input_path}: no such file.")
  if output_path in (None, "-"):
    return
  if os.path.isdir(output_path):
    raise ConfigError(f"--output={output_path} is a folder: give the file "
                      "to write.")
  if input_path and os.path.realpath(input_path) == os.path.realpath(
      output_path):
    raise ConfigError(f"--output={output_path} is the input file.")
  folder = os.path.dirname(os.path.realpath(output_path))  # links followed
  if not os.path.isdir(folder):
    raise ConfigError(f"--output={output_path}: the folder {folder} does "
                      "not exist.")


_SAMPLING = ("temperature", "top_k", "seed")


def _translate(write) -> int:
  """Loads the model and translates the input with `write`; returns the
  number of lines."""
  import mha  # pylint: disable=import-outside-toplevel
  from mha.evaluation import evaluator  # pylint: disable=import-outside-toplevel
  from mha.cli import lines as lines_lib  # pylint: disable=import-outside-toplevel
  from mha.search import texts as translate  # pylint: disable=import-outside-toplevel
  translator = mha.load(FLAGS.workdir, step=FLAGS.step,
                        average_last=FLAGS.average_last)
  function = lines_lib.line_translator(
      translator, nbest=FLAGS.nbest, sample=FLAGS.sample,
      temperature=FLAGS.temperature, top_k=FLAGS.top_k, seed=FLAGS.seed,
      batch_size=FLAGS.batch_size, **startup.search_flags())
  logging.info("Loaded %s, step %s.", FLAGS.workdir,
               translator.steps if len(translator.steps) > 1
               else translator.step)
  batch_size = translate.batch_size_for(FLAGS.batch_size)
  if FLAGS.input in (None, "-"):
    batches = lines_lib.read_batches(sys.stdin.fileno(), batch_size)
    if os.isatty(sys.stdin.fileno()):  # typed: prepare while it is typed
      function = lines_lib.WarmedUp(
          function, translator.tokenizer, translator.model_config.max_len)
  else:
    lines = evaluator.read_lines(FLAGS.input, "--input")
    batches = (lines[i:i + batch_size * 16]
               for i in range(0, len(lines), batch_size * 16))
  return lines_lib.translate_stream(function, batches, write)


@startup.guarded
@startup.stops_on_sigterm
def main(argv: list[str]) -> int:
  """Translates --input (or standard input) into --output (or standard
  output)."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  _check_files(FLAGS.input, FLAGS.output)
  validation.check_flag("nbest", FLAGS.nbest)
  given = [f"--{name}" for name in _SAMPLING if FLAGS[name].present]
  if given and not FLAGS.sample:
    raise ConfigError(f"{', '.join(given)}: sampling settings, used only "
                      "with --sample (give it, or leave them out).")
  startup.use_search_devices()
  if FLAGS.output in (None, "-"):
    out = sys.stdout.buffer

    def write(text: str) -> None:
      out.write(text.encode("utf-8"))
      out.flush()

    try:
      count = _translate(write)
    except BrokenPipeError:
      # The reader closed the pipe (`| head -1`): stop without a word, as
      # cat does, with the status a SIGPIPE gives (128 + 13); standard
      # output points at /dev/null so that the exit flushes nothing more.
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      return 128 + signal.SIGPIPE
  else:
    with output.output_file(FLAGS.output) as write:  # made first: no JAX
      count = _translate(write)
  logging.info("Translated %d line(s).", count)
  return 0


def run() -> None:
  """The console script `mha-translate`."""
  startup.run(main)


if __name__ == "__main__":
  run()
