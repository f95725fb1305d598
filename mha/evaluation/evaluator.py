"""Evaluation of a workdir's checkpoints: translate, score, write.

    from mha.evaluation import evaluator
    result = evaluator.evaluate("/tmp/run", average_last=5)
    result["bleu"], result["sacrebleu_signature"]

Follows §6.1 of the paper: beam size 4, length penalty α = 0.6, outputs of at
most input length + 50 tokens, optionally the average of the last
checkpoints. The scores are those of the table of metrics
(`mha.scoring.metric_table`: sacreBLEU's BLEU and chrF, cased, on
detokenized text, reported with their signatures, never a hand-written
BLEU; the paper's BLEU on request). Evaluation writes only into its own
output folder.

The translations come from `mha.search.texts` (length-bucketed batches, the
beam search of `mha.search.decoding`), the scores from
`mha.scoring.metric_table`, the attention maps from
`mha.evaluation.attention_maps`.
"""
import contextlib
import dataclasses
import functools
import hashlib
import os
from typing import Any, Sequence

from absl import logging

from mha.evaluation import attention_maps
from mha import data
from mha.evaluation import output as eval_output
from mha.runtime import files
from mha.scoring import metric_table
from mha.search import texts as translate
from mha import validation
from mha.store import trained
from mha.store import workdir as workdir_lib
from mha.errors import EvalError
from mha.errors import Interrupted
from mha.errors import os_reason
from mha.search import settings as settings_lib
from mha.search.settings import SearchSettings
from mha.model.transformer import TransformerConfig

EVAL_DIR = workdir_lib.EVAL_DIR  # the layout is the Workdir's


# ------------------------------------------------------------------- inputs


def read_lines(path: str, what: str = "File") -> list[str]:
  """Lines of a UTF-8 text file, plain or gzip, without line endings ('-' =
  standard input, read as /dev/stdin).

  The reader of local parallel text (`files.read_lines`): only
  '\n' (and a '\r' before it) ends a line, so line numbers agree with
  `wc -l`; a last line without a newline counts; a byte order mark at the
  start is dropped (it would stay in the first sentence and its score).

  Raises:
    EvalError: the file does not exist (named as `what`).
    DataError: it is a directory, not valid UTF-8 (naming the line), or a
      damaged gzip file.
  """
  if path == "-":
    return files.read_lines("/dev/stdin")
  if not os.path.lexists(path):
    raise EvalError(f"{what} {path} does not exist.")
  return files.read_lines(path)


# ------------------------------------------------------------------ evaluate


def check_flags(*, checkpoint_step: int | None = None,
                average_last: int | None = None,
                batch_size: int | None = None,
                plot_attention: int = 0, **search: Any) -> None:
  """Checks the flags that need no workdir; None = the default.

  Each by its rule in the one table of rules (`mha.validation`);
  `search`: fields of `SearchSettings`.

  Raises:
    EvalError: naming the first flag out of range (α must be finite), or a
      search setting that is none.
  """
  unknown = sorted(set(search) - set(settings_lib.FIELDS))
  if unknown:
    raise EvalError(f"Not a search setting: {', '.join(unknown)}.")
  given = {"checkpoint_step": checkpoint_step, "average_last": average_last,
           "batch_size": batch_size, "plot_attention": plot_attention,
           **search}
  for name, value in given.items():
    if value is not None:
      validation.check_flag(name, value, EvalError)


def _search_settings(config: Any, workdir: str, **given: Any
                     ) -> SearchSettings:
  """The flags `given` (`SearchSettings` fields; None = not given), the
  config's values where not given, all checked.

  Raises:
    EvalError: a flag out of range, or a config's default that is (naming
      the workdir's config.json).
  """
  defaults = SearchSettings.of_config(config)
  settings = defaults.given(**given)
  for field, allowed in settings.problems(config.vocab_size):
    value = getattr(settings, field)
    if given.get(field) is not None:
      raise EvalError(validation.refusal(field, allowed, value))
    path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
    name = validation.setting(field)
    default_of = f" (the default of {name})" if name != field else ""
    raise EvalError(f"{path}: {field}{default_of} must be {allowed}, got "
                    f"{value!r}. Give {name}.")
  return settings


def _check_plot_flags(config, plot_attention: int, plot_layer: int,
                      write: bool) -> None:
  """--plot_layer within both stacks and somewhere to write, if plotting."""
  if not plot_attention:
    return
  if not write:
    raise EvalError(
        f"{validation.setting('plot_attention')} writes PNG files: give "
        f"{validation.setting('output_dir')} (with "
        f"{validation.setting('source_file')}=- nothing is written "
        "otherwise).")
  try:
    attention_maps.resolve_layer(
        plot_layer, config.get("num_encoder_layers") or config.num_layers,
        config.get("num_decoder_layers") or config.num_layers,
        validation.setting("plot_layer"))
  except ValueError as e:
    raise EvalError(str(e)) from None


