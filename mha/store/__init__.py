"""What a run keeps in its workdir.

Modules: `workdir` (`Workdir`: every path of the layout, the lock,
config.json written, checked and loaded), `checkpoints` (the Orbax
manager, params-only restore, checkpoint averaging), `metrics` (the log
line, metrics.jsonl and TensorBoard, console progress), `event_files`
(TensorBoard event files without TensorFlow).
"""
