"""Training and evaluation batches for the trainer and the evaluator.

Batches are dicts of numpy int32 arrays: `inputs` [B, Ls], `targets`
[B, Lt], 0 = padding, plus `inputs_segmentation`, `targets_segmentation`,
`inputs_position`, `targets_position` when `config.pack_examples`. B is this
process's rows: a contiguous block of B_global / process_count rows of the
global batch, B_global a multiple of the global device count, so the block
splits evenly over the local devices for `pmap`.
"""
from typing import Iterator

from absl import logging
import ml_collections
import numpy as np

from mha.data import batching
from mha.data.tokenized import TokenizedSplit, tokenize_split
from mha.data.tokenizer import Tokenizer
from mha.errors import DataError


def _process_defaults(process_index: int | None, process_count: int | None,
                      num_global_devices: int | None) -> tuple[int, int, int]:
  """Fills unset arguments from jax; checks that the batch can be split."""
  if None in (process_index, process_count, num_global_devices):
    import jax  # pylint: disable=g-import-not-at-top
    if process_index is None:
      process_index = jax.process_index()
    if process_count is None:
      process_count = jax.process_count()
    if num_global_devices is None:
      num_global_devices = jax.device_count()
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} is not in "
                     f"[0, process_count={process_count}).")
  if num_global_devices % process_count:
    raise ValueError(f"num_global_devices={num_global_devices} is not a "
                     f"multiple of process_count={process_count}.")
  return process_index, process_count, num_global_devices


def _block(entries: np.ndarray, process_index: int, process_count: int
           ) -> np.ndarray:
  """This process's contiguous block of a global batch's rows."""
  size = len(entries) // process_count
  return entries[process_index * size:(process_index + 1) * size]


def _kept(data: TokenizedSplit, max_inputs: int, max_targets: int,
          what: str) -> np.ndarray:
  """Ids of the examples within the length limits; logs how many are not."""
  keep = ((data.inputs_lengths <= max_inputs)
          & (data.targets_lengths <= max_targets))
  dropped = len(data) - int(keep.sum())
  if dropped:
    logging.warning("%s: dropped %d of %d examples longer than %d source or "
                    "%d target tokens (EOS included).", what, dropped,
                    len(data), max_inputs, max_targets)
  return np.flatnonzero(keep)


def make_train_plan(config: ml_collections.ConfigDict, data: TokenizedSplit,
                    num_global_devices: int
                    ) -> batching.BucketPlan | batching.PackPlan:
  """The batch plan of the training split (same on every process).

  Examples longer than `config.max_source_length` source or
  `config.max_target_length` target tokens (EOS included) are dropped.
  """
  inputs_cap = batching.padded_cap(config.max_source_length, config.max_len)
  targets_cap = batching.padded_cap(config.max_target_length, config.max_len)
  ids = _kept(data, config.max_source_length, config.max_target_length,
              f"split {config.train_split!r}")
  if not len(ids):
    raise DataError(
        f"No example of split {config.train_split!r} fits "
        f"config.max_source_length={config.max_source_length} and "
        f"config.max_target_length={config.max_target_length}.")
  kwargs = dict(max_tokens=config.max_tokens, num_devices=num_global_devices,
                seed=config.seed, count=config.max_tokens_counts)
  lengths = (ids, data.inputs_lengths[ids], data.targets_lengths[ids])
  if config.pack_examples:
    return batching.PackPlan(*lengths, inputs_length=inputs_cap,
                             targets_length=targets_cap, **kwargs)
  return batching.BucketPlan(*lengths, inputs_cap=inputs_cap,
                             targets_cap=targets_cap, **kwargs)