def _read_inputs(config: Any, workdir: str, split: str | None,
                 source_file: str | None, reference_file: str | None
                 ) -> tuple[str, list[str], list[str] | None]:
  """(split name or 'file', sources, references or None), all checked."""
  if source_file:
    sources = read_lines(source_file, "Source file")
    if not sources:
      raise EvalError(f"Source file {source_file} is empty.")
    references = (read_lines(reference_file, "Reference file")
                  if reference_file else None)
    if references is not None and len(references) != len(sources):
      raise EvalError(
          f"Source file {source_file} has {len(sources)} lines but reference "
          f"file {reference_file} has {len(references)}.")
    return "file", sources, references
  split_name = split or config.test_split
  try:
    sources, references = data.load_text_pairs(config, split_name)
  except data.DataError as e:
    raise EvalError(f"Split {split_name!r} of {workdir}'s dataset: "
                    f"{e}") from None
  if not sources:
    raise EvalError(f"Split {split_name!r} of {config.dataset_name} is "
                    "empty.")
  return split_name, sources, references


@dataclasses.dataclass(frozen=True)
class _Plan:
  """An evaluation's inputs, all checked before any checkpoint is read.

  Attributes:
    config: the workdir's config.
    tokenizer: its vocabulary.
    sources: the sentences to translate.
    references: their references, or None (no scores).
    search: the search's settings (flags or the config's).
    settings: `split`, the fields of `search`, and `source_file`,
      `reference_file` with a source file (what metrics.json records).
    steps: the checkpoint steps chosen (ascending).
  """
  config: Any
  tokenizer: data.Tokenizer
  sources: list[str]
  references: list[str] | None
  search: SearchSettings
  settings: dict[str, Any]
  steps: list[int]


def _check_arguments(split: str | None, source_file: str | None,
                     reference_file: str | None, paper_bleu: bool = False,
                     reference_tokenized: bool = False, **flags: Any
                     ) -> None:
  """Check: the flags (`check_flags`) and the choice of inputs."""
  check_flags(**flags)
  if reference_file and not source_file:
    raise EvalError("{} needs {}.".format(
        *map(validation.setting, ("reference_file", "source_file"))))
  if source_file and split:
    raise EvalError("Give {} or {}, not both.".format(
        *map(validation.setting, ("split", "source_file"))))
  if reference_tokenized and not (paper_bleu and reference_file):
    raise EvalError(
        "{} says how {} reads {}: give both (a dataset split's references "
        "are raw text).".format(*map(validation.setting, (
            "reference_tokenized", "paper_bleu", "reference_file"))))


def _plan(workdir: str, split: str | None, source_file: str | None,
          reference_file: str | None, *, checkpoint_step: int | None,
          average_last: int | None, plot_attention: int, plot_layer: int,
          write: bool, **given: Any) -> _Plan:
  """Load: the workdir's config and vocabulary, the steps and the inputs;
  `given`: the search settings given."""
  config, tokenizer = trained.load_workdir(workdir)
  search = _search_settings(config, workdir, **given)
  _check_plot_flags(config, plot_attention, plot_layer, write)
  steps = trained.choose_steps(workdir, checkpoint_step, average_last)
  split_name, sources, references = _read_inputs(
      config, workdir, split, source_file, reference_file)
  settings = {"split": split_name, **search.as_dict()}
  if source_file:  # the files' contents too: a path may hold other lines
    settings.update(source_file=source_file, reference_file=reference_file,
                    sources_sha256=_lines_sha256(sources),
                    references_sha256=_lines_sha256(references))
  return _Plan(config, tokenizer, sources, references, search, settings,
               steps)


def _lines_sha256(lines: list[str] | None) -> str | None:
  """The SHA-256 of `lines` as read (joined by newlines), None for none."""
  if lines is None:
    return None
  return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def _output_folder(workdir: str, plan: _Plan, output_dir: str | None,
                   write: bool, steps: Sequence[int]) -> str:
  """The folder of the results of `steps`; checked if `write`.

  Raises:
    EvalError: it holds the results of other settings
      (`eval_output.check_output_dir`).
  """
  settings = plan.settings
  folder = output_dir or eval_output.default_output_dir(
      workdir, settings["split"], steps,
      plan.search.suffix(SearchSettings.of_config(plan.config)))
  if write:
    eval_output.check_output_dir(
        folder, dict(settings, checkpoint_step=steps[-1],
                     averaged_steps=list(steps)))
  return folder


