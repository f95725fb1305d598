"""Integrity checks of a checkpoint step, before and while it is read.

A step folder `<workdir>/checkpoints/<step>/` holds two items (written by
mha/store/checkpoints.py): `state` (the training state, an OCDBT store of
TensorStore arrays) and `meta` (a JSON dict).

Every read checks the step first (`verify`): the items' metadata files must
exist and every stored value of the items read must be readable in full (a
synchronous TensorStore read, so a truncated file is found before Orbax's
asynchronous restore, which would fail with a stack per array). A damaged
step raises `DamagedCheckpointError` naming `<workdir>/checkpoints/<step>`,
what is wrong and the newest intact earlier step, with the fix (the
reader's own step setting, `validation.use_step`: eval.py's
`--checkpoint_step`, mha-translate's `--step`, `mha.load`'s `step=`;
moving the step folder aside to resume training). A step deleted while it
is read (a running trainer keeps only the last `keep_checkpoints`) raises
`CheckpointNotFound` (`read_errors`), so that a reader can choose its steps
again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import contextlib
import json
import os
import re
import time
from typing import Literal

from etils import epath
import orbax.checkpoint as ocp
import tensorstore as ts

from mha import validation
from mha.errors import CheckpointError
from mha.errors import CheckpointNotFound
from mha.errors import DamagedCheckpointError
from mha.runtime import event_loops

STATE = 'state'
META = 'meta'
# Files without which an item cannot be restored (relative to a step folder).
REQUIRED_FILES = {
    STATE: ('state/_METADATA', 'state/manifest.ocdbt'),
    META: ('meta/metadata',),
}
# Orbax's JSON files that a read of the state parses (the step's
# metadata, the arrays' metadata and shardings; meta/metadata is checked
# by `_problem` itself).
_STATE_JSON_FILES = ('_CHECKPOINT_METADATA', 'state/_METADATA',
                     'state/_sharding')
# Values checked per synchronous TensorStore batch (bounds the memory held).
_CHECK_BATCH = 64
# Who reads: the fix a damaged-checkpoint message gives.
Purpose = Literal['train', 'eval']
_LOCAL_FILE_RE = re.compile(r'local file "([^"]+)"')


def verify(directory: str | os.PathLike[str], step: int,
           items: Sequence[str], purpose: Purpose,
           params_only: bool = False) -> None:
  """Checks that `items` of step `step` can be read whole (of the state,
  its parameters only with `params_only`), without restoring them.

  Raises:
    CheckpointNotFound: the step was deleted meanwhile.
    DamagedCheckpointError: a required file is missing, a JSON file is not
      valid JSON, or a stored value cannot be read.
  """
  directory = epath.Path(directory)
  problem = _problem(_step_path(directory, step), items, params_only)
  if problem is not None:
    raise _damaged(directory, step, problem, items, purpose, params_only)


@contextlib.contextmanager
def read_errors(directory: str | os.PathLike[str], steps: Sequence[int],
                items: Sequence[str], purpose: Purpose,
                params_only: bool = False,
                verified: bool = True) -> Iterator[None]:
  """Orbax's errors while reading `steps` as this project's errors.

  A step deleted meanwhile raises `CheckpointNotFound`: its folder is gone
  or, `verified` (`verify` found the items' required files just before),
  one of those files is (a trainer deletes a step's files first, then its
  folders, which may stay a while on a loaded machine); a TensorStore error
  (a status such as 'OUT_OF_RANGE: ...') on a step still there raises
  `DamagedCheckpointError`; anything else is a bug and propagates. Orbax's
  event loops made meanwhile end their pending reads before they close
  (`event_loops.draining`): a failed read leaves no TensorStore read to
  call back into a closed loop.
  """
  directory = epath.Path(directory)
  try:
    with event_loops.draining():
      yield
  except (FileNotFoundError, ValueError, KeyError, AttributeError) as e:
    paths = [_step_path(directory, step) for step in steps]
    paths += _step_of_missing_file(directory, e)
    gone = _deleted(paths)
    if gone is None and verified:
      gone = next((p for p in paths if any(
          not (p / name).exists() for item in items
          for name in REQUIRED_FILES[item])), None)
    if gone is not None:
      raise _deleted_error(gone) from None
    status = re.match(r'^[A-Z_]+: ', str(e))
    if not status or len(steps) != 1:
      raise
    raise _damaged(directory, steps[0], _describe(str(e), _step_path(
        directory, steps[0])), items, purpose, params_only) from None


def _step_path(directory: epath.Path, step: int) -> epath.Path:
  return directory / str(int(step))


def _step_of_missing_file(directory: epath.Path,
                          error: Exception) -> list[epath.Path]:
  """The step folder holding the file a `FileNotFoundError` names, when it
  lies under `directory`: Orbax's reader lists every step, not only those
  read, so a step a trainer deletes meanwhile may be any of them."""
  name = getattr(error, 'filename', None)
  if not isinstance(error, FileNotFoundError) or not name:
    return []
  relative = os.path.relpath(os.fspath(name), os.fspath(directory))
  first = relative.split(os.sep)[0]
  return [directory / first] if first.isdigit() else []


def _describe(error: str, step_dir: epath.Path) -> str:
  """A TensorStore error as 'file is truncated' or 'file cannot be read'."""
  match = _LOCAL_FILE_RE.search(error)
  name = (os.path.relpath(match[1], os.fspath(step_dir)) if match
          else 'a data file of state/')
  if error.startswith('OUT_OF_RANGE'):
    return f'{name} is truncated'
  return f"{name} cannot be read ({' '.join(error.split())[:200]})"


def _unreadable_value(step_dir: epath.Path, prefix: str) -> str | None:
  """Why a stored value of the state under `prefix` cannot be read, or None.

  Reads every value of the item's OCDBT store synchronously (TensorStore
  futures, no event loop), `_CHECK_BATCH` at a time.
  """
  state_dir = os.fspath(step_dir / STATE)
  if '://' in state_dir:
    return None  # not a local file: left to Orbax's own read
  try:
    # A spec, not a 'file://' URL: a '#' or '%' in the path is no URL syntax.
    store = ts.KvStore.open({'driver': 'ocdbt',
                             'base': {'driver': 'file',
                                      'path': state_dir + '/'}}).result()
    keys = [k for k in store.list().result()
            if k.decode('utf-8', 'replace').startswith(prefix)]
    if not keys:
      return f'state/ holds no {prefix.rstrip(".") or "values"}'
    for start in range(0, len(keys), _CHECK_BATCH):
      batch = keys[start:start + _CHECK_BATCH]
      for key, future in [(k, store.read(k)) for k in batch]:
        if future.result().state != 'value':
          return f"state/ lacks the value {key.decode('utf-8', 'replace')}"
  except ValueError as e:
    return _describe(str(e), step_dir)
  return None


def _problem(step_dir: epath.Path, items: Sequence[str],
             params_only: bool = False) -> str | None:
  """What is wrong with a step folder for reading `items`, or None."""
  for item in items:
    for name in REQUIRED_FILES[item]:
      if not (step_dir / name).exists():
        return f'{name} is missing'
  if META in items:
    try:
      json.loads((step_dir / REQUIRED_FILES[META][0]).read_text())
    except (OSError, ValueError) as e:
      return f'meta/metadata cannot be read as JSON ({e})'
  bad_json = _bad_json_file(step_dir, items)
  if bad_json is not None:
    return f'{bad_json} is not valid JSON'
  if STATE in items:
    return _unreadable_value(step_dir, 'params.' if params_only else '')
  return None


def _bad_json_file(step_dir: epath.Path, items: Sequence[str]) -> str | None:
  """The first of Orbax's JSON files that reading `items` of a local step
  parses and that is not valid JSON, as a path within the step; None if
  all are (or the step is not local)."""
  root = os.fspath(step_dir)
  if STATE not in items or '://' in root:
    return None
  for name in _STATE_JSON_FILES:
    try:
      with open(os.path.join(root, name), 'rb') as f:
        json.loads(f.read())
    except FileNotFoundError:
      continue  # not written by every Orbax version; required ones checked
    except (OSError, ValueError):
      return name
  return None


def _deleted(paths: Sequence[epath.Path]) -> epath.Path | None:
  """The first of `paths` that is gone, or goes within a moment (a deletion
  under way: Orbax removes an old step's files, then its folder), or None."""
  for attempt in range(6):
    if attempt:
      time.sleep(0.02)
    for path in paths:
      if not path.exists():
        return path
  return None


def _deleted_error(path: epath.Path) -> CheckpointNotFound:
  return CheckpointNotFound(
      f'Checkpoint {path} was deleted while it was read (a running train.py '
      'keeps only the last keep_checkpoints steps).')


def _newest_intact(directory: epath.Path, below: int, items: Sequence[str],
                   params_only: bool) -> int | None:
  """The newest step before `below` that `_problem` finds whole, or None.

  Steps without their metadata files are skipped at once; the first step
  that has them is read in full.
  """
  earlier = sorted((s for s in ocp.utils.checkpoint_steps(directory)
                    if s < below), reverse=True)
  for step in earlier:
    if _problem(_step_path(directory, step), items, params_only) is None:
      return step
  return None


def _damaged(directory: epath.Path, step: int, problem: str,
             items: Sequence[str], purpose: Purpose,
             params_only: bool = False) -> CheckpointError:
  """The error for a damaged step: a deleted one, or one naming the fix."""
  path = _step_path(directory, step)
  if _deleted([path]):
    return _deleted_error(path)
  intact = _newest_intact(directory, step, items, params_only)
  aside = f'mv {path} {directory.parent}/damaged_checkpoint_{step}'
  if purpose == 'eval':
    fix = (f'the newest intact checkpoint is step {intact}: '
           f'{validation.use_step(intact)}' if intact is not None
           else 'no earlier checkpoint is intact')
  elif intact is not None:
    fix = (f'the newest intact checkpoint is step {intact}: to resume from '
           f'it, move the damaged step out of {directory} ({aside}) and run '
           'train.py again')
  else:
    fix = (f'no earlier checkpoint is intact: move it out of {directory} '
           f'({aside}) to train from the start, or use another --workdir')
  return DamagedCheckpointError(
      f'Checkpoint {path} is damaged: {problem}; {fix}.', path, step, intact)
