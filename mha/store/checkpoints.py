"""Checkpoints: the Orbax manager, restoring for evaluation, averaging.

A workdir holds `checkpoints/<step>/` written by orbax-checkpoint's
`CheckpointManager`, each with two items:

* `state`: the training state, a pytree dict `{'params', 'opt_state', 'step',
  'rng'}` of host (NumPy) or jax arrays (the trainer hands over device arrays
  with one copy on the first local device of each process,
  `devices.checkpoint_arrays`; Orbax copies it to the host, once per
  process);
* `meta`: a JSON dict (data-loader position and other metadata).

Orbax writes each step in a temporary folder and renames it when complete, so
a step folder that exists was whole when written. Saves are asynchronous:
`save` returns once Orbax holds a host copy of the arrays (`wait=False`) and
the files are written by a background thread; the manager's next `save`, and
`wait_until_finished()` or `close()`, wait for that write first. `save` with
`wait=True` (the default) returns only once the step folder is final. The
paper averages the last 5 (base) or 20 (big) checkpoints for evaluation:
`resolve_steps` chooses them, `average_checkpoints` averages them.

Every read checks the step first: the items' metadata files must exist and
every stored value of the items read must be readable in full (a synchronous
TensorStore read, so a truncated file is found before Orbax's asynchronous
restore, which would fail with a stack per array). A damaged step raises
`DamagedCheckpointError` naming `<workdir>/checkpoints/<step>`, what is wrong
and the newest intact earlier step, with the fix (`--checkpoint_step` for
evaluation; moving the step folder aside to resume training). A step deleted
while it is read (a running trainer keeps only the last `keep_checkpoints`)
raises `CheckpointNotFound`, so that a reader can choose its steps again.

A save the machine refuses (a full disk, a read-only folder) fails in one
of Orbax's background threads and leaves the others waiting for it:
`save_failure` ends them, removes the step's temporary folder and returns a
`CheckpointSaveError` naming the step, what was refused and the last good
checkpoint; `quiet_save_errors` keeps Orbax's stacks of it out of the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
import contextlib
import errno
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
import warnings
from typing import Any, Literal

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from mha.runtime import files
from mha.store import workdir as workdir_lib
from mha.errors import CheckpointError
from mha.errors import CheckpointNotFound
from mha.errors import CheckpointSaveError
from mha.errors import ConfigError
from mha.errors import DamagedCheckpointError
from mha.errors import os_errno
from mha.errors import os_reason
from mha.errors import TooFewCheckpoints

PyTree = Any

CHECKPOINTS_SUBDIR = workdir_lib.CHECKPOINTS_DIR  # the name: mha/store/workdir.py
STATE = 'state'
META = 'meta'
# Files without which an item cannot be restored (relative to a step folder).
REQUIRED_FILES = {
    STATE: ('state/_METADATA', 'state/manifest.ocdbt'),
    META: ('meta/metadata',),
}
# Values checked per synchronous TensorStore batch (bounds the memory held).
_CHECK_BATCH = 64
# Who reads: the fix a damaged-checkpoint message gives.
Purpose = Literal['train', 'eval']


def checkpoint_dir(workdir: str | os.PathLike[str]) -> epath.Path:
  """`<workdir>/checkpoints`, absolute (Orbax refuses relative paths)."""
  path = epath.Path(workdir)
  if not path.is_absolute() and not files.has_scheme(os.fspath(workdir)):
    path = epath.Path(os.path.abspath(os.fspath(workdir)))
  return path / CHECKPOINTS_SUBDIR


SCHEDULED = 'scheduled'  # the meta key: saved on the run's schedule


class LatestScheduled:
  """Orbax's preservation policy of the trainer's manager: the last `n`
  checkpoints saved on the run's schedule, and the latest checkpoint
  whatever it is.

  A checkpoint's meta says whether it was scheduled (`SCHEDULED`: every
  `checkpoint_every_steps` and the run's last step) or saved because the
  run was stopped (a preemption's SIGTERM, a Ctrl-C); one without the key
  (saved by other code, or before the key existed) counts as scheduled. A
  stop's checkpoint is kept while it is the latest, for the run to resume
  from, and deleted at the next save; it never displaces a scheduled one,
  so the last N averaged (`resolve_steps`) are the schedule's, as the
  paper's (written at fixed intervals), preempted or not.

  This run's saves tell the policy through Orbax's in-memory checkpoint
  metrics (`save`: the newest step's files are still being written when
  Orbax asks); earlier runs' checkpoints, through their meta files, read
  once each.
  """

  def __init__(self, n: int, directory: epath.Path):
    self.n = n
    self.directory = directory
    self._read: dict[int, bool] = {}

  def scheduled(self, info: Any) -> bool:
    """Whether checkpoint `info` (an Orbax `PolicyCheckpointInfo`) was
    saved on the schedule."""
    if info.metrics and SCHEDULED in info.metrics:
      return bool(info.metrics[SCHEDULED])
    if info.step not in self._read:
      self._read[info.step] = _meta_says_scheduled(self.directory, info.step)
    return self._read[info.step]

  def should_preserve(self, checkpoints: Sequence[Any], *,
                      context: Any = None) -> list[bool]:
    del context  # Orbax's PreservationContext: nothing this policy needs
    latest = max((c.step for c in checkpoints), default=None)
    kept = {latest, *sorted(c.step for c in checkpoints
                            if self.scheduled(c))[-self.n:]}
    return [c.step in kept for c in checkpoints]


def _meta_says_scheduled(directory: epath.Path, step: int) -> bool:
  """A finished checkpoint's meta `SCHEDULED` (True where absent or
  unreadable: a checkpoint is deleted early only when it says so)."""
  try:
    meta = json.loads(
        (directory / str(step) / REQUIRED_FILES[META][0]).read_text())
  except (OSError, ValueError):
    return True
  return bool(meta.get(SCHEDULED, True)) if isinstance(meta, dict) else True


def make_manager(workdir: str | os.PathLike[str],
                 keep: int) -> ocp.CheckpointManager:
  """A manager of `<workdir>/checkpoints` that keeps the last `keep` steps
  (of those saved on the run's schedule, and the latest: `LatestScheduled`).

  Args:
    workdir: the run's folder (created if needed).
    keep: the scheduled checkpoints kept (>= 1), besides the latest; older
      ones are deleted after each save (`LatestScheduled`).

  Returns:
    An `ocp.CheckpointManager` for the `state` and `meta` items; use it with
    `save` and `restore` (all processes must call them in multi-host runs)
    and `close()` it at the end.
  """
  if keep < 1:
    raise ValueError(f'keep must be >= 1, got {keep}.')
  directory = checkpoint_dir(workdir)
  options = ocp.CheckpointManagerOptions(
      create=True,
      # `max_to_keep` is deprecated in favour of preservation policies.
      preservation_policy=LatestScheduled(keep, directory),
  )
  return ocp.CheckpointManager(directory, options=options,
                               item_names=(STATE, META))


def save(manager: ocp.CheckpointManager, step: int, state: PyTree,
         meta: dict[str, Any], force: bool = False, wait: bool = True) -> bool:
  """Writes `state` and `meta` as checkpoint `step`.

  Waits first for the manager's previous save to be written (Orbax does).

  Args:
    manager: from `make_manager`.
    step: the training step.
    state: pytree of arrays (host NumPy, or jax arrays: Orbax copies them to
      the host before `save` returns, so they may be changed or deleted
      afterwards).
    meta: JSON-serialisable dict; `SCHEDULED: False` marks a save off the
      run's schedule, kept only while it is the latest (`LatestScheduled`).
    force: save even if the manager's save policy would skip this step.
    wait: return only once the step folder is final (renamed from its
      temporary name); False returns once the arrays are copied and leaves
      the write to a background thread: call `manager.wait_until_finished()`
      (or `close()`) before the process exits or reads the step.

  Returns:
    Whether a checkpoint was written (or, with `wait=False`, started).

  Raises:
    ValueError: if checkpoint `step` already exists (Orbax never overwrites).
  """
  saved = manager.save(
      int(step),
      args=ocp.args.Composite(**{
          STATE: ocp.args.StandardSave(state),
          META: ocp.args.JsonSave(meta),
      }),
      # Not written (no best_fn): what `LatestScheduled` reads of this save.
      metrics={SCHEDULED: float(meta.get(SCHEDULED, True))},
      force=force)
  if wait:
    # Blocks until the step folder is finalised (renamed from its temporary
    # name), so a kill afterwards cannot lose it.
    manager.wait_until_finished()
  return saved


def _release_waiting_threads(timeout: float = 30.0) -> None:
  """Ends Orbax's background threads still waiting for a failed save.

  Orbax 0.12.8 runs each part of a save in a thread that first waits for
  a signal from the previous part ("the step folder is created", "the
  arrays are written"). When a part fails (the folder cannot be created
  on a read-only or full disk) its signal never comes and the threads
  after it wait out the coordination timeout (minutes), and as they are
  not daemon threads the process cannot exit meanwhile. Each waiting
  thread is cancelled, then the signal it waits for is sent: it wakes,
  sees the cancellation and returns without running its part.
  (`_SignalingThread`, its `_receive_signals` and `_operation_id` are
  Orbax internals; a thread of another form is left alone.)
  """
  # pylint: disable=protected-access
  from orbax.checkpoint._src.futures import future as orbax_future  # pylint: disable=g-import-not-at-top
  waiting = [t for t in threading.enumerate()
             if isinstance(t, orbax_future._SignalingThread) and t.is_alive()
             and hasattr(t, '_receive_signals')]
  if waiting:
    # Their parts' coroutines are never run: Python would warn of each at
    # exit ("coroutine ... was never awaited").
    warnings.filterwarnings('ignore', r'coroutine .* was never awaited',
                            RuntimeWarning)
  for thread in waiting:
    thread.cancel()
    orbax_future.set_signals(thread._receive_signals,
                             operation_id=thread._operation_id)
  for thread in waiting:
    threading.Thread.join(thread, timeout)


def _remove_temporary(directory: epath.Path, step: int) -> None:
  """Deletes what a failed save of `step` left under its temporary name
  (`<step>.orbax-checkpoint-tmp...`): on a full disk, that space."""
  prefix = f'{int(step)}.orbax-checkpoint-tmp'
  with contextlib.suppress(OSError):
    for path in directory.iterdir():
      if path.name.startswith(prefix):
        if '://' in os.fspath(path):
          path.rmtree(missing_ok=True)
        else:
          shutil.rmtree(os.fspath(path), ignore_errors=True)


def save_failure(manager: ocp.CheckpointManager, step: int,
                 error: BaseException) -> CheckpointSaveError | None:
  """Cleans up after the failed save of `step`; the error to raise instead.

  Orbax's threads left waiting are ended (`_release_waiting_threads`, so
  the process can exit) and the step's temporary folder is deleted; the
  finalised steps are left as they are.

  Args:
    manager: the manager whose save failed.
    step: the step being saved.
    error: what Orbax raised (an OSError, or TensorStore's ValueError).

  Returns:
    A `CheckpointSaveError` naming the step, the folder, what the machine
    refused ('the disk is full', 'the file system is read-only') and the
    newest checkpoint to resume from; None if `error` is not the machine's
    (a bug: the caller re-raises it).
  """
  _release_waiting_threads()
  # The failed part's sibling writes fail too; asyncio reports each one
  # nobody awaited ("exception was never retrieved", with its stack) when
  # it is collected, at the latest at exit: the error raised here says it.
  logging.getLogger('asyncio').addFilter(_NEVER_RETRIEVED)
  _SAVE_FAILED.set()
  _drop_closed_loop_reports()
  directory = epath.Path(manager.directory)
  _remove_temporary(directory, step)
  code = os_errno(error)
  if code is None:
    return None
  last = latest_step_or_none(directory)
  return CheckpointSaveError(
      f'Checkpoint {step} could not be written into {directory}: '
      f'{os_reason(error)}. Training stopped; '
      f'{resume_advice(directory, last, code)}.', step, last)


def latest_step_or_none(directory: epath.Path) -> int | None:
  """The newest finalised step in the checkpoints folder `directory`; None
  if there is none or the folder cannot be listed."""
  try:
    steps = sorted(ocp.utils.checkpoint_steps(directory))
  except OSError:
    return None
  return steps[-1] if steps else None


def resume_advice(folder: str | os.PathLike[str], last: int | None,
                  code: int | None) -> str:
  """What to do after a write refused with errno `code` in `folder`:
  free space (ENOSPC, EDQUOT) or make it writable, then resume from step
  `last` (None: train from the start)."""
  fix = ('free space on its disk' if code in (errno.ENOSPC, errno.EDQUOT)
         else f'make {os.fspath(folder)} writable')
  if last is None:
    return (f'no checkpoint was written before: {fix} and run train.py '
            'again (it starts from step 0)')
  return (f'the last good checkpoint is step {last}: {fix} and run '
          'train.py again to resume from it')


class _WithoutOrbaxStacks(logging.Filter):
  """Drops Orbax's error records of a write the machine refused (an
  OSError, or TensorStore's error with an errno): the failed save they
  report reaches the trainer as an exception too (`save_failure`). Other
  errors of Orbax are kept, with their stacks."""

  def __init__(self):
    super().__init__()
    self._root = os.path.dirname(ocp.__file__)

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not (error is not None and record.levelno >= logging.ERROR and
                record.pathname.startswith(self._root) and
                os_errno(error) is not None)


class _NeverRetrieved(logging.Filter):

  def filter(self, record: logging.LogRecord) -> bool:
    return 'exception was never retrieved' not in str(record.msg)


_NEVER_RETRIEVED = _NeverRetrieved()
_SAVE_FAILED = threading.Event()  # set by `save_failure`


def _closed_loop_report(unraisable: Any) -> bool:
  """Whether an unraisable exception is a call into an asyncio loop
  that is closed ('Event loop is closed')."""
  error = unraisable.exc_value
  return isinstance(error, RuntimeError) and str(error) == (
      'Event loop is closed')


def _drop_closed_loop_reports() -> Any:
  """From now on, Python does not print the calls into a closed asyncio
  loop that nobody could catch (`sys.unraisablehook`); every other
  unraisable exception goes to the hook as before. Returns the hook put
  in (its `previous`: the hook it passes the others to), or None if one
  was there already.

  When a save fails, the sibling writes of the failed part still end on
  TensorStore's threads, and each tells Orbax's asyncio loop, which Orbax
  has closed: Python printed each as a stack of 6 lines, dozens of them
  (66 for one full disk), from the background save's failure on, before
  the one line of the error raised instead (`save_failure`).
  """
  previous = sys.unraisablehook
  if getattr(previous, 'drops_closed_loop_reports', False):
    return None

  def hook(unraisable: Any) -> None:
    if not _closed_loop_report(unraisable):
      previous(unraisable)

  hook.drops_closed_loop_reports = True
  hook.previous = previous
  sys.unraisablehook = hook
  return hook


@contextlib.contextmanager
def quiet_save_errors() -> Iterator[None]:
  """While the block runs, Orbax's background threads log no stacks for a
  failed save (about 300 to 1,250 lines for one full disk), and Python
  prints none of their calls into Orbax's closed asyncio loop
  (`_drop_closed_loop_reports`; after a failed save, until the end of the
  process)."""
  quiet = _WithoutOrbaxStacks()
  logger = logging.getLogger('absl')
  logger.addFilter(quiet)
  hook = _drop_closed_loop_reports()
  try:
    yield
  finally:
    logger.removeFilter(quiet)
    # After a failed save the reports go on until the process ends.
    if (hook is not None and sys.unraisablehook is hook
        and not _SAVE_FAILED.is_set()):
      sys.unraisablehook = hook.previous


def restore(manager: ocp.CheckpointManager, step: int | None,
            target_state: PyTree, purpose: Purpose = 'train'
            ) -> tuple[PyTree, dict[str, Any]]:
  """Restores checkpoint `step` (None: the latest) into `target_state`'s form.

  Args:
    manager: from `make_manager`.
    step: the step to restore, or None for the latest.
    target_state: a pytree with the structure, shapes and dtypes to restore
      (real arrays or `jax.ShapeDtypeStruct`s); jax arrays come back with the
      target's sharding, NumPy arrays as NumPy.
    purpose: the fix a damaged step's message gives ('train': move the step
      aside and resume from the newest intact one).

  Returns:
    `(state, meta)`.

  Raises:
    CheckpointNotFound: no checkpoint, or no checkpoint `step`.
    DamagedCheckpointError: the step's files are missing or unreadable.
  """
  directory = manager.directory
  steps = sorted(manager.all_steps())
  step = _check_step(directory, steps, step)
  _verify(directory, step, (STATE, META), purpose)
  with _read_errors(directory, [step], (STATE, META), purpose):
    restored = manager.restore(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.StandardRestore(target_state),
            META: ocp.args.JsonRestore(),
        }))
  mismatch = first_mismatch(restored[STATE], target_state)
  if mismatch:
    raise ConfigError(
        f"Checkpoint {step} in {directory} does not fit the config's model: "
        f"{mismatch}. Give the config the checkpoint was trained with.")
  return restored[STATE], restored[META]


def param_path_name(path) -> str:
  """'params/encoder/.../kernel': a pytree path's keys joined by '/'."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def first_mismatch(loaded: PyTree, target: PyTree) -> str | None:
  """A sentence naming the first array of `loaded` (a checkpoint's) whose
  path or shape is not `target`'s (the model's), parameters first; None
  if they fit."""
  have = {param_path_name(p): np.shape(x) for p, x in
          jax.tree_util.tree_flatten_with_path(loaded)[0]}
  want = {param_path_name(p): np.shape(x) for p, x in
          jax.tree_util.tree_flatten_with_path(target)[0]}
  for name in sorted(want, key=lambda n: not n.startswith("params/")):
    if name not in have:
      return (f"the model's parameter {name} {want[name]} is not in the "
              "checkpoint")
    if have[name] != want[name]:
      return (f"parameter {name} has shape {have[name]} in the checkpoint "
              f"but {want[name]} in the model")
  extra = sorted(set(have) - set(want))
  if extra:
    return f"the checkpoint's parameter {extra[0]} is not in the model"
  return None