@dataclasses.dataclass(frozen=True)
class _Decoded:
  """A checkpoint's translations of a plan's sources, and their scores.

  Attributes:
    output: the folder of the results (claimed if they are written).
    result: `_score`'s metrics, and `translations`.
    model_config: the model that translated, deterministic.
    params: its parameters (NumPy).
    translations: the texts with their ids (`translate.Translations`).
  """
  output: str
  result: dict[str, Any]
  model_config: TransformerConfig
  params: Any
  translations: translate.Translations


class _Claims(contextlib.ExitStack):
  """The output folders an evaluation holds (`eval_output.claim`) until its
  results are written; calling it claims a folder once (nothing without
  `write`). A folder another evaluation writes, or one that cannot be
  written (a read-only workdir), is refused before any checkpoint is read
  or anything decoded."""

  def __init__(self, write: bool, workdir: str | None):
    super().__init__()
    self._write = write
    self._workdir = workdir  # None: the folder is the user's --output_dir
    self._claimed: set[str] = set()

  def __call__(self, path: str) -> None:
    if self._write and path not in self._claimed:
      self.enter_context(eval_output.claim(path, self._workdir))
      self._claimed.add(path)


def _decode(workdir: str, plan: _Plan, folder, claim: _Claims, *,
            checkpoint_step: int | None, average_last: int | None,
            batch_size: int, paper_bleu: bool, reference_tokenized: bool
            ) -> _Decoded:
  """Read the checkpoint(s), claim their folder, translate and score.

  Raises:
    Interrupted: a Ctrl-C (nothing has been written).
  """
  try:
    params, step, averaged = trained.load_params(workdir, checkpoint_step,
                                         average_last)
    trained.check_fit(plan.config, params, workdir, step)
    output = folder(averaged)  # the steps may have changed meanwhile
    claim(output)
    model_config = TransformerConfig.from_config(plan.config,
                                                 deterministic=True)
    settings = dict(plan.settings, checkpoint_step=step,
                    averaged_steps=averaged, batch_size=batch_size)
    translations = _translate(model_config, params, plan, settings)
    result = _score(plan, translations, settings, paper_bleu,
                    reference_tokenized)
  except KeyboardInterrupt:  # Ctrl-C before anything is written
    raise Interrupted("Interrupted (Ctrl-C) before the results were "
                      "written: nothing was written.") from None
  return _Decoded(output, result, model_config, params, translations)


def _attention_drawer(decoded: _Decoded, plan: _Plan, plot_attention: int,
                      plot_layer: int):
  """`eval_output.write_outputs`' draw function for --plot_attention (None
  if 0): the maps of the first sentences' translations, from their ids."""
  if not plot_attention:
    return None
  n = min(plot_attention, len(plan.sources))
  found = decoded.translations
  pairs = [None if source is None else (source, output) for source, output
           in zip(found.source_ids[:n], found.output_ids[:n])]

  def draw(staging: str) -> list[str]:
    return attention_maps.write_attention_maps(
        decoded.model_config, decoded.params, plan.tokenizer, pairs,
        os.path.join(staging, attention_maps.ATTENTION_DIR), layer=plot_layer)

  return draw


def _write_results(folder: str, result: dict[str, Any], draw) -> None:
  """Write: translations.txt, metrics.json and the drawn maps into `folder`.

  Adds `output_dir` (and `attention_maps`, the PNGs drawn) to `result`.
  """
  result["output_dir"] = folder
  metrics = {k: v for k, v in result.items()
             if k not in ("translations", "output_dir")}
  try:
    maps = eval_output.write_outputs(folder, result["translations"], metrics,
                                     draw)
  except OSError as e:  # a full disk: earlier results stay as they were
    raise EvalError(
        f"The results could not be written into {folder} ({os_reason(e)}); "
        "earlier results there are as they were: free space, or give "
        f"another {validation.setting('output_dir')}.") from None
  if draw is not None:
    result["attention_maps"] = maps
  logging.info("Wrote %s.", folder)


