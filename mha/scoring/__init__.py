"""Corpus scores of translations, shared by eval.py, `eval.py --follow` and
the in-training evaluation.

Modules: `metric_table` (the one table of metrics those three compute and
report, and `corpus_scores`), `corpus` (what a metric is given and gives),
`bleu` (sacreBLEU's BLEU and chrF of detokenized text), `paper_bleu` (the
paper's tokenized BLEU with compound splitting).
"""
