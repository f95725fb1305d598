"""Corpus scores of detokenized translations: sacreBLEU's BLEU and chrF.

    from mha.scoring import bleu as scoring
    scoring.score(hypotheses, references)["bleu"]

Used by the evaluator and by the trainer's in-training BLEU. The paper's
tokenized, compound-split BLEU is `mha.scoring.paper_bleu`, beside this module.
"""
from typing import Any, Sequence

import sacrebleu


def score(hypotheses: Sequence[str],
          references: Sequence[str]) -> dict[str, Any]:
  """sacreBLEU's BLEU and chrF of detokenized hypotheses, with signatures.

  Both are corpus scores with one reference per sentence, cased, BLEU with
  the default 13a tokenizer and exponential smoothing (sacrebleu defaults).

  Returns:
    `bleu`, `chrf` (0-100), `sacrebleu_signature`, `chrf_signature`, and
    `bleu_details` (sacrebleu's line with the n-gram precisions and BP).
  """
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} "
                     "references.")
  bleu = sacrebleu.metrics.BLEU()
  chrf = sacrebleu.metrics.CHRF()
  bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
  chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
  return {"bleu": float(bleu_score.score),
          "chrf": float(chrf_score.score),
          "sacrebleu_signature": str(bleu.get_signature()),
          "chrf_signature": str(chrf.get_signature()),
          "bleu_details": bleu_score.format(signature=str(
              bleu.get_signature()))}
