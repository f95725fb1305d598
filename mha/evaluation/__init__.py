"""Evaluation of a workdir's checkpoints (eval.py).

Modules: `evaluator` (check, load, translate, score, write), `output` (the
output folder: its name, the check against other settings' results, the
write through a temporary folder), `follow` (`eval.py --follow`: each new
checkpoint of a running trainer), `attention_maps` (attention weights of a
sentence pair, one PNG panel per head). Imports no module of `mha.train`.
"""
