"""Several processes, one writer: process 0 prepares, the others wait.

Preparing data writes shared files: a TFDS dataset prepared in its data dir,
the SentencePiece model `<workdir>/spm.model`, the tokenized cache
`<workdir>/tokenized/`. In a run of several processes (the hosts of a TPU pod
slice, the tasks of a GPU cluster), every process would otherwise write them
at the same time. `process_zero_first(what, step)` runs `step` on process 0
first while the others wait; then the others run the same `step`, which
finds what process 0 wrote and reads it. Each step therefore reads what
exists and makes only what is missing. Where a folder is not shared between
hosts (a local data dir on each host), each host makes its own copy after
process 0: the same bytes, as every step is deterministic.

The wait goes through the key-value store of `jax.distributed`'s
coordination service, not through a device collective, so it needs no
compiled computation, may last as long as the preparation (hours for
WMT14), and carries process 0's error message: when process 0 fails, every
process raises a `DataError` with that message.

Every process must call `process_zero_first` the same number of times in
the same order (the calls are numbered), unconditionally: a step that
returns early on some process must do so inside `step`. Calls made inside a
step (opening a split while training the vocabulary) run their step
directly: the outer call already orders the processes, and what a step
does differs between them (process 0 trains where the others load).

A single process runs `step` directly.
"""
import itertools
from typing import Callable, TypeVar

from absl import logging

from mha.errors import DataError

T = TypeVar("T")

# Calls numbered in the same order on every process.
_calls = itertools.count()
# Inside a step of process_zero_first (nested calls run directly).
_in_step = False
# How often a waiting process logs that it still waits.
_LOG_EVERY_SECONDS = 600


def _client():
  """The coordination service client of `jax.distributed.initialize`, or None.

  JAX has no public accessor; `jax.experimental.multihost_utils` and Orbax
  read the same attribute.
  """
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def _wait(client, key: str, what: str) -> str:
  """Process 0's value at `key`, logging every few minutes while it waits."""
  import jax  # pylint: disable=g-import-not-at-top
  waited = 0
  while True:
    try:
      return client.blocking_key_value_get(key, _LOG_EVERY_SECONDS * 1000)
    except jax.errors.JaxRuntimeError as e:
      if "DEADLINE_EXCEEDED" not in str(e):
        raise
    waited += _LOG_EVERY_SECONDS
    logging.info("Still waiting for process 0 to %s (%d min).", what,
                 waited // 60)


def process_zero_first(what: str, step: Callable[[], T]) -> T:
  """`step()` on process 0, then on the other processes; its result.

  Args:
    what: what `step` does, for log lines and errors ("train the
      vocabulary ...").
    step: reads what exists, makes and writes what is missing.

  Returns:
    This process's `step()`.

  Raises:
    DataError: process 0's step failed (on the other processes: naming
      process 0 and its message); on process 0, its own exception.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1 or _in_step:
    return step()
  key = f"mha/data/process_zero_first/{next(_calls)}"
  client = _client()
  if client is None:  # several processes without jax.distributed
    raise RuntimeError(f"{jax.process_count()} processes but no "
                       "jax.distributed client: call jax.distributed."
                       "initialize() first "
                       "(mha.runtime.distributed.initialize).")
  if jax.process_index() == 0:
    try:
      result = _run(step)
    except BaseException as e:
      message = " ".join(str(e).split())
      client.key_value_set(key, f"error:{type(e).__name__}: {message}")
      raise
    client.key_value_set(key, "ok")
    return result
  logging.info("Process %d waits for process 0 to %s.", jax.process_index(),
               what)
  status = _wait(client, key, what)
  if status != "ok":
    raise DataError(f"Process 0 could not {what}: "
                    f"{status.removeprefix('error:')}")
  return _run(step)


def _run(step: Callable[[], T]) -> T:
  """`step()`, with the calls it makes to process_zero_first run directly."""
  global _in_step
  _in_step = True
  try:
    return step()
  finally:
    _in_step = False
