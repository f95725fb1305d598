"""Device placement: the train step's batches and state, and checkpoints.

Two kinds of copies of a tree over several devices:

* `pmap_replicate`: one copy on each local device, every leaf
  `[local devices, ...]`, laid out as the `pmap`ped step's outputs: the train
  state, and the parameters the in-training evaluation reads.
  `pmap_unreplicate` brings the first local device's copy to the host.
* `checkpoint_arrays`: one copy on the first local device of each process,
  every leaf a global array of its own shape: what Orbax saves (each process
  writes a part of each value).

`shard` splits a host batch over the local devices for `pmap`.
"""
import flax
import jax
import numpy as np

AXIS = "batch"  # the pmap axis: the devices of every process


def shard(batch: dict[str, np.ndarray], num_devices: int):
  """[B, L] -> [devices, B / devices, L] for pmap."""
  def split(x):
    if x.shape[0] % num_devices:
      raise ValueError(f"Batch of {x.shape[0]} rows does not split over "
                       f"{num_devices} local devices.")
    return x.reshape((num_devices, -1) + x.shape[1:])
  return jax.tree_util.tree_map(split, batch)


def pmap_replicate(tree, devices):
  """Copies of `tree` on `devices`, laid out as the pmapped step's outputs
  (same mesh axis name), so the first and later calls share one compile."""
  return flax.jax_utils.replicate(tree, devices, axis_name=AXIS)


def pmap_unreplicate(tree):
  """Host copy of the first local device's value of each replicated leaf.

  (flax.jax_utils.unreplicate keeps the device axis when there is one device.)
  """
  def first(x):
    if hasattr(x, "addressable_shards"):
      return np.asarray(x.addressable_shards[0].data)[0]
    return np.asarray(x)[0]
  return jax.tree_util.tree_map(first, tree)


# A replicated tree's first row on one device, as new buffers (the train
# step may donate the state's own buffers after the save returns).
_first_rows = jax.jit(lambda leaves: [x[0] for x in leaves])


def checkpoint_arrays(tree):
  """The `pmap_replicate`d `tree` as jax arrays for Orbax, without a host
  copy made here.

  Each leaf of a `pmap`ped tree is `[local devices, ...]`. Each becomes a
  global array of the leaf's shape, replicated over the first local device
  of every process and copied there from that device's row: Orbax copies it
  to the host while it saves, once per process, and in multi-process runs
  each process writes a part of each value.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  first = jax.local_devices()[0]
  rows = _first_rows([next(s.data for s in x.addressable_shards
                           if s.device == first) for x in leaves])
  firsts = {}
  for device in jax.devices():
    firsts.setdefault(device.process_index, device)
  mesh = jax.sharding.Mesh(np.asarray([firsts[p] for p in sorted(firsts)]),
                           ("process",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  arrays = [jax.make_array_from_single_device_arrays(x.shape[1:], replicated,
                                                     [row])
            for x, row in zip(leaves, rows)]
  return jax.tree_util.tree_unflatten(treedef, arrays)