def evaluate(workdir: str, *, split: str | None = None,
             checkpoint_step: int | None = None,
             average_last: int | None = None,
             batch_size: int | None = None, source_file: str | None = None,
             reference_file: str | None = None, output_dir: str | None = None,
             write: bool = True, plot_attention: int = 0,
             plot_layer: int = -1, paper_bleu: bool = False,
             reference_tokenized: bool = False,
             **search: Any) -> dict[str, Any]:
  """Translates a split (or a file) with a workdir's checkpoint and scores it.

  Checks the flags; loads the workdir, chooses the steps, reads the
  sentences (`_plan`), checks the output folder (`_output_folder`) and
  claims it; reads the
  checkpoint(s), translates, scores (`_decode`); writes (`_write_results`).

  Args:
    workdir: a training workdir (config.json, spm.model, checkpoints/).
    split: dataset split (TFDS slicing allowed); default `test_split`.
    checkpoint_step: default the latest; average_last: average the last N
      checkpoints up to it.
    batch_size: sentences per batch; default `translate.batch_size_for`
      (64 for each accelerator).
    source_file, reference_file: one sentence a line, instead of a split
      ('-' = stdin); without references, no scores.
    output_dir: default `eval_output.default_output_dir`; write: write
      translations.txt and metrics.json there.
    plot_attention, plot_layer: draw the first N sentences' attention maps
      of a layer (0 = first, -1 = last) into `<output_dir>/attention/`.
    paper_bleu: also `bleu_paper` (`mha.scoring.paper_bleu`);
      reference_tokenized: `reference_file` is Moses-tokenized already
      (only compound-split).
    **search: fields of `mha.SearchSettings` (None: the config's; the
      paper: beam 4, alpha 0.6, outputs up to input + 50): beam_size (1 =
      greedy), alpha (finite, >= 0), max_decode_extra, beam_stop ("exact"
      or "early"), matmul_dtype ("float32" or "bfloat16"),
      no_repeat_ngram_size (0: off).

  Returns:
    The metrics written to metrics.json (`_score`), plus `translations`,
    `output_dir` (when written) and `attention_maps` (the PNGs written).

  Raises:
    mha.errors.UserError: bad input, named (EvalError: flags, steps, files,
      output folder; WorkdirError, DataError, CheckpointError: the workdir);
      Interrupted: a Ctrl-C before the results were written.
  """
  flags = dict(checkpoint_step=checkpoint_step, average_last=average_last,
               plot_attention=plot_attention, **search)
  _check_arguments(split, source_file, reference_file, paper_bleu,
                   reference_tokenized, batch_size=batch_size, **flags)
  plan = _plan(workdir, split, source_file, reference_file,
               plot_layer=plot_layer, write=write, **flags)
  batch_size = translate.batch_size_for(  # the results record it
      batch_size, beam_size=plan.search.beam_size)
  folder = functools.partial(_output_folder, workdir, plan, output_dir, write)
  with _Claims(write, None if output_dir else workdir) as claim:
    claim(folder(plan.steps))
    decoded = _decode(
        workdir, plan, folder, claim, checkpoint_step=checkpoint_step,
        average_last=average_last, batch_size=batch_size,
        paper_bleu=paper_bleu, reference_tokenized=reference_tokenized)
    if write:
      _write_results(decoded.output, decoded.result, _attention_drawer(
          decoded, plan, plot_attention, plot_layer))
  return decoded.result


def _translate(model_config: TransformerConfig, params: Any, plan: _Plan,
               settings: dict[str, Any]) -> translate.Translations:
  """Translate: the plan's sources with its search, in batches of
  `settings["batch_size"]` (`translate.translate_with_ids`: the texts,
  their ids and the time taken, compilation included)."""
  search = plan.search
  logging.info("Evaluating step(s) %s on %s (%d sentences), %s.",
               settings["averaged_steps"], settings["split"],
               len(plan.sources), search.describe())
  return translate.translate_with_ids(
      model_config, params, plan.tokenizer, plan.sources, search,
      batch_size=settings["batch_size"])


def _score(plan: _Plan, translations: translate.Translations,
           settings: dict[str, Any], paper_bleu: bool,
           reference_tokenized: bool = False) -> dict[str, Any]:
  """Score: the metrics of `translations`' texts, and `translations`.

  Returns:
    When there are references, the metrics of the table chosen
    (`metric_table.chosen`: those on by default, and `bleu_paper` with
    `paper_bleu`), each with its fields; `split`, `checkpoint_step`,
    `averaged_steps`, the search's settings (`SearchSettings`' fields),
    `batch_size`, `num_sentences`, `decode_seconds` (compilation
    included), `compile_seconds` (of it, preparing the searches:
    `translate.Translations`), `sentences_per_second` (and `source_file`,
    `reference_file` for a source file); `translations` (the texts).
  """
  hypotheses, seconds = translations.texts, translations.seconds
  result: dict[str, Any] = {}
  if plan.references is not None:
    result.update(metric_table.corpus_scores(
        hypotheses, plan.references, lang=plan.config.target_lang,
        references_tokenized=reference_tokenized,
        metrics=metric_table.chosen(paper_bleu=paper_bleu)))
  result.update({k: settings[k] for k in (
      "split", "checkpoint_step", "averaged_steps", *settings_lib.FIELDS,
      "batch_size")})
  n = len(hypotheses)
  result.update(num_sentences=n, decode_seconds=seconds,
                compile_seconds=translations.compile_seconds,
                sentences_per_second=n / max(seconds, 1e-9))
  if "source_file" in settings:
    result.update({k: settings[k] for k in (
        "source_file", "reference_file", "sources_sha256",
        "references_sha256")})
  result["translations"] = hypotheses
  return result
