"""A SIGTERM raised as `errors.SigTerm` where the main thread is: `raised()`.

Without it a SIGTERM (a preemption, `kill`) ends the process at once: its
`finally` blocks do not run, so a lock stays behind and a half-written set-up
stays in the workdir. Inside `raised()` the signal is an exception (a
BaseException, which no library's `except Exception` takes for its own) and
the caller's clean-up runs. The commands that only read and write results
use it for their whole run (`cli.startup.stops_on_sigterm`); train.py for its
set-up, before its loop turns a SIGTERM into a checkpoint
(`train_actions.StopSignal`).
"""
import contextlib
import signal
import sys
import threading
from typing import Iterator

from mha.errors import SigTerm


def _raise(signum, frame):
  del signum, frame
  raise SigTerm


@contextlib.contextmanager
def raised() -> Iterator[None]:
  """SIGTERM raises `SigTerm` in the main thread while inside; the earlier
  handler is put back on leaving. Outside the main thread (where Python
  takes no signal handler) it changes nothing."""
  try:
    previous = signal.signal(signal.SIGTERM, _raise)
  except ValueError:  # not the main thread
    yield
    return
  hook = sys.unraisablehook

  def unraisable(info) -> None:
    # Python runs a signal's handler between any two bytecodes, also in a
    # gc callback (jax has one) or a __del__, where an exception is only
    # printed ("Exception ignored in ...") and the command went on. The
    # signal is sent again to the main thread once that has returned: from
    # another thread, a moment later (in this hook, the handler's exception
    # would be lost for good; a second loss comes back here). A real
    # signal, so that a blocking call of the main thread (a read, a wait)
    # is interrupted too.
    if isinstance(info.exc_value, SigTerm):
      threading.Timer(0.01, signal.pthread_kill,
                      (threading.main_thread().ident, signal.SIGTERM)).start()
    else:
      hook(info)

  sys.unraisablehook = unraisable
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)
    sys.unraisablehook = hook
