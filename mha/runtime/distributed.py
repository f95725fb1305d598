"""Multi-process start-up: one code path for one and many processes.

`train.py --distributed=auto|on|off` chooses whether the run calls
`jax.distributed.initialize`:

* `auto` (the default): when JAX's own cluster detection finds a cluster,
  the one `jax.distributed.initialize()` without arguments would use: a
  Cloud TPU VM or pod slice (GCE or GKE), SLURM, Open MPI, Kubernetes (with
  the `kubernetes` package, `pip install "jax[k8s]"`). JAX's mpi4py
  detection is opt-in in JAX and is not used: give the flags below.
* `on`: initialise, or stop with one line saying why not.
* `off`: never; every process runs alone.

`--coordinator_address=HOST:PORT --num_processes=N --process_id=I` (the
arguments of `jax.distributed.initialize`) give the processes explicitly,
with `auto` or `on`: GPU clusters JAX does not detect, or several CPU
processes on one host.

Either way the run logs one line with the number of processes, this
process's index, its local and the global devices and their platform.
"""
from absl import logging
import jax
# JAX has no public "is a cluster detected" call; jax.distributed.initialize
# walks these classes itself.
from jax._src import clusters

from mha.errors import ConfigError

MODES = ("auto", "on", "off")


def detect_cluster() -> type[clusters.ClusterEnv] | None:
  """The cluster environment `jax.distributed.initialize()` would use, or
  None; initialises nothing.

  The same choice as JAX's `ClusterEnv.auto_detect_unset_distributed_params`:
  the first registered environment that is present, opt-in methods
  (mpi4py) left out.

  Raises:
    ConfigError: an environment's detection failed (e.g. Kubernetes
      credentials), naming it.
  """
  for env in clusters.ClusterEnv._cluster_types:  # pylint: disable=protected-access
    if env.opt_in_only_method:
      continue
    try:
      present = env.is_env_present()
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(
          f"JAX's cluster detection ({env.__name__}) failed: "
          f"{' '.join(str(e).split())} (--distributed=off runs one process; "
          "--coordinator_address, --num_processes and --process_id give "
          "the processes explicitly).") from None
    if present:
      return env
  return None


def _explicit(coordinator_address: str | None, num_processes: int | None,
              process_id: int | None) -> dict[str, object] | None:
  """The explicit arguments of `jax.distributed.initialize`, or None."""
  given = {"coordinator_address": coordinator_address,
           "num_processes": num_processes, "process_id": process_id}
  if all(v is None for v in given.values()):
    return None
  missing = [f"--{k}" for k, v in given.items() if v is None]
  if missing:
    raise ConfigError(
        "--coordinator_address, --num_processes and --process_id go "
        f"together: {', '.join(missing)} missing.")
  return given


def initialize(mode: str = "auto", coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Calls `jax.distributed.initialize` as `mode` says; logs the processes.

  Args:
    mode: 'auto', 'on' or 'off' (the module docstring).
    coordinator_address: HOST:PORT of process 0, with the other two.
    num_processes: number of processes.
    process_id: this process's index.

  Raises:
    ConfigError: an unknown mode; incomplete explicit flags or explicit
      flags with 'off'; 'on' without a detected cluster or explicit flags;
      `jax.distributed.initialize` failing (e.g. the coordinator cannot be
      reached) with 'on' or explicit flags. One line each.
  """
  if mode not in MODES:
    raise ConfigError(f"--distributed={mode!r}: use one of "
                      f"{', '.join(MODES)}.")
  explicit = _explicit(coordinator_address, num_processes, process_id)
  if explicit is not None and mode == "off":
    raise ConfigError("--distributed=off cannot take --coordinator_address, "
                      "--num_processes and --process_id: drop one or the "
                      "other.")
  how, kwargs = None, {}
  if explicit is not None:
    how, kwargs = "--coordinator_address", explicit
  elif mode != "off":
    env = detect_cluster()
    if env is not None:
      how = env.__name__
    elif mode == "on":
      raise ConfigError(
          "--distributed=on: JAX detects no cluster (Cloud TPU pod slice, "
          "SLURM, Open MPI, Kubernetes with the kubernetes package) and "
          "--coordinator_address, --num_processes and --process_id are not "
          "given.")
  if how is not None:
    try:
      jax.distributed.initialize(**kwargs)
    except (RuntimeError, ValueError, TypeError) as e:
      raise ConfigError(
          f"jax.distributed.initialize ({how}) failed: "
          f"{' '.join(str(e).split())[:500]} (--distributed=off runs one "
          "process).") from None
  logging.info("%s", describe(how))


def describe(how: str | None = None) -> str:
  """One line: processes, this process, local and global devices."""
  devices = jax.local_devices()
  platform = devices[0].platform if devices else "none"
  source = f", jax.distributed through {how}" if how else ""
  return (f"Process {jax.process_index()} of {jax.process_count()}"
          f"{source}: {jax.local_device_count()} local of "
          f"{jax.device_count()} global devices ({platform}).")


def check_single_process(program: str) -> None:
  """Refuses to run inside a cluster of several processes.

  For programs that run in one process (`eval.py`): started on every host
  of a pod slice or as every task of a job, each copy would write the same
  files.

  Raises:
    ConfigError: JAX detects a cluster of more than one process.
  """
  env = detect_cluster()
  if env is None:
    return
  try:
    count = env.get_process_count()
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("%s: JAX detects %s but cannot count its processes (%s); "
                    "running as one process.", program, env.__name__, e)
    return
  if count > 1:
    raise ConfigError(
        f"JAX detects a cluster of {count} processes ({env.__name__}), but "
        f"{program} runs in one process: run it once, on a single host or "
        "task that reads the workdir (README: 'Several processes, TPU "
        "pods').")
