r"""mha-eval: evaluates a workdir's checkpoints: beam search, then sacreBLEU
and chrF.

    mha-eval --workdir=/tmp/run                       # latest, test split
    mha-eval --workdir=/tmp/run --average_last=5 --split=validation
    mha-eval --workdir=/tmp/run --source_file=src.txt \
        --reference_file=ref.txt
    echo "a sentence" | mha-eval --workdir=/tmp/run --source_file=-
    mha-eval --workdir=/tmp/run --plot_attention=3 --plot_layer=-1

The same command as `python eval.py` in the repository and `python -m
mha.cli.eval`.

Uses the config and vocabulary stored in the workdir; beam size, alpha,
the output limit and the beam's stopping rule default to the config's (the
paper: 4, 0.6, input + 50; --beam_stop=early stops sooner, docs/evaluation.md).
Writes translations.txt and metrics.json into --output_dir (default
<workdir>/eval/<split>_<step>/, <split>_avg<N>_<step>/ for averages,
file_<step>/ for --source_file; followed by _beam<B>, _alpha<A>, _extra<E>,
_early for each search setting that differs from the config's, e.g.
eval/test_800_beam8_alpha1.0/) and prints BLEU with its sacrebleu signature.
Results are never replaced by those of other settings: a folder whose
metrics.json records another split, step, beam, alpha, max_decode_extra,
stopping rule or source file is refused, and the files are written through a
temporary folder, so a failed evaluation leaves earlier results as they were.
With --source_file=- it writes one translation per input line to standard
output, in order, and everything else to standard error.

Every flag is checked before anything is read (alpha finite and >= 0,
beam_size, batch_size, average_last >= 1, checkpoint_step, max_decode_extra,
plot_attention >= 0, plot_layer within the model, beam_stop exact or
early). Bad input (a flag, no
checkpoint, unknown or damaged step, unreadable config.json or spm.model,
mismatched files, ...) prints one line, `eval.py: <message>` (or
`mha-eval: ...`), and exits with status 1 (--traceback shows the stack); any
other error is a bug and keeps its stack.

It runs in one process and uses this host's devices: started where JAX
detects a cluster of several processes (every host of a TPU pod slice, a
SLURM job of several tasks), it stops with one line before reading anything;
run it once, on one host that reads the workdir.

--paper_bleu also scores the BLEU the paper reports (Table 2): Moses
tokenization with compound splitting, as tensor2tensor's get_ende_bleu.sh
(mha/scoring/paper_bleu.py), written as bleu_paper beside sacreBLEU's bleu. It
reads higher than sacreBLEU; quote sacreBLEU, with its signature, to compare
with other work. As the script does, only the translations get Moses' Unicode
punctuation replacement; a raw reference is Moses-tokenized without it, and
one that is tokenized already (the script's newstest2014.tok.de) is given
with --reference_file and --reference_tokenized and only compound-split.

--plot_attention=N (default 0, off) also draws the attention maps of the
first N sentences of the split or source file (the paper's Figures 3-5):
the translation written (its ids, from the same search) is fed back
teacher-forced, and the weights of layer
--plot_layer (a Python index: 0 = first, -1 = last, the default) are drawn
with matplotlib, one panel per head, axes labelled with the SentencePiece
pieces. For sentence i (1 = the first) it writes
<output_dir>/attention/sentence_<i>_encoder_self.png (encoder self-attention),
..._decoder_self.png (decoder self-attention) and ..._encoder_decoder.png
(encoder-decoder attention). With --source_file=- it needs --output_dir.

--follow evaluates each checkpoint of --workdir as it appears, beside a
running trainer (on another machine: a gs:// workdir works), until the run's
last step (num_train_steps) is evaluated or --follow_timeout seconds pass
without a new checkpoint, listing the checkpoints every --follow_interval
seconds; each step alone and, with --average_last=N, the average of the
last N up to it. Each evaluation writes its usual folder and its BLEU and
chrF into the run's TensorBoard and metrics.jsonl at the checkpoint's step,
as <split>/bleu, <split>_avg<N>/bleu, ... (mha/evaluation/follow.py). It never
takes the trainer's lock; a checkpoint the trainer deletes before or while it is
read is skipped with one log line; what was evaluated is recorded in
<workdir>/eval/follow_<split>.json, so a follower started again goes on
where it stopped; a second follower with the same split and settings is
refused.
"""
import os
import sys
from typing import Any

from absl import app
from absl import flags

from mha.cli import startup
from mha.search import settings as settings_lib

startup.define_search_flags()
flags.DEFINE_string("split", None, "Dataset split (default: test_split).")
flags.DEFINE_integer("checkpoint_step", None, "Step (default: the latest).")
flags.DEFINE_string("source_file", None,
                    "Plain text to translate, one sentence a line; '-' = "
                    "standard input to standard output.")
flags.DEFINE_string("reference_file", None, "References of --source_file.")
# Shared with mha-export (one process may import both).
startup.define_once(flags.DEFINE_string, "output_dir", None,
                    "Where to write translations.txt and metrics.json "
                    "(default <workdir>/eval/<split>_<step>/; with "
                    "--source_file=- nothing is written unless given).")
flags.DEFINE_integer("plot_attention", 0,
                     "Draw the attention maps of the first N sentences into "
                     "<output_dir>/attention/ (0 = off).")
flags.DEFINE_integer("plot_layer", -1,
                     "Encoder and decoder layer of the attention maps "
                     "(0 = first, -1 = last).")
