"""mha.runtime.compile_time: the time a block spends preparing jax computations
(tracing, lowering, XLA's compilation, reading a kept search), apart from
running them."""
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from mha.runtime import compile_time


def test_overlapping_spans_count_once():
  assert compile_time.union_seconds([]) == 0.0
  # [0, 2] and [1, 3] make [0, 3]; [5, 6] holds [5.5, 5.7]: 3 + 1.
  assert compile_time.union_seconds(
      [(5.5, 5.7), (1.0, 3.0), (0.0, 2.0), (5.0, 6.0)]) == 4.0
  assert compile_time.union_seconds([(0.0, 1.0), (1.0, 2.5)]) == 2.5


def _fresh_function():
  """A jitted function no other test has compiled (its own constant)."""
  offset = np.float32(np.random.default_rng().random())
  return jax.jit(lambda x: jnp.tanh(x * 2.0 + offset))


def test_a_first_call_counts_and_a_second_does_not():
  f, x = _fresh_function(), jnp.ones((3, 5))
  start = time.perf_counter()
  with compile_time.CompileTime() as first:
    f(x).block_until_ready()
  wall = time.perf_counter() - start
  assert 0.0 < first.seconds <= wall
  assert {event for event, _, _ in first.spans} >= {
      "/jax/core/compile/jaxpr_trace_duration",
      "/jax/core/compile/backend_compile_duration"}
  with compile_time.CompileTime() as again:  # compiled for this shape
    f(x).block_until_ready()
  assert again.seconds == 0.0 and not again.spans
  y = jnp.ones((4, 5))
  with compile_time.CompileTime() as other_shape:
    f(y).block_until_ready()
  assert other_shape.seconds > 0.0


def test_only_this_threads_preparation_counts():
  f = _fresh_function()
  x = jnp.ones((2, 2))
  with compile_time.CompileTime() as block:
    thread = threading.Thread(target=lambda: f(x).block_until_ready())
    thread.start()
    thread.join()
    # Other events do not count; a kept search's reading does.
    jax.monitoring.record_event_time_span("/other/event", 0.0, 10.0)
    jax.monitoring.record_event_time_span(compile_time.SEARCH_LOAD_EVENT,
                                          1.0, 1.5)
  assert block.seconds == 0.5
  # Once the block is left, nothing more is counted.
  jax.monitoring.record_event_time_span(compile_time.SEARCH_LOAD_EVENT,
                                        2.0, 3.0)
  assert block.spans == [(compile_time.SEARCH_LOAD_EVENT, 1.0, 1.5)]
