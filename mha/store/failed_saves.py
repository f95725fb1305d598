"""A checkpoint save the machine refuses (a full disk, a read-only folder).

The save fails in one of Orbax's background threads and leaves the others
waiting for it: `save_failure` ends them, removes the step's temporary
folder and returns a `CheckpointSaveError` naming the step, what was refused
and the last good checkpoint (`resume_advice`, which the trainer also gives
for its other files); `quiet_save_errors` keeps Orbax's stacks of it out of
the log.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import errno
import logging
import os
import shutil
import sys
import threading
import warnings
from typing import Any

from etils import epath
import orbax.checkpoint as ocp

from mha.errors import CheckpointSaveError
from mha.errors import os_errno
from mha.errors import os_reason


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


def latest_step_or_none(directory: str | os.PathLike[str]) -> int | None:
  """The newest finalised step in the checkpoints folder `directory`
  (`Workdir.checkpoints_path`); None if there is none or the folder cannot
  be listed."""
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

