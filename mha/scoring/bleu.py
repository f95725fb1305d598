"""sacreBLEU's corpus metrics of detokenized translations: BLEU and chrF.

    from mha.scoring import bleu
    value, fields = bleu.bleu(Corpus(hypotheses, references))

Each is a metric of `mha.scoring.metric_table` (which computes them for
eval.py, --follow and the in-training evaluation): a function of a
`Corpus` giving a `Score`. Both are corpus scores with one reference per
sentence, cased, with sacreBLEU's defaults (BLEU: the 13a tokenizer and
exponential smoothing), reported with their signatures. The paper's
tokenized, compound-split BLEU is `mha.scoring.paper_bleu`, beside this
module.
"""
import sacrebleu

from mha.scoring.corpus import Corpus
from mha.scoring.corpus import Score


def bleu(corpus: Corpus) -> Score:
  """sacreBLEU's BLEU (0-100), with `sacrebleu_signature` and
  `bleu_details` (sacreBLEU's line with the n-gram precisions and BP)."""
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(list(corpus.hypotheses),
                              [list(corpus.references)])
  signature = str(metric.get_signature())
  return Score(float(score.score), {
      "sacrebleu_signature": signature,
      "bleu_details": score.format(signature=signature)})


def chrf(corpus: Corpus) -> Score:
  """sacreBLEU's chrF (0-100), with `chrf_signature`."""
  metric = sacrebleu.metrics.CHRF()
  score = metric.corpus_score(list(corpus.hypotheses),
                              [list(corpus.references)])
  return Score(float(score.score),
               {"chrf_signature": str(metric.get_signature())})
