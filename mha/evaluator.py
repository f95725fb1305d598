"""Evaluation of a workdir's checkpoints: beam search, detokenize, sacreBLEU.

    from mha import evaluator
    result = evaluator.evaluate("/tmp/run", average_last=5)
    result["bleu"], result["sacrebleu_signature"]

Follows §6.1 of the paper: beam size 4, length penalty α = 0.6, outputs of at
most input length + 50 tokens, optionally the average of the last
checkpoints. BLEU and chrF are sacrebleu's (cased, on detokenized text, the
13a tokenizer), with their signatures, never a hand-written BLEU. Evaluation
writes only into its own output folder.
"""
import json
import os
import re
import time
from typing import Any, Sequence

from absl import logging
import numpy as np
import sacrebleu

from mha import checkpoints
from mha import data
from mha import decoding
from mha import workdir as workdir_lib
from mha.transformer import TransformerConfig

EVAL_DIR = "eval"


class EvalError(ValueError):
  """Bad input to an evaluation: the message names the file, step or flag."""


def _bucket(n: int, multiple: int = 8) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def translate_texts(model_config: TransformerConfig, params: Any,
                    tokenizer: data.Tokenizer, sources: Sequence[str], *,
                    beam_size: int, alpha: float, max_decode_extra: int,
                    batch_size: int = 64) -> list[str]:
  """Detokenized translations of `sources`, in their order.

  Sentences are decoded longest first in batches of `batch_size`, padded to
  lengths and row counts rounded up to multiples of 8, so a split compiles
  the search a few times only. A source longer than the model's positions
  (`max_len`, EOS included) is truncated, with a warning.
  """
  if not sources:
    return []
  encoded = []
  truncated = 0
  for text in sources:
    ids = tokenizer.encode(text)[:model_config.max_len - 1] + [data.EOS_ID]
    truncated += len(tokenizer.encode(text)) + 1 > model_config.max_len
    encoded.append(ids)
  if truncated:
    logging.warning("%d source sentences were longer than max_len=%d "
                    "tokens and were truncated.", truncated,
                    model_config.max_len)
  order = np.argsort([-len(ids) for ids in encoded], kind="stable")
  translations: list[str] = [""] * len(sources)
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    length = min(_bucket(max(len(encoded[i]) for i in chunk)),
                 model_config.max_len)
    rows = np.zeros((_bucket(len(chunk)), length), np.int32)
    for row, i in enumerate(chunk):
      rows[row, :len(encoded[i])] = encoded[i]
    outputs = np.asarray(decoding.translate(
        model_config, params, rows, beam_size=beam_size, alpha=alpha,
        max_decode_extra=max_decode_extra, eos_id=data.EOS_ID))
    for row, i in enumerate(chunk):
      translations[i] = tokenizer.decode(outputs[row].tolist())
  return translations


def score(hypotheses: Sequence[str],
          references: Sequence[str]) -> dict[str, Any]:
  """sacreBLEU BLEU and chrF of detokenized hypotheses, with signatures."""
  bleu = sacrebleu.metrics.BLEU()
  chrf = sacrebleu.metrics.CHRF()
  bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
  chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
  return {"bleu": float(bleu_score.score),
          "chrf": float(chrf_score.score),
          "sacrebleu_signature": str(bleu.get_signature()),
          "chrf_signature": str(chrf.get_signature()),
          "bleu_details": str(bleu_score)}


def evaluate_bleu(model_config: TransformerConfig, params: Any,
                  tokenizer: data.Tokenizer, sources: Sequence[str],
                  references: Sequence[str], *, beam_size: int, alpha: float,
                  max_decode_extra: int, batch_size: int = 64
                  ) -> dict[str, float]:
  """BLEU, chrF and speed of translating `sources` (used during training)."""
  start = time.perf_counter()
  hypotheses = translate_texts(
      model_config, params, tokenizer, sources, beam_size=beam_size,
      alpha=alpha, max_decode_extra=max_decode_extra, batch_size=batch_size)
  seconds = time.perf_counter() - start
  scores = score(hypotheses, references)
  return {"bleu": scores["bleu"], "chrf": scores["chrf"],
          "decode_seconds": seconds,
          "sentences_per_second": len(sources) / max(seconds, 1e-9)}


def read_lines(path: str, what: str) -> list[str]:
  """Lines of a UTF-8 text file ('-' = standard input), without newlines."""
  try:
    if path == "-":
      import sys  # pylint: disable=g-import-not-at-top
      text = sys.stdin.read()
    else:
      with open(path, encoding="utf-8") as f:
        text = f.read()
  except FileNotFoundError:
    raise EvalError(f"{what} {path} does not exist.") from None
  except UnicodeDecodeError as e:
    raise EvalError(f"{what} {path} is not valid UTF-8: {e}.") from None
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # the newline that ends the last line
  return [line.rstrip("\r") for line in lines]