flags.DEFINE_bool("paper_bleu", False,
                  "Also score the paper's BLEU: tokenized (Moses) with "
                  "compound splitting, as tensor2tensor's get_ende_bleu.sh, "
                  "written as bleu_paper beside sacreBLEU's bleu.")
flags.DEFINE_bool("follow", False,
                  "Evaluate each new checkpoint of --workdir as it appears "
                  "(beside a running trainer), writing BLEU and chrF into "
                  "its TensorBoard and metrics.jsonl; see "
                  "mha/evaluation/follow.py.")
flags.DEFINE_float("follow_interval", 60.0,
                   "With --follow: seconds between two listings of the "
                   "checkpoints.")
flags.DEFINE_float("follow_timeout", 3600.0,
                   "With --follow: stop after this many seconds without a "
                   "new checkpoint (0 = only once the run's last step is "
                   "evaluated).")
flags.DEFINE_bool("reference_tokenized", False,
                  "With --paper_bleu and --reference_file: the references "
                  "are Moses-tokenized already (as get_ende_bleu.sh's "
                  "newstest2014.tok.de), so they are only compound-split.")
startup.define_flags()
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


@startup.guarded
@startup.stops_on_sigterm
def main(argv: list[str]) -> int:
  """Evaluates --workdir and prints the summary; returns the exit status."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  startup.use_search_devices()
  # pylint: disable=g-import-not-at-top  (JAX: after the restart)
  from mha.runtime import distributed
  from mha.evaluation import evaluator
  piped = FLAGS.source_file == "-"
  distributed.check_single_process(startup.command_name())
  if FLAGS.follow:
    return _follow()
  result = evaluator.evaluate(
      FLAGS.workdir, split=FLAGS.split,
      checkpoint_step=FLAGS.checkpoint_step,
      average_last=FLAGS.average_last,
      batch_size=FLAGS.batch_size, source_file=FLAGS.source_file,
      reference_file=FLAGS.reference_file, output_dir=FLAGS.output_dir,
      write=not piped or FLAGS.output_dir is not None,
      plot_attention=FLAGS.plot_attention, plot_layer=FLAGS.plot_layer,
      paper_bleu=FLAGS.paper_bleu,
      reference_tokenized=FLAGS.reference_tokenized,
      **startup.search_flags())
  # With --source_file=- standard output holds the translations only.
  if piped:
    sys.stdout.buffer.write(
        "".join(t + "\n" for t in result["translations"]).encode("utf-8"))
    sys.stdout.flush()
  print_summary(result, sys.stderr if piped else sys.stdout)
  return 0


# Flags of one evaluation that --follow, which evaluates every checkpoint
# of the workdir's split into its own folder, does not take.
NOT_WITH_FOLLOW = ("checkpoint_step", "source_file", "reference_file",
                   "output_dir", "reference_tokenized", "plot_attention")


def _follow() -> int:
  """--follow: evaluates each checkpoint as it appears
  (`mha.evaluation.follow`)."""
  # pylint: disable=g-import-not-at-top  (JAX: after the restart)
  from mha.evaluation import follow
  from mha.evaluation.output import EvalError
  for name in NOT_WITH_FOLLOW:
    if FLAGS[name].value:
      raise EvalError(f"--{name} is not taken with --follow, which "
                      "evaluates each checkpoint of --workdir on --split "
                      "into its default folder.")
  follow.follow(
      FLAGS.workdir, split=FLAGS.split, average_last=FLAGS.average_last,
      batch_size=FLAGS.batch_size,
      paper_bleu=FLAGS.paper_bleu, poll_seconds=FLAGS.follow_interval,
      timeout_seconds=FLAGS.follow_timeout,
      report=lambda result: print_summary(result, sys.stdout, flush=True),
      **startup.search_flags())
  return 0


def print_summary(result: dict[str, Any], report, flush: bool = False
                  ) -> None:
  """The lines eval prints after an evaluation: what was evaluated and how
  fast, where it wrote, the attention maps drawn, and the scores (those of
  the table of metrics, `mha.scoring.metric_table.console_lines`)."""
  steps = result["averaged_steps"]
  what = (f"average of steps {steps}" if len(steps) > 1
          else f"step {result['checkpoint_step']}")
  search = settings_lib.of_record(result).describe()
  # The compilation apart, when it rounds to a tenth of a second or more.
  compiled = result.get("compile_seconds", 0.0)
  compiling = f", {compiled:.1f} s of it compiling" if compiled >= 0.05 else ""
  print(f"{result['split']}, {what}, {search}: {result['num_sentences']} "
        f"sentences in {result['decode_seconds']:.1f} s{compiling} "
        f"({result['sentences_per_second']:.1f} sentences/s)", file=report)
  if "output_dir" in result:
    print(f"Wrote {result['output_dir']}", file=report)
  if result.get("attention_maps"):
    maps = result["attention_maps"]
    print(f"Wrote {len(maps)} attention maps ({len(maps) // 3} sentence(s), "
          f"layer {FLAGS.plot_layer}) to {os.path.dirname(maps[0])}",
          file=report)
  # pylint: disable-next=g-import-not-at-top  (sacrebleu: after the restart)
  from mha.scoring import metric_table
  for line in metric_table.console_lines(result):  # the table's metrics
    print(line, file=report)
  if flush:
    report.flush()


def run() -> None:
  """The mha-eval command."""
  startup.run(main)


if __name__ == "__main__":
  run()
