"""Readers beside a trainer that deletes checkpoints (issue 58, case 5).

A trainer keeping few checkpoints deletes a step while `mha.load`, eval.py
or `eval.py --follow` reads it. The deletion is injected at each point of
the read (the k-th file access of the reader, for every k), not left to
timing: every read ends with the step read whole or with the documented
`CheckpointNotFound` (a loader chooses its steps again, a follower skips the
step with one line), with no stack on stderr.

The stacks were `RuntimeError: Event loop is closed`, one per TensorStore
read still in flight when Orbax closed the event loop of a failed restore
(mha/runtime/event_loops.py).
"""
import asyncio
import os
import subprocess
import sys

import pytest

from mha.runtime import event_loops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# One read fails while another awaits TensorStore, in a loop run as Orbax's
# `asyncio_utils.run_sync` runs it (a new loop, `run_until_complete`,
# `close()`: nothing pending cancelled); then the read in flight completes.
_FAILED_READ = """
import asyncio, sys, threading
import tensorstore as ts
from mha.runtime import event_loops

promise, future = ts.Promise.new()

async def read():
  pending = asyncio.ensure_future(future)  # Orbax's gather of reads
  await asyncio.sleep(0)
  raise FileNotFoundError("checkpoints/2/state/manifest.ocdbt")

def run():
  loop = asyncio.new_event_loop()
  try:
    loop.run_until_complete(read())
  except FileNotFoundError:
    pass
  finally:
    loop.close()

if sys.argv[1] == "draining":
  with event_loops.draining():
    run()
else:
  run()
print("cancelled" if future.cancelled() else "in flight")
promise.set_result(1)
threading.Event().wait(0.2)  # TensorStore calls back on a thread of its own
"""


@pytest.mark.parametrize("mode", ["draining", "plain"])
def test_a_read_in_flight_when_its_loop_closes_is_cancelled_silently(mode):
  done = subprocess.run([sys.executable, "-c", _FAILED_READ, mode],
                        cwd=REPO, capture_output=True, text=True, check=True,
                        timeout=120)
  if mode == "draining":
    assert (done.stdout, done.stderr) == ("cancelled\n", "")
  else:  # what draining stops: a stack per read in flight, a lost task
    assert done.stdout == "in flight\n"
    assert "RuntimeError: Event loop is closed" in done.stderr
    assert "Task was destroyed but it is pending!" in done.stderr


def test_a_late_completion_after_a_drained_close_is_dropped():
  """A completion under way at the cancel, arriving after the close, is
  dropped (as `close()` drops those that arrive before it)."""
  loop = event_loops.DrainingEventLoop()
  task = loop.create_task(asyncio.sleep(10))
  loop.close()
  assert task.cancelled()
  assert loop.call_soon_threadsafe(print, "late") is None


def test_draining_changes_only_asyncios_default_policy_and_only_within():
  policy = asyncio.get_event_loop_policy()
  plain = policy.new_event_loop()
  with event_loops.draining():
    with event_loops.draining():  # nested: still draining after the inner
      pass
    inner = asyncio.new_event_loop()
  after = asyncio.new_event_loop()
  assert asyncio.get_event_loop_policy() is policy
  assert type(inner) is event_loops.DrainingEventLoop
  assert type(plain) is type(after) is not event_loops.DrainingEventLoop
  # A loop that closed with nothing pending keeps asyncio's rule.
  for loop in (inner, after, plain):
    loop.close()
  with pytest.raises(RuntimeError, match="Event loop is closed"):
    inner.call_soon_threadsafe(print)