def load_params(workdir: str, checkpoint_step: int | None = None,
                average_last: int | None = None) -> tuple[Any, int, list[int]]:
  """(params, checkpoint step, averaged steps) of a workdir's checkpoints.

  Raises:
    EvalError: no checkpoint, an unknown step, or too few checkpoints.
  """
  try:
    if average_last:
      steps = checkpoints.all_steps(workdir)
      if checkpoint_step is not None:
        if checkpoint_step not in steps:
          raise EvalError(f"No checkpoint at step {checkpoint_step} in "
                          f"{checkpoints.checkpoint_dir(workdir)}; available: "
                          f"{steps}.")
        steps = [s for s in steps if s <= checkpoint_step]
      if len(steps) < average_last:
        raise EvalError(
            f"--average_last={average_last} but {workdir} holds "
            f"{len(steps)} checkpoint(s) up to that step: {steps}.")
      params, used = checkpoints.average_checkpoints(
          workdir, steps=steps[-average_last:])
      return params, max(used), list(used)
    params, step = checkpoints.restore_params(workdir, checkpoint_step)
    return params, step, [step]
  except (FileNotFoundError, ValueError) as e:
    if isinstance(e, EvalError):
      raise
    raise EvalError(str(e)) from None


def _safe(name: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def evaluate(workdir: str, *, split: str | None = None,
             checkpoint_step: int | None = None,
             average_last: int | None = None, beam_size: int | None = None,
             alpha: float | None = None, max_decode_extra: int | None = None,
             batch_size: int = 64, source_file: str | None = None,
             reference_file: str | None = None,
             output_dir: str | None = None,
             write: bool = True) -> dict[str, Any]:
  """Translates a split (or a file) with a workdir's checkpoint and scores it.

  Args:
    workdir: a training workdir (config.json, spm.model, checkpoints/).
    split: dataset split; default the config's `test_split`.
    checkpoint_step: default the latest.
    average_last: average the parameters of the last N checkpoints (up to
      `checkpoint_step` if given).
    beam_size, alpha, max_decode_extra: default the config's values.
    batch_size: sentences per decoding batch.
    source_file: plain text, one sentence a line, instead of a split.
    reference_file: its references (optional: without them no scores).
    output_dir: default `<workdir>/eval/<split>_<step>` (`..._avgN_<step>`
      for averages, `file_<step>` for files).
    write: write translations.txt and metrics.json.

  Returns:
    The metrics (also in `<output_dir>/metrics.json`) and `translations`.

  Raises:
    EvalError: bad input, with a message naming it.
  """
  if not os.path.isdir(workdir):
    raise EvalError(f"Workdir {workdir} does not exist.")
  try:
    config = workdir_lib.load_config(workdir)
  except FileNotFoundError as e:
    raise EvalError(str(e)) from None
  beam_size = config.beam_size if beam_size is None else beam_size
  alpha = config.alpha if alpha is None else alpha
  max_decode_extra = (config.max_decode_extra if max_decode_extra is None
                      else max_decode_extra)
  if beam_size < 1:
    raise EvalError(f"--beam_size must be >= 1, got {beam_size}.")
  if reference_file and not source_file:
    raise EvalError("--reference_file needs --source_file.")

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
    split_name = "file"
  else:
    split = split or config.test_split
    try:
      sources, references = data.load_text_pairs(config, split)
    except data.DataError as e:
      raise EvalError(str(e)) from None
    if not sources:
      raise EvalError(f"Split {split!r} of {config.dataset_name} is empty.")
    split_name = split

  params, step, averaged = load_params(workdir, checkpoint_step, average_last)
  tokenizer_path = os.path.join(workdir, data.tokenizer.MODEL_FILENAME)
  if not os.path.exists(tokenizer_path):
    raise EvalError(f"{tokenizer_path} does not exist: the workdir has no "
                    "vocabulary.")
  tokenizer = data.get_tokenizer(config, workdir)
  model_config = TransformerConfig.from_config(config, deterministic=True)

  start = time.perf_counter()
  hypotheses = translate_texts(
      model_config, params, tokenizer, sources, beam_size=beam_size,
      alpha=alpha, max_decode_extra=max_decode_extra, batch_size=batch_size)
  seconds = time.perf_counter() - start
  result: dict[str, Any] = {
      "split": split_name, "num_sentences": len(sources),
      "checkpoint_step": step, "averaged_steps": averaged,
      "beam_size": beam_size, "alpha": alpha,
      "max_decode_extra": max_decode_extra, "decode_seconds": seconds,
      "sentences_per_second": len(sources) / max(seconds, 1e-9),
  }
  if references is not None:
    result.update(score(hypotheses, references))
  if write:
    if output_dir is None:
      name = _safe(split_name)
      if len(averaged) > 1:
        name += f"_avg{len(averaged)}"
      output_dir = os.path.join(workdir, EVAL_DIR, f"{name}_{step}")
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "translations.txt"), "w",
              encoding="utf-8") as f:
      f.writelines(h + "\n" for h in hypotheses)
    with open(os.path.join(output_dir, "metrics.json"), "w") as f:
      json.dump(result, f, indent=2)
    result["output_dir"] = output_dir
  result["translations"] = hypotheses
  return result