def all_steps(workdir: str | os.PathLike[str]) -> list[int]:
  """The finalised checkpoint steps in `<workdir>/checkpoints`, ascending."""
  return sorted(ocp.utils.checkpoint_steps(checkpoint_dir(workdir)))


def check_step(workdir: str | os.PathLike[str], step: int | None = None,
               purpose: Purpose = 'train') -> int:
  """Checks that checkpoint `step` (None: the latest) can be restored whole,
  without restoring it: for a caller that must refuse before writing.

  Returns:
    The step.

  Raises:
    CheckpointNotFound: no checkpoint, or no checkpoint `step`.
    DamagedCheckpointError: as `restore`.
  """
  directory = checkpoint_dir(workdir)
  step = _check_step(directory, all_steps(workdir), step)
  _verify(directory, step, (STATE, META), purpose)
  return step


def resolve_steps(workdir: str | os.PathLike[str], step: int | None = None,
                  num_last: int = 1) -> list[int]:
  """The steps one evaluation reads: the last `num_last` checkpoints up to
  `step` (None: the latest), ascending, chosen without reading them.

  `num_last=1` is the one checkpoint `step`; more is the paper's average of
  the last N checkpoints (5 for the base model, 20 for the big one).

  Raises:
    ValueError: `num_last` < 1.
    CheckpointNotFound: no checkpoint, or no checkpoint `step` (the message
      names the folder and lists the available steps).
    TooFewCheckpoints: fewer than `num_last` checkpoints up to `step`.
  """
  if num_last < 1:
    raise ValueError(f'num_last must be >= 1, got {num_last}.')
  directory = checkpoint_dir(workdir)
  available = all_steps(workdir)
  step = _check_step(directory, available, step)
  upto = [s for s in available if s <= step]
  if len(upto) < num_last:
    raise TooFewCheckpoints(directory, step, upto, num_last)
  return upto[-num_last:]


