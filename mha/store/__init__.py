"""What a run keeps in its workdir.

Modules: `workdir` (`Workdir`: every path of the layout, the lock,
config.json written, checked and loaded), `checkpoints` (the Orbax
manager, saving, restoring for training and the parameters for
evaluation, the steps to read), `checkpoint_checks` (a step checked whole
before it is read; damaged and deleted steps named), `failed_saves` (the
clean-up after a save the machine refused), `averaging` (the mean
parameters of several checkpoints), `metrics` (the log line, metrics.jsonl
and TensorBoard, console progress), `event_files` (TensorBoard event files
without TensorFlow), `trained` (a trained workdir read for use).
"""
