"""Metrics of a run: a log line, TensorBoard event files and
`<workdir>/metrics.jsonl`.

Each `write` logs `[step] name=value, ...` (names sorted, 6 significant
digits: the line clu's LoggingWriter wrote) on every process; only process
0 writes files. Each JSONL line is `{"step": k, "name": value, ...}`, one
line per `write` call.

metrics.jsonl is written through the file layer (`mha/runtime/files.py`), so a
gs:// workdir works: there each `write` rewrites the object with the new
line added (object stores do not append; the upload is conditioned on the
object being unchanged since it was read), which costs one download and one
upload per logged step. TensorBoard event files are written by
`mha/store/event_files.py` through the same file layer, without TensorFlow
(clu's writers import it, and with it TensorFlow's resident memory).
"""
import io
import json
import math
import time

from absl import logging

from mha.store import event_files
from mha.runtime import files
from mha.store import workdir as workdir_lib


class MetricsWriter:
  """Writes scalars to TensorBoard event files and to metrics.jsonl.

  Attributes:
    path: the JSONL file (None on processes other than 0).
  """

  def __init__(self, workdir: str, is_primary: bool = True):
    self._events = (event_files.EventFileWriter(workdir) if is_primary
                    else None)
    self.path = (workdir_lib.Workdir(workdir).metrics_path if is_primary
                 else None)
    # The lines this writer appended, kept until the run saves a
    # checkpoint (`forget_lines`): a run that fails before it does puts
    # the workdir back without them (`workdir.Snapshot.restore`).
    self.lines: list[bytes] | None = []

  def truncate_after(self, step: int) -> None:
    """Drops lines of steps > `step`: a resumed run rewrites them."""
    if self.path is None or not files.exists(self.path):
      return
    lines = _lines(self.path)
    torn = bool(lines) and not lines[-1].endswith("\n")
    if torn:
      # A run killed while appending leaves a torn last line: drop it.
      logging.warning("%s: dropping an incomplete last line %r", self.path,
                      lines[-1][:80])
      lines = lines[:-1]
    kept = [line for number, line in enumerate(lines, 1) if line.strip()
            and _parse(line, self.path, number)["step"] <= step]
    if torn or len(kept) != len(lines):
      files.write_bytes_atomic(self.path, "".join(kept).encode("utf-8"))

  def write(self, step: int, scalars: dict[str, float]) -> None:
    scalars = {k: float(v) for k, v in scalars.items()}
    logging.info("[%d] %s", step, ", ".join(
        f"{k}={v:.6g}" for k, v in sorted(scalars.items())))
    if self._events is not None:
      self._events.write_scalars(step, scalars)
    if self.path is not None:
      record = {"step": int(step), "time": time.time()}
      record.update({k: (v if math.isfinite(v) else str(v))
                     for k, v in scalars.items()})
      line = (json.dumps(record) + "\n").encode("utf-8")
      files.append_bytes(self.path, line)
      if self.lines is not None:
        self.lines.append(line)

  def forget_lines(self) -> None:
    """Stops keeping the lines written: a checkpoint of the run exists."""
    self.lines = None

  def write_hparams(self, hparams: dict) -> None:
    """The run's hyperparameters (numbers, strings, booleans) into its
    event file, for TensorBoard's HParams tab; process 0 only."""
    if self._events is not None:
      self._events.write_hparams(hparams)

  def flush(self) -> None:
    if self._events is not None:
      self._events.flush()

  def close(self) -> None:
    if self._events is not None:
      self._events.close()


def _lines(path: str) -> list[str]:
  """The lines of `path`, each with its '\\n' (the last may lack it)."""
  return io.StringIO(files.read_text(path), newline="\n").readlines()


def _parse(line: str, path: str, number: int) -> dict:
  """Line `number` of `path` as a record: a JSON object with an integer
  "step" (what `MetricsWriter.write` writes). Anything else is a ValueError
  naming the file and line: a record without a step cannot be placed on a
  curve or kept by a resume, and a string step would plot as a category."""
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}, line {number}: not a JSON record "
                     f"({e.msg}).") from None
  if not isinstance(record, dict):
    raise ValueError(f"{path}, line {number}: not a JSON record "
                     f"({json.dumps(record)[:40]} is not an object).")
  if "step" not in record:
    raise ValueError(f"{path}, line {number}: the record has no \"step\".")
  step = record["step"]
  if isinstance(step, bool) or not isinstance(step, int):
    raise ValueError(f"{path}, line {number}: \"step\" is "
                     f"{json.dumps(step)[:40]}, not an integer.")
  return record


def read_metrics(workdir: str) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl`, in order."""
  path = workdir_lib.Workdir(workdir).metrics_path
  if not files.exists(path):
    return []
  lines = _lines(path)
  return [_parse(line, path, number)
          for number, line in enumerate(lines, 1) if line.strip()]


class Progress:
  """A console line with the steps/s since the last report and the ETA."""

  def __init__(self, first_step: int, num_steps: int):
    self._num_steps = num_steps
    self._last_step = first_step
    self._last_time = time.perf_counter()

  def report(self, step: int, loss: float) -> float:
    now = time.perf_counter()
    rate = (step - self._last_step) / max(now - self._last_time, 1e-9)
    eta = (self._num_steps - step) / max(rate, 1e-9)
    logging.info("step %d/%d  loss %.4f  %.2f steps/s  ETA %s", step,
                 self._num_steps, loss, rate, _format_seconds(eta))
    self._last_step, self._last_time = step, now
    return rate


def _format_seconds(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
