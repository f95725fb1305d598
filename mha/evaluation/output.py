"""An evaluation's output folder: its name, its check, and writing it whole.

    <workdir>/eval/<split>[_avgN]_<step>[_beam<B>][_alpha<α>][_extra<E>][_early]/
      translations.txt   one line per source sentence
      metrics.json       the scores and the settings that made them
      attention/         the maps of --plot_attention
                         (mha.evaluation.attention_maps)

A folder holds the results of one evaluation: one whose metrics.json records
other settings (`SETTINGS_FIELDS`) is refused, never replaced, and so is an
existing folder that holds other files but no metrics.json (a user's
folder). The files are written into a local temporary folder first (beside
the folder, when that is local) and then moved into place by renames, or on
gs:// uploaded one by one through `mha.runtime.files`; metrics.json last, so
that a failed evaluation leaves earlier results as they were.

One evaluation writes a folder at a time: `claim` holds the lock
`.<name>.lock` beside it from before the checkpoints are read until the
results are written (a second evaluation into the same folder is refused
before it decodes), and removes the temporary folders that a killed
evaluation left there. Taking it is also the check that the folder can be
written at all (a read-only workdir), before anything is decoded.
"""
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from typing import Any, Callable, Iterator, Sequence

from mha.runtime import files
from mha import validation
from mha.store import workdir as workdir_lib
from mha.errors import EvalError
from mha.errors import UserError
from mha.errors import os_reason
from mha.search import settings as settings_lib

TRANSLATIONS_FILE = "translations.txt"
EVAL_METRICS_FILE = "metrics.json"
# metrics.json fields that say which results a folder holds.
SETTINGS_FIELDS = ("split", "checkpoint_step", "averaged_steps",
                   *settings_lib.FIELDS, "source_file", "reference_file",
                   "sources_sha256", "references_sha256")
# Fields metrics.json files written before them lack: not compared then.
RECORDED_SINCE = ("sources_sha256", "references_sha256")


def default_output_dir(workdir: str, split_name: str, steps: Sequence[int],
                       suffix: str = "") -> str:
  """`<workdir>/eval/<split>_<step>`, `<split>_avg<N>_<step>` for averages,
  followed by `suffix` (`mha.SearchSettings.suffix`); `split_name` is `file` for
  a source file, and reduced to file-name characters (`test[:4]`: `test_4`)."""
  name = files.safe_name(split_name).strip("_") or "split"
  if len(steps) > 1:
    name += f"_avg{len(steps)}"
  return workdir_lib.Workdir(workdir).eval_path(name, steps[-1]) + suffix


def check_output_dir(output_dir: str, settings: dict[str, Any]) -> None:
  """Refuses a folder whose metrics.json holds results of other settings.

  Args:
    output_dir: where the evaluation would write (a local path or gs://).
    settings: the `SETTINGS_FIELDS` of this evaluation (a search setting
      it does not give, or the metrics.json does not record, has its
      default, `settings_lib.DEFAULTS`: a setting that came later).

  Raises:
    EvalError: `output_dir` is a file, or holds a metrics.json that cannot be
      read or that records another value of a `SETTINGS_FIELDS` field.
  """
  if files.exists(output_dir) and not files.isdir(output_dir):
    raise EvalError(f"Output folder {output_dir} is a file.")
  path = os.path.join(output_dir, EVAL_METRICS_FILE)
  if not files.exists(path):
    if files.isdir(output_dir) and files.listdir(output_dir):
      raise EvalError(
          f"{validation.setting('output_dir')}={output_dir} holds files that "
          "are not the results "
          "of an evaluation (it has no metrics.json); eval.py never writes "
          "over them: give a new or empty folder.")
    return
  fix = (f"give another {validation.setting('output_dir')}, or delete "
         f"{output_dir} first")
  try:
    earlier = json.loads(files.read_bytes(path))
    if not isinstance(earlier, dict):
      raise ValueError("not a JSON object")
  except (OSError, ValueError) as e:
    raise EvalError(f"{path} cannot be read ({e}); eval.py does not replace "
                    f"it: {fix}.") from None
  recorded, given = ({k: d.get(k, settings_lib.DEFAULTS.get(k))
                       for k in SETTINGS_FIELDS} for d in (earlier, settings))
  differ = [f"{k} {recorded[k]!r}, not {given[k]!r}"
            for k in SETTINGS_FIELDS if recorded[k] != given[k] and not (
                k in RECORDED_SINCE and k not in earlier)]
  if differ:
    raise EvalError(f"{output_dir} holds the results of another evaluation "
                    f"({'; '.join(differ)}); eval.py never replaces them: "
                    f"{fix}.")


def _staging_prefix(output_dir: str) -> str:
  """The local temporary folders of `output_dir`'s writes start so."""
  parent, name = os.path.split(os.path.abspath(output_dir))
  return os.path.join(parent, f".{name}.tmp-")


class OutputLock(workdir_lib.WorkdirLock):
  """`.<name>.lock` beside an output folder: one evaluation writes it at a
  time (the workdir lock's atomic create and stale-lock take-over)."""

  def __init__(self, output_dir: str):
    parent, name = os.path.split(output_dir.rstrip("/"))
    super().__init__(output_dir, os.path.join(parent, f".{name}.lock"))

  def busy(self, holder: dict, same_host: bool) -> UserError:
    where = "" if same_host else f" on host {holder.get('host')}"
    gone = (f"; if it is gone, delete {self.path}" if not same_host else "")
    return EvalError(
        f"Another evaluation (process {holder.get('pid')}{where}, started "
        f"{holder.get('started')}) is writing {self.workdir} (lock "
        f"{self.path}): wait for it, or give another "
        f"{validation.setting('output_dir')}{gone}.")