def latest_step(workdir: str | os.PathLike[str]) -> int | None:
  """The latest finalised checkpoint step, or None if there is none."""
  steps = all_steps(workdir)
  return steps[-1] if steps else None


def _check_step(directory: epath.Path, steps: Sequence[int],
                step: int | None) -> int:
  if not steps:
    raise CheckpointNotFound(
        f'No checkpoint in {directory}: expected step folders '
        f'{directory}/<step>/ written by training.')
  if step is None:
    return steps[-1]
  if int(step) not in steps:
    raise CheckpointNotFound(
        f'No checkpoint for step {step} in {directory}; available steps: '
        f'{list(steps)}.')
  return int(step)


def _step_path(directory: epath.Path, step: int) -> epath.Path:
  return directory / str(int(step))


_LOCAL_FILE_RE = re.compile(r'local file "([^"]+)"')


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
    fix = (f'the newest intact checkpoint is step {intact}: evaluate it with '
           f'--checkpoint_step={intact}' if intact is not None
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


def _verify(directory: epath.Path, step: int, items: Sequence[str],
            purpose: Purpose, params_only: bool = False) -> None:
  """Raises `_damaged`'s error if `_problem` finds one in step `step`."""
  problem = _problem(_step_path(directory, step), items, params_only)
  if problem is not None:
    raise _damaged(directory, step, problem, items, purpose, params_only)


@contextlib.contextmanager
def _read_errors(directory: epath.Path, steps: Sequence[int],
                 items: Sequence[str], purpose: Purpose,
                 params_only: bool = False) -> Iterator[None]:
  """Orbax's errors while reading `steps` as this module's errors.

  A step deleted meanwhile raises `CheckpointNotFound`; a TensorStore error
  (a status such as 'OUT_OF_RANGE: ...') on a step still there raises
  `DamagedCheckpointError`; anything else is a bug and propagates.
  """
  try:
    yield
  except (FileNotFoundError, ValueError, KeyError, AttributeError) as e:
    gone = _deleted([_step_path(directory, step) for step in steps])
    if gone is not None:
      raise _deleted_error(gone) from None
    status = re.match(r'^[A-Z_]+: ', str(e))
    if not status or len(steps) != 1:
      raise
    raise _damaged(directory, steps[0], _describe(str(e), _step_path(
        directory, steps[0])), items, purpose, params_only) from None


# Orbax's JSON files that a read of the state parses (the step's
# metadata, the arrays' metadata and shardings; meta/metadata is checked
# by `_problem` itself).
_STATE_JSON_FILES = ('_CHECKPOINT_METADATA', 'state/_METADATA',
                     'state/_sharding')


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


@contextlib.contextmanager
def _reader(workdir: str | os.PathLike[str], steps: Sequence[int],
            items: Sequence[str], purpose: Purpose
            ) -> Iterator[ocp.CheckpointManager]:
  """A manager that reads items without knowing their targets in advance.

  Orbax lists and reads the steps' metadata when it is made: a step deleted
  meanwhile raises `CheckpointNotFound` (`_read_errors`).
  """
  directory = checkpoint_dir(workdir)
  with _read_errors(directory, steps, items, purpose):
    reader = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(create=False),
        item_handlers={
            STATE: ocp.PyTreeCheckpointHandler(),
            META: ocp.JsonCheckpointHandler(),
        })
  with reader:
    yield reader


