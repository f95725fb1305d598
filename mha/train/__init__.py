"""Training: `train_and_evaluate(config, workdir)` and what it is made of.

Modules: `trainer` (the loop and its periodic actions, top to bottom),
`setup` (a run's set-up top to bottom: its inputs checked and loaded once,
the lock, resume or start, the loop's parts), `config_check` (a training
config checked before anything is written), `step` (the pure pmapped
train and eval steps), `actions` (the loop's actions: metrics window,
async save, profiler, signals), `evals` (evaluation during training as
plug-ins: dev loss, BLEU), `devices` (a batch split over devices; copies
for pmap), `warm_start` (`config.init_from`). Imports no module of
`mha.evaluation`.
"""
