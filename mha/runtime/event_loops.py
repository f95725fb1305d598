"""Event loops that end their pending tasks before they close.

    from mha.runtime import event_loops
    with event_loops.draining():
      manager.restore(step, args=...)   # Orbax's read, in a loop of its own

Orbax runs each checkpoint read in a fresh asyncio event loop
(`orbax.checkpoint`'s `asyncio_utils.run_sync`: `run_until_complete`, then
`close()`), without the teardown of `asyncio.run`, which cancels the tasks
still pending first. When one array's read fails (a trainer deleting the
step under the reader: its `keep_checkpoints`), the reads of the other
arrays are still awaiting their TensorStore futures: the loop closes under
them, and each of those reads, completing later on a TensorStore thread,
calls `call_soon_threadsafe` on the closed loop. That was a
`RuntimeError: Event loop is closed` stack on stderr per pending read
(dozens per deleted step in an `eval.py --follow` log), and "Task was
destroyed but it is pending!" at exit.

Within `draining()`, the loops that asyncio's default policy makes (in any
thread) cancel their pending tasks and run until those have ended before
they close, as `asyncio.run` does. A TensorStore future whose task is
cancelled is cancelled with it and never calls back. Only asyncio's own
default policy is changed (a policy of the user's, uvloop's, is left as
it is), only while a `draining()` is active, and only its
`new_event_loop`: the loops the threads have set stay theirs.
"""
import asyncio
from collections.abc import Iterator
import contextlib
import threading

_lock = threading.Lock()
_active = 0  # draining() contexts active, all threads together
_patched = None  # the policy whose new_event_loop is replaced


class DrainingEventLoop(asyncio.SelectorEventLoop):
  """asyncio's loop of the platform, whose `close()` first cancels the
  tasks still pending and runs until they have ended.

  A read whose completion was under way when its task was cancelled (a
  TensorStore thread already calling back) may still call
  `call_soon_threadsafe` after the close: such a call is dropped, as
  `close()` drops the callbacks scheduled just before it (nothing could
  run either: the tasks they were for have ended). A loop that closed with
  nothing pending keeps asyncio's rule (a RuntimeError).
  """

  def __init__(self):
    super().__init__()
    self._closing = threading.Lock()
    self._cancelled_tasks = False

  def close(self) -> None:
    if not self.is_running() and not self.is_closed():
      pending = asyncio.all_tasks(self)
      for task in pending:
        task.cancel()
      if pending:  # their exceptions retrieved: no "never retrieved" line
        self._cancelled_tasks = True
        self.run_until_complete(
            asyncio.gather(*pending, return_exceptions=True))
    with self._closing:
      super().close()

  def call_soon_threadsafe(self, callback, *args, context=None):
    with self._closing:
      if self._cancelled_tasks and self.is_closed():
        return None  # the late completion of a cancelled read
      return super().call_soon_threadsafe(callback, *args, context=context)


@contextlib.contextmanager
def draining() -> Iterator[None]:
  """Within it, the event loops made with asyncio's default policy are
  `DrainingEventLoop`s (module docstring). Nests, and may be entered from
  several threads at once: the policy is put back when the last ends."""
  global _active, _patched
  with _lock:
    if _active == 0:
      policy = asyncio.get_event_loop_policy()
      # Exactly asyncio's own, not a subclass of the user's.
      if type(policy) is asyncio.DefaultEventLoopPolicy:  # noqa: E721
        policy.new_event_loop = DrainingEventLoop
        _patched = policy
    _active += 1
  try:
    yield
  finally:
    with _lock:
      _active -= 1
      if _active == 0 and _patched is not None:
        del _patched.new_event_loop
        _patched = None
