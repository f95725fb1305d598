"""What a corpus metric of `mha.scoring.metric_table` is given and gives.

    corpus = Corpus(hypotheses, references, lang="de")
    value, fields = bleu.bleu(corpus)  # a `Score`
"""
import dataclasses
from typing import NamedTuple, Sequence


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Translations to score, and what a metric may need besides them.

  Attributes:
    hypotheses: the system's translations, detokenized, one a sentence.
    references: their references, one a sentence.
    lang: the target language's code (the Moses rules of the paper's BLEU);
      None where it is not known.
    references_tokenized: the references are Moses-tokenized already (the
      paper's BLEU only compound-splits them).

  Raises:
    ValueError: the two lists have different lengths.
  """
  hypotheses: Sequence[str]
  references: Sequence[str]
  lang: str | None = None
  references_tokenized: bool = False

  def __post_init__(self):
    if len(self.hypotheses) != len(self.references):
      raise ValueError(f"{len(self.hypotheses)} hypotheses but "
                       f"{len(self.references)} references.")


class Score(NamedTuple):
  """A metric's corpus score.

  Attributes:
    value: the score, written under the metric's name.
    fields: what is written beside it (its signature, its details), by
      their names in metrics.json.
  """
  value: float
  fields: dict[str, str]