def _read_params(reader: ocp.CheckpointManager, step: int,
                 purpose: Purpose) -> PyTree:
  """Reads only `state['params']` of `step`, as NumPy arrays.

  Raises:
    CheckpointNotFound: the step was deleted while it was read.
    DamagedCheckpointError: its state cannot be read.
  """
  directory = epath.Path(reader.directory)
  _verify(directory, step, (STATE,), purpose, params_only=True)
  with _read_errors(directory, [step], (STATE,), purpose, params_only=True):
    metadata = reader.item_metadata(step)[STATE].tree['params']
    target = {'params': jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)}
    restore_args = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    restored = reader.restore(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.PyTreeRestore(item=target,
                                          restore_args=restore_args,
                                          partial_restore=True),
        }))
  return restored[STATE]['params']


def restore_params(workdir: str | os.PathLike[str], step: int | None = None,
                   purpose: Purpose = 'eval') -> tuple[PyTree, int]:
  """The parameters of one checkpoint, for evaluation.

  Only `params` are read (Orbax partial restore), not the optimizer state.

  Args:
    workdir: the run's folder.
    step: the checkpoint step; None = the latest.
    purpose: the fix a damaged step's message gives ('eval':
      `--checkpoint_step` of the newest intact step).

  Returns:
    `(params, step)`, params as NumPy arrays with their saved dtypes.

  Raises:
    CheckpointNotFound: no checkpoint in the workdir (names the folder), no
      checkpoint `step` (lists the available steps), or the step was deleted
      while it was read.
    DamagedCheckpointError: the step's state cannot be read.
  """
  step = _check_step(checkpoint_dir(workdir), all_steps(workdir), step)
  with _reader(workdir, [step], (STATE,), purpose) as reader:
    return _read_params(reader, step, purpose), step


