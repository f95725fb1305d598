"""The seconds a block of code spent preparing jax computations.

    with compile_time.CompileTime() as preparing:
      outputs = search(...)
    preparing.seconds  # of the block's wall time

counts the wall time, in the thread that entered the block, of jax tracing
a jitted function, lowering it to MLIR and compiling it with XLA (or
fetching the executable from the persistent compilation cache), and of
`mha.search.trace_cache` reading a kept search from disk: the time spans jax
reports through `jax.monitoring` for `EVENTS`, overlapping spans counted
once. A block whose computations were all prepared before (a jitted
function called again with the same shapes) counts 0. eval.py reports it
apart from the search's time (`compile_seconds` of metrics.json), so that
a small evaluation's sentences/s is read with the share of it that the
first call's compilation took.
"""
import threading
from typing import Any

import jax

# `mha.search.trace_cache` reports the reading of a kept search as this event.
SEARCH_LOAD_EVENT = "/mha/search_cache/load"
EVENTS = frozenset({
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
    SEARCH_LOAD_EVENT,
})


def union_seconds(spans: list[tuple[float, float]]) -> float:
  """The length of the union of the intervals `(start, end)`."""
  total, reach = 0.0, float("-inf")
  for start, end in sorted(spans):
    if end > reach:
      total += end - max(start, reach)
      reach = end
  return total


class CompileTime:
  """A context manager: `seconds`, once the block is left, is the time the
  block spent preparing jax computations (module docstring)."""

  def __init__(self):
    self.thread: int | None = None  # the thread that entered the block
    self.spans: list[tuple[str, float, float]] = []  # (event, start, end)
    self.seconds = 0.0

  def __enter__(self) -> "CompileTime":
    self.thread, self.spans = threading.get_ident(), []
    jax.monitoring.register_event_time_span_listener(self._listen)
    return self

  def __exit__(self, *exc: Any) -> None:
    jax.monitoring.unregister_event_time_span_listener(self._listen)
    self.seconds = union_seconds([span[1:] for span in self.spans])

  def _listen(self, event: str, start_time: float, end_time: float,
              **kwargs: Any) -> None:
    del kwargs
    if event in EVENTS and threading.get_ident() == self.thread:
      self.spans.append((event, start_time, end_time))
