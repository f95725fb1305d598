"""Corpus scores of translations, shared by eval.py and the in-training
evaluation.

Modules: `bleu` (sacreBLEU's BLEU and chrF of detokenized text),
`paper_bleu` (the paper's tokenized BLEU with compound splitting).
"""
