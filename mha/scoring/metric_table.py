"""The one table of corpus metrics: what eval.py, `eval.py --follow` and the
in-training evaluation compute and report.

    from mha.scoring import metric_table
    metric_table.corpus_scores(hypotheses, references)["bleu"]

Each `Metric` of `METRICS` is a function of a `Corpus` (its `Score`: the
value and the fields written beside it, such as its signature) and how it
is reported:

* eval.py (`mha.evaluation.evaluator`) writes every metric chosen
  (`chosen`: those on by default, and the opt-in ones whose switch is
  given, `--paper_bleu`) into metrics.json, the value under the metric's
  name and its fields beside it, and prints them (`console_lines`);
* `eval.py --follow` (`mha.evaluation.follow`) writes each value into the
  run's TensorBoard and metrics.jsonl as `<evaluation>/<name>`;
* the in-training evaluation (`mha.train.evals`) reports those marked
  `in_training` as `eval_<name>`.

A new metric is one function (of a `Corpus`, giving a `Score`) and one
entry here: the three consumers read the table.
"""
import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

from mha.scoring import bleu
from mha.scoring import paper_bleu
from mha.scoring.corpus import Corpus
from mha.scoring.corpus import Score


@dataclasses.dataclass(frozen=True)
class Metric:
  """A corpus metric and how it is reported.

  Attributes:
    name: its key in metrics.json and the last part of its tags
      (`<evaluation>/<name>` of --follow, `eval_<name>` in training).
    compute: its `Score` of a `Corpus`.
    label: its name in eval.py's printed line.
    opt_in: the switch (`evaluator.evaluate`'s keyword, eval.py's flag)
      that asks for it; None: always computed.
    in_training: reported by the in-training evaluation too.
    shown: the field printed in parentheses after the value (its
      signature), or None.
    note: words printed after it in the parentheses, or None.
  """
  name: str
  compute: Callable[[Corpus], Score]
  label: str
  opt_in: str | None = None
  in_training: bool = False
  shown: str | None = None
  note: str | None = None


METRICS: tuple[Metric, ...] = (
    Metric("bleu", bleu.bleu, "BLEU", in_training=True,
           shown="sacrebleu_signature"),
    Metric("chrf", bleu.chrf, "chrF", in_training=True),
    Metric("bleu_paper", paper_bleu.bleu_paper, "Paper's BLEU",
           opt_in="paper_bleu", shown="bleu_paper_signature",
           note="for comparison with the paper only, quote sacreBLEU"),
)


def chosen(**switches: bool) -> tuple[Metric, ...]:
  """The metrics on by default and those whose `opt_in` switch is true,
  in the table's order.

  Raises:
    ValueError: a switch that asks for no metric.
  """
  known = {metric.opt_in for metric in METRICS} - {None}
  unknown = sorted(set(switches) - known)
  if unknown:
    raise ValueError(f"No metric is asked for by {', '.join(unknown)}; "
                     f"the switches are {', '.join(sorted(known))}.")
  return tuple(metric for metric in METRICS
               if metric.opt_in is None or switches.get(metric.opt_in))


def in_training() -> tuple[Metric, ...]:
  """The metrics the in-training evaluation reports, in the table's order."""
  return tuple(metric for metric in METRICS if metric.in_training)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], *,
                  lang: str | None = None, references_tokenized: bool = False,
                  metrics: Iterable[Metric] | None = None) -> dict[str, Any]:
  """The corpus scores of detokenized `hypotheses` against `references`.

  Args:
    hypotheses, references, lang, references_tokenized: the `Corpus`.
    metrics: those to compute; None: those on by default (`chosen()`).

  Returns:
    Each metric's value under its name, followed by its fields.

  Raises:
    ValueError: the lists have different lengths, or a metric lacks what it
      needs (the paper's BLEU: `lang`).
  """
  corpus = Corpus(hypotheses, references, lang, references_tokenized)
  scores: dict[str, Any] = {}
  for metric in chosen() if metrics is None else metrics:
    value, fields = metric.compute(corpus)
    scores[metric.name] = float(value)
    scores.update(fields)
  return scores


def console_lines(scores: Mapping[str, Any]) -> list[str]:
  """eval.py's lines of the metrics in `scores` (`corpus_scores`' fields).

  One line for the metrics on by default and one for those of each
  switch: each metric's label and value, then in parentheses the fields
  shown and the notes, e.g. `BLEU 27.31  chrF 56.02  (nrefs:1|...)`.
  """
  groups: dict[str | None, list[Metric]] = {}
  for metric in METRICS:
    if metric.name in scores:
      groups.setdefault(metric.opt_in, []).append(metric)
  lines = []
  for group in groups.values():
    line = "  ".join(f"{metric.label} {scores[metric.name]:.2f}"
                     for metric in group)
    said = [part for metric in group for part in (
        scores[metric.shown] if metric.shown else None, metric.note) if part]
    lines.append(f"{line}  ({'; '.join(said)})" if said else line)
  return lines
