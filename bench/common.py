"""Shared helpers of bench/train_step.py and bench/attention.py.

Timing on a shared 2-core CPU is noisy, so every figure is the median of
several timed runs after warm-up, and each script prints the load average
next to its figures. Nothing here asserts on a time.
"""
import importlib
import io
import os
import re
import statistics
import subprocess
import sys
import tarfile
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from mha.model import flops


def count_params(tree: Any, skip: str | None = None) -> int:
  """The number of parameters in `tree` (arrays or `jax.eval_shape` shapes).

  Args:
    tree: a parameter pytree.
    skip: leaves under a key of this name (e.g. 'embedding') are not
      counted.
  """
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if skip is None or all(getattr(k, "key", None) != skip for k in path):
      total += int(np.prod(leaf.shape))
  return total


def load_average() -> float:
  """The 1-minute load average (other processes' work included)."""
  return os.getloadavg()[0]


def machine_line() -> str:
  """One line naming the host, the devices and the load."""
  devices = jax.local_devices()
  return (f"{flops.cpu_model()}, {os.cpu_count()} cores, "
          f"jax {jax.__version__}, {len(devices)} {devices[0].platform} "
          f"device(s); load average {load_average():.2f}")


def block(tree: Any) -> Any:
  """Waits for every array of `tree`."""
  return jax.tree_util.tree_map(
      lambda x: x.block_until_ready() if hasattr(x, "block_until_ready")
      else x, tree)


def median_seconds(fn: Callable[[], Any], *, warmup: int = 1,
                   repeats: int = 5) -> tuple[float, list[float]]:
  """Median wall time of `fn()` (results waited for) after `warmup` calls.

  Returns:
    (median seconds, every timed run's seconds).
  """
  for _ in range(warmup):
    block(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    block(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times), times


def matmul_peak_flops(n: int = 2048, repeats: int = 9,
                      device: jax.Device | None = None) -> tuple[float, float]:
  """Measured float32 matmul FLOP/s: a jitted [n, n] x [n, n] jnp.dot.

  2·n³ FLOPs per product, `repeats` runs after two warm-up calls, on `device`
  (default: the first local device). The best run is the peak: on a shared
  machine the median mostly measures the other processes.

  Returns:
    (best FLOP/s, median FLOP/s).
  """
  device = device or jax.local_devices()[0]
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.device_put(jax.random.normal(key_a, (n, n), jnp.float32), device)
  b = jax.device_put(jax.random.normal(key_b, (n, n), jnp.float32), device)
  dot = jax.jit(jnp.dot)
  seconds, times = median_seconds(lambda: dot(a, b), warmup=2,
                                  repeats=repeats)
  return 2.0 * n ** 3 / min(times), 2.0 * n ** 3 / seconds


class CompileCounter:
  """Counts XLA backend compilations (jax.monitoring events) while active.

      with CompileCounter() as compiles:
        step(...)
      compiles.count
  """

  _EVENT = "/jax/core/compile/backend_compile_duration"
  _listening: list["CompileCounter"] = []
  _registered = False

  def __init__(self):
    self.count = 0
    self.seconds = 0.0

  @classmethod
  def _listener(cls, event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event == cls._EVENT:
      for counter in cls._listening:
        counter.count += 1
        counter.seconds += duration

  def __enter__(self) -> "CompileCounter":
    if not CompileCounter._registered:
      jax.monitoring.register_event_duration_secs_listener(
          CompileCounter._listener)
      CompileCounter._registered = True
    CompileCounter._listening.append(self)
    return self

  def __exit__(self, *exc) -> None:
    CompileCounter._listening.remove(self)


def fmt_si(x: float, unit: str = "") -> str:
  """1.23e9 -> '1.23 G' + unit."""
  for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.2f} {prefix}{unit}"
  return f"{x:.2f} {unit}"


def fmt_bytes(n: float) -> str:
  """Bytes in MiB with two decimals."""
  return f"{n / 2 ** 20:.2f} MiB"


def table(headers: list[str], rows: list[list[Any]]) -> str:
  """A Markdown table (also readable as plain text)."""
  cells = [[str(c) for c in row] for row in rows]
  widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
            for i, h in enumerate(headers)]

  def line(row):
    return "| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |"

  sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
  return "\n".join([line(headers), sep] + [line(r) for r in cells])


def percentiles(times: list[float]) -> str:
  """'min / median / max' of a list of seconds."""
  t = np.asarray(times)
  return f"{t.min():.3f} / {np.median(t):.3f} / {t.max():.3f} s"


def import_revision(rev: str, dest: str, package: str = "mha",
                    alias: str = "mha_baseline"):
  """`package` as it is at git revision `rev`, imported as `alias`.

  `git archive` extracts the package into `dest`, where its imports of
  itself are rewritten to the alias, so that both versions live in one
  process and can be timed in turn under the same machine load.
  """
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  archive = subprocess.run(["git", "-C", root, "archive", rev, package],
                           check=True, capture_output=True).stdout
  with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    tar.extractall(dest, filter="data")
  os.rename(os.path.join(dest, package), os.path.join(dest, alias))
  pattern = re.compile(rf"\b(from|import) {package}\b|\b{package}\.(?=[a-z_])")
  for folder, _, names in os.walk(os.path.join(dest, alias)):
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        with open(path) as f:
          text = f.read()
        text = pattern.sub(
            lambda m: (f"{m.group(1)} {alias}" if m.group(1)
                       else f"{alias}."), text)
        with open(path, "w") as f:
          f.write(text)
  sys.path.insert(0, dest)
  return importlib.import_module(alias)
