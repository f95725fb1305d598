"""Multi-process start-up: one code path for one and many processes."""
import os

from absl import logging
import jax

# Environment variables that announce a cluster jax can auto-detect.
_CLUSTER_ENV = ("TPU_WORKER_HOSTNAMES", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE",
                "MEGASCALE_COORDINATOR_ADDRESS")


def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Calls `jax.distributed.initialize` when the run has several processes.

  With a coordinator address, the processes are given explicitly (GPU
  clusters, several CPU processes on one host). Without one, a TPU pod slice
  (more than one worker host) or a SLURM / Open MPI job is detected by jax.
  A single process on one host needs no initialisation.
  """
  if coordinator_address:
    if num_processes is None or process_id is None:
      raise ValueError("--coordinator_address needs --num_processes and "
                       "--process_id.")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes,
                               process_id=process_id)
  elif _is_cluster():
    jax.distributed.initialize()
  else:
    return
  logging.info("Process %d of %d; %d local and %d global devices.",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def _is_cluster() -> bool:
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts:
    return True
  return any(os.environ.get(name) for name in _CLUSTER_ENV[1:])