def train_batches(config: ml_collections.ConfigDict, tok: Tokenizer,
                  start_step: int = 0, process_index: int | None = None,
                  process_count: int | None = None,
                  num_global_devices: int | None = None
                  ) -> Iterator[dict[str, np.ndarray]]:
  """This process's rows of global training batches start_step, +1, ...

  Infinite: epochs repeat, each shuffled from (config.seed, epoch). Batch k
  is the same whether the iterator started at 0 or at any step <= k, and the
  global batch does not depend on the number of processes. Starting at step
  k computes only the plan of k's epoch (no earlier batch is built).

  Args:
    config: the run's config (data fields).
    tok: the shared tokenizer (`get_tokenizer`).
    start_step: index of the first global batch to yield.
    process_index: this process (default `jax.process_index()`).
    process_count: number of processes (default `jax.process_count()`).
    num_global_devices: devices over all processes (default
      `jax.device_count()`); global batch rows are a multiple of it.

  Returns:
    An iterator of batches (see the module docstring).

  Raises:
    DataError: bad data or config, raised by this call (not by the first
      `next`).
  """
  if start_step < 0:
    raise ValueError(f"start_step={start_step} must be >= 0.")
  process_index, process_count, num_global_devices = _process_defaults(
      process_index, process_count, num_global_devices)
  data = tokenize_split(config, tok, config.train_split)
  plan = make_train_plan(config, data, num_global_devices)
  logging.info("Training batches: %d per epoch, shapes %s.",
               plan.batches_per_epoch, plan.shapes)

  def generate():
    epoch, index = divmod(start_step, plan.batches_per_epoch)
    while True:
      batches = plan.epoch(epoch)
      for shape, entries in batches[index:]:
        block = _block(entries, process_index, process_count)
        yield batching.materialize(data, shape, len(block),
                                   *plan.row_examples(block), plan.packed)
      epoch, index = epoch + 1, 0

  return generate()


def eval_batches(config: ml_collections.ConfigDict, tok: Tokenizer,
                 split: str, batch_rows: int | None = None,
                 num_global_devices: int | None = None,
                 process_index: int | None = None,
                 process_count: int | None = None
                 ) -> list[dict[str, np.ndarray]]:
  """The whole split once, in the split's order, as this process's rows.

  Only examples longer than `config.max_len` tokens on a side are dropped
  (counted and logged). Each global batch holds `batch_rows` consecutive
  examples (rounded up to a multiple of the global device count; default:
  as many as `config.max_tokens` allows for the split's longest example, but
  at least one per device),
  the last one completed with all-zero rows, both sides padded to the
  smallest length of a fixed grid (multiples of 8 up to `config.max_len`)
  that holds the batch's longest sentence.

  Args:
    config: the run's config.
    tok: the shared tokenizer.
    split: the split to read, e.g. `config.eval_split`.
    batch_rows: examples per global batch.
    num_global_devices: as in `train_batches`.
    process_index: as in `train_batches`.
    process_count: as in `train_batches`.

  Returns:
    The list of this process's batches (same count on every process).
  """
  process_index, process_count, num_global_devices = _process_defaults(
      process_index, process_count, num_global_devices)
  data = tokenize_split(config, tok, split)
  ids = _kept(data, config.max_len, config.max_len, f"split {split!r}")
  if not len(ids):
    raise DataError(f"No example of split {split!r} fits config.max_len="
                    f"{config.max_len}.")
  grid = np.asarray(batching.length_grid(config.max_len))
  longest = np.maximum(data.inputs_lengths[ids], data.targets_lengths[ids])
  if batch_rows is None:
    # At least one row per device: a sentence longer than the training
    # limits (only config.max_len bounds evaluation) is evaluated, not
    # refused at the first evaluation of a run.
    length = int(grid[np.searchsorted(grid, longest.max())])
    batch_rows = max(config.max_tokens // length // num_global_devices,
                     1) * num_global_devices
  rows = batching.round_up(batch_rows, num_global_devices)
  batches = []
  for start in range(0, len(ids), rows):
    entries = np.full(rows, -1, np.int64)
    chunk = ids[start:start + rows]
    entries[:len(chunk)] = chunk
    length = int(grid[np.searchsorted(grid, longest[start:start + rows].max())])
    shape = batching.BatchShape(rows, length, length)
    block = _block(entries, process_index, process_count)
    batches.append(batching.materialize(
        data, shape, len(block), *batching.one_per_row(block), packed=False))
  return batches