def read_meta(workdir: str | os.PathLike[str], step: int | None = None,
              purpose: Purpose = 'eval') -> dict[str, Any]:
  """The JSON saved beside checkpoint `step` (None: the latest): `step`,
  `data_position` (micro-batches read), `grad_accum_steps`, `scheduled`
  (`LatestScheduled`; absent before it existed).

  Raises:
    CheckpointNotFound, DamagedCheckpointError: as `restore_params`.
  """
  directory = checkpoint_dir(workdir)
  step = _check_step(directory, all_steps(workdir), step)
  _verify(directory, step, (META,), purpose)
  with _reader(workdir, [step], (META,), purpose) as reader:
    with _read_errors(directory, [step], (META,), purpose):
      restored = reader.restore(
          step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
  return dict(restored[META])


def _is_float(dtype: np.dtype) -> bool:
  # jnp counts bfloat16 (ml_dtypes) as floating, NumPy's issubdtype does not.
  return bool(jnp.issubdtype(dtype, jnp.inexact))


def _float_accumulator(dtype: np.dtype) -> type:
  return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def average_params(trees: Iterable[PyTree]) -> PyTree:
  """The element-wise mean of parameter trees of identical structure.

  Floating leaves are summed in float32 (float64 for float64 leaves), divided,
  and cast back to their dtype; other leaves (e.g. integer counters) must be
  equal in every tree. Trees are consumed one at a time, so an iterator of
  restored checkpoints needs memory for two trees only.

  Args:
    trees: parameter pytrees (NumPy or jax arrays).

  Returns:
    The mean tree, NumPy arrays.
  """
  total, dtypes, treedef, count = None, None, None, 0
  for tree in trees:
    leaves, this_treedef = jax.tree.flatten(tree)
    leaves = [np.asarray(x) for x in leaves]
    if total is None:
      treedef, dtypes = this_treedef, [x.dtype for x in leaves]
      total = [
          x.astype(_float_accumulator(x.dtype))
          if _is_float(x.dtype) else x for x in leaves
      ]
    else:
      if this_treedef != treedef:
        raise ValueError(f'Parameter tree {count} has structure '
                         f'{this_treedef}, tree 0 has {treedef}.')
      for i, (acc, x) in enumerate(zip(total, leaves)):
        if acc.shape != x.shape:
          raise ValueError(f'Leaf {i} of tree {count} has shape {x.shape}, '
                           f'tree 0 has {acc.shape}.')
        if _is_float(dtypes[i]):
          total[i] = acc + x.astype(acc.dtype)
        elif not np.array_equal(acc, x):
          raise ValueError(f'Non-float leaf {i} differs between tree 0 and '
                           f'tree {count}; it cannot be averaged.')
    count += 1
  if total is None:
    raise ValueError('average_params needs at least one tree.')
  mean = [(acc / count).astype(dtype)
          if _is_float(dtype) else acc
          for acc, dtype in zip(total, dtypes)]
  return jax.tree.unflatten(treedef, mean)


def average_checkpoints(
    workdir: str | os.PathLike[str],
    num_last: int | None = None,
    steps: Sequence[int] | None = None,
    purpose: Purpose = 'eval') -> tuple[PyTree, list[int]]:
  """The mean parameters of several checkpoints (the paper's averaging).

  Args:
    workdir: the run's folder.
    num_last: average the last `num_last` checkpoints
      (`resolve_steps(workdir, None, num_last)`).
    steps: or average these steps. With neither, every checkpoint.
    purpose: as in `restore_params`.

  Returns:
    `(params, steps_used)`: NumPy arrays in the saved dtypes (accumulated in
    float32, float64 for float64 leaves), and the steps averaged, ascending.

  Raises:
    CheckpointNotFound: no checkpoint, a requested step is missing, or a step
      was deleted while it was read (the caller may choose steps again).
    DamagedCheckpointError: a step's state cannot be read.
    TooFewCheckpoints: fewer checkpoints than `num_last` (a ValueError).
    ValueError: both arguments given, or `num_last` < 1.
  """
  if num_last is not None and steps is not None:
    raise ValueError('Give num_last or steps, not both.')
  if steps is not None:
    directory, available = checkpoint_dir(workdir), all_steps(workdir)
    _check_step(directory, available, None)  # raises if there is none
    steps_used = sorted({int(s) for s in steps})
    if not steps_used:
      raise ValueError('steps is empty.')
    for step in steps_used:
      _check_step(directory, available, step)
  elif num_last is not None:
    steps_used = resolve_steps(workdir, None, num_last)
  else:  # every checkpoint
    steps_used = all_steps(workdir)
    _check_step(checkpoint_dir(workdir), steps_used, None)  # none: raises
  with _reader(workdir, steps_used, (STATE,), purpose) as reader:
    params = average_params(_read_params(reader, s, purpose)
                            for s in steps_used)
  return params, steps_used