@contextlib.contextmanager
def claim(output_dir: str, workdir: str | None = None) -> Iterator[None]:
  """Holds `output_dir`'s lock while the block runs (see the module doc).

  Creates the folder's parent if needed (and removes it again if it is
  left empty), takes the lock, and deletes the temporary folders of
  earlier writes into `output_dir` (only the lock's holder makes them, so
  any there were left by a killed evaluation).

  Args:
    output_dir: the results' folder (local or gs://).
    workdir: the workdir when `output_dir` is its default folder: a folder
      that cannot be written is then named as the workdir, with the fix
      (`--output_dir`).

  Raises:
    EvalError: another evaluation writes `output_dir`, or its parent
      cannot be written.
  """
  parent = os.path.dirname(output_dir.rstrip("/")) or "."
  created = not files.exists(parent)
  lock = OutputLock(output_dir)
  try:
    files.makedirs(parent)
    lock.acquire()
  except (OSError, workdir_lib.WorkdirError) as e:
    if created:
      _remove_empty(parent)
    if isinstance(e, EvalError):
      raise
    cause = e.__cause__ or e.__context__ or e
    reason = os_reason(cause) if isinstance(cause, OSError) else str(e)
    if workdir is not None:
      raise EvalError(
          f"Workdir {workdir} cannot be written ({reason}: {parent}): give "
          f"{validation.setting('output_dir')}=<a folder you can write> for "
          "the results.") from None
    raise EvalError(f"{validation.setting('output_dir')}={output_dir} cannot "
                    "be written "
                    f"({reason}: {parent}).") from None
  try:
    if not files.is_gcs(output_dir):
      prefix = _staging_prefix(output_dir)
      for name in os.listdir(parent):
        if os.path.join(parent, name).startswith(prefix):
          shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    yield
  finally:
    lock.release()
    if created:
      _remove_empty(parent)


def _remove_empty(parent: str) -> None:
  """Removes the folder `parent` that `claim` made, if it is empty."""
  with contextlib.suppress(OSError):
    files.rmdir_if_empty(parent)


def write_outputs(output_dir: str, translations: Sequence[str],
                  metrics: dict[str, Any],
                  draw: Callable[[str], list[str]] | None = None
                  ) -> list[str]:
  """Writes translations.txt and metrics.json (and `draw`'s files) at once.

  Everything is written into a new local folder first (beside `output_dir`:
  `.<name>.tmp-<random>`); a failure there leaves `output_dir` as it was.
  Then, locally, the new folder is renamed to `output_dir` if that does not
  exist, or its entries replace those of the same name in `output_dir` one
  by one, each by a rename. On gs://, where a folder cannot be renamed,
  each file is uploaded whole (an object appears at once). In both,
  metrics.json comes last, and other files in `output_dir` stay.

  Args:
    output_dir: the folder of the results (a local path or gs://).
    translations: one line each.
    metrics: written as JSON; a NaN or infinite value raises ValueError
      before anything is written.
    draw: optional function of a local folder that writes files there and
      returns their paths.

  Returns:
    The paths `draw` wrote, under `output_dir`.
  """
  text = json.dumps(metrics, indent=2, ensure_ascii=False, allow_nan=False)
  remote = files.is_gcs(output_dir)
  if remote:
    staging = tempfile.mkdtemp(prefix="mha_eval_")
  else:
    staging = _staging_prefix(output_dir) + uuid.uuid4().hex[:12]
    os.makedirs(staging)
  try:
    with open(os.path.join(staging, TRANSLATIONS_FILE), "w",
              encoding="utf-8") as f:
      f.writelines(t + "\n" for t in translations)
    drawn = draw(staging) if draw else []
    with open(os.path.join(staging, EVAL_METRICS_FILE), "w",
              encoding="utf-8") as f:
      f.write(text + "\n")
    (_upload if remote else _publish)(staging, output_dir)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return [os.path.join(output_dir, os.path.relpath(p, staging))
          for p in drawn]


def _metrics_last(names: list[str]) -> list[str]:
  return sorted(names, key=lambda n: n == EVAL_METRICS_FILE)


def _publish(staging: str, output_dir: str) -> None:
  """Moves `staging`'s entries into the local `output_dir` by renames."""
  if not os.path.exists(output_dir):
    os.rename(staging, output_dir)
    return
  for entry in _metrics_last(os.listdir(staging)):
    source = os.path.join(staging, entry)
    target = os.path.join(output_dir, entry)
    if os.path.isdir(source) and os.path.isdir(target):
      os.rename(target, os.path.join(staging, f"{entry}.old"))
    os.replace(source, target)


def _upload(staging: str, output_dir: str) -> None:
  """Copies `staging`'s files to gs:// `output_dir`, one upload each."""
  paths = [os.path.relpath(os.path.join(folder, name), staging)
           for folder, _, names in os.walk(staging) for name in names]
  for relative in _metrics_last(sorted(paths)):
    with open(os.path.join(staging, relative), "rb") as f:
      files.write_bytes_atomic(f"{output_dir.rstrip('/')}/{relative}",
                               f.read())
