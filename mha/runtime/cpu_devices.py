"""One JAX CPU device per core for the searches of a CPU host
(`use_cpu_cores`).

XLA:CPU runs a device's program one operation after the other. A decoding
step is mostly small operations (the cache write, the row copies, the
top-k, the products of a few hundred rows), each of which runs on one core
or is split over the cores at a cost, so that one device leaves cores
idle. With the host's cores as as many JAX CPU devices, the searches split
each batch's rows over them (`mha.search.batches`), and the devices'
programs run side by side, one a core. The outputs are the same: every
device gets at least `batch_search.MIN_SEARCH_ROWS` rows of the default
batch (`translate.batch_size_for`). What it gains and costs is in
bench/README.md (issue 33).

The commands that translate (eval.py / mha-eval, mha-translate) call
`use_cpu_cores(FLAGS.cpu_devices)` before JAX starts; a script using the
Python API calls `mha.use_cpu_cores()` first. Training keeps one CPU
device: its train step was no faster on two (bench/README.md), and its
results would change with the host's cores.

Left as they are: an accelerator host (`host_memory.accelerator_host`: the
searches run on the accelerators), and a CPU device count the user chose
(`XLA_FLAGS=--xla_force_host_platform_device_count=N`,
`JAX_NUM_CPU_DEVICES=N` or `jax.config.update("jax_num_cpu_devices", N)`),
unless `use_cpu_cores` is given a count itself.
"""
import math
import os
from typing import Mapping

from mha.runtime import host_memory
from mha import validation
from mha.errors import UserError

MAX_DEVICES = 8  # the default's cap (more cores: several a device)
XLA_FLAG = "--xla_force_host_platform_device_count"


def host_cores(cgroup_root: str = "/sys/fs/cgroup",
               proc_cgroup: str = "/proc/self/cgroup") -> int:
  """The cores this process may run on: those it may be scheduled on
  (`os.sched_getaffinity`: taskset, SLURM's cpusets), fewer where a CPU
  quota allows less (`cgroup_cpu_limit`: Docker's `--cpus`, Kubernetes'
  CPU limits), at least 1."""
  if hasattr(os, "sched_getaffinity"):
    cores = len(os.sched_getaffinity(0))
  else:
    cores = os.cpu_count() or 1
  limit = cgroup_cpu_limit(cgroup_root, proc_cgroup)
  if limit is not None:
    cores = min(cores, max(1, math.ceil(limit)))
  return cores


def cgroup_cpu_limit(cgroup_root: str = "/sys/fs/cgroup",
                     proc_cgroup: str = "/proc/self/cgroup"
                     ) -> float | None:
  """The CPUs' worth of time this process's control groups allow (quota
  over period, the smallest along its group and the groups above it), or
  None for no limit or none readable (not Linux).

  cgroup v2: `cpu.max` ("QUOTA PERIOD" or "max PERIOD") in the unified
  hierarchy; v1: `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us` in
  the hierarchy of the `cpu` controller. The group's path comes from
  `proc_cgroup` and is read below `cgroup_root` (in a container, "/").
  """
  try:
    with open(proc_cgroup, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  limits = []
  for line in lines:
    if line.count(":") < 2:
      continue
    _, controllers, path = line.split(":", 2)
    if controllers == "":  # v2
      limits += _limits(cgroup_root, path, _v2_limit)
    elif "cpu" in controllers.split(","):  # v1
      limits += _limits(os.path.join(cgroup_root, controllers), path,
                        _v1_limit)
  return min(limits, default=None)


def _limits(mount: str, path: str, read) -> list[float]:
  """The limits `read(folder)` finds in the group `path` and those above."""
  parts = [p for p in path.split("/") if p]
  found = []
  for depth in range(len(parts), -1, -1):
    limit = read(os.path.join(mount, *parts[:depth]))
    if limit is not None:
      found.append(limit)
  return found


def _read_words(path: str) -> list[str] | None:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read().split()
  except OSError:
    return None


def _ratio(quota: list[str] | None, period: list[str] | None
           ) -> float | None:
  """quota / period in CPUs, None for no quota (missing, "max", -1) or
  anything unreadable."""
  try:
    ratio = int(quota[0]) / int(period[0])
  except (TypeError, IndexError, ValueError, ZeroDivisionError):
    return None
  return ratio if ratio > 0 else None


def _v2_limit(folder: str) -> float | None:
  words = _read_words(os.path.join(folder, "cpu.max")) or []
  return _ratio(words[:1], words[1:])


def _v1_limit(folder: str) -> float | None:
  return _ratio(_read_words(os.path.join(folder, "cpu.cfs_quota_us")),
                _read_words(os.path.join(folder, "cpu.cfs_period_us")))


def default_count(environ: Mapping[str, str] = os.environ) -> int | None:
  """The CPU devices `use_cpu_cores()` asks for, or None to leave JAX's
  default: one a core (`host_cores`, at most `MAX_DEVICES`) on a CPU host
  with more than one core whose CPU device count the user has not set."""
  if (host_memory.accelerator_host(environ)
      or XLA_FLAG in environ.get("XLA_FLAGS", "")
      or environ.get("JAX_NUM_CPU_DEVICES")):
    return None
  count = min(host_cores(), MAX_DEVICES)
  return count if count > 1 else None


def use_cpu_cores(count: int | None = None,
                  environ: Mapping[str, str] = os.environ) -> int | None:
  """Makes JAX's CPU backend `count` devices (None: `default_count`).

  Must run before JAX runs anything. Returns the count set, or None when
  JAX's setting was left as it was (`default_count`), as it is when JAX has
  started already or `jax.config.update("jax_num_cpu_devices", N)` set a
  count, and no count was given.

  Raises:
    UserError: `count` not an integer >= 1 (`validation.FLAGS`' rule, as
      --cpu_devices), or given after JAX started with another number of
      CPU devices.
  """
  import jax  # pylint: disable=import-outside-toplevel
  if count is not None:
    validation.check_flag("cpu_devices", count)
  elif jax.config.jax_num_cpu_devices != -1:  # set in Python: the user's
    return None
  asked = count if count is not None else default_count(environ)
  if asked is None:
    return None
  try:
    jax.config.update("jax_num_cpu_devices", asked)
  except RuntimeError:  # JAX has started
    if count is None:
      return None
    started = len(jax.devices("cpu"))
    if started != count:
      raise UserError(
          f"cpu_devices={count}: JAX has started already, with {started} "
          "CPU devices; the number is set before anything runs on "
          "JAX.") from None
  return asked


__all__ = ["MAX_DEVICES", "cgroup_cpu_limit", "default_count", "host_cores",
           "use_cpu_cores"]
