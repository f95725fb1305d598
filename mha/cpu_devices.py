"""One JAX CPU device per core for the searches of a CPU host
(`use_cpu_cores`).

XLA:CPU runs a device's program one operation after the other. A decoding
step is mostly small operations (the cache write, the row copies, the
top-k, the products of a few hundred rows), each of which runs on one core
or is split over the cores at a cost, so that one device leaves cores
idle. With the host's cores as as many JAX CPU devices, the searches split
each batch's rows over them (`mha.batch_search`), and the devices'
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
(`XLA_FLAGS=--xla_force_host_platform_device_count=N` or JAX's
`jax_num_cpu_devices`), unless `use_cpu_cores` is given a count itself.
"""
import os
from typing import Mapping

from mha import host_memory
from mha import validation
from mha.errors import UserError

MAX_DEVICES = 8  # the default's cap (more cores: several a device)
XLA_FLAG = "--xla_force_host_platform_device_count"


def host_cores() -> int:
  """The cores this process may run on."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def default_count(environ: Mapping[str, str] = os.environ) -> int | None:
  """The CPU devices `use_cpu_cores()` asks for, or None to leave JAX's
  default: one a core (at most `MAX_DEVICES`) on a CPU host with more than
  one core whose CPU device count the user has not set."""
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
  started already and no count was given.

  Raises:
    UserError: `count` not an integer >= 1 (`validation.FLAGS`' rule, as
      --cpu_devices), or given after JAX started with another number of
      CPU devices.
  """
  import jax  # pylint: disable=import-outside-toplevel
  if count is not None:
    validation.check_flag("cpu_devices", count)
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


__all__ = ["MAX_DEVICES", "default_count", "host_cores", "use_cpu_cores"]
