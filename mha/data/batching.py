"""Token-budget batch plans and their materialization (numpy only).

A plan decides, from the sentence lengths alone, which examples form each
global batch of each epoch; every process computes the same plan, so the
global batch at step k never depends on the number of processes. Process i of
P then materializes only rows [i * B / P, (i + 1) * B / P) of each global
batch of B rows.

* `BucketPlan`: examples grouped by length into buckets on a geometric grid
  of padded lengths (multiples of 8, ratio ~1.25, ending at the longest
  allowed length); the bucket of padded length g has
  rows = max_tokens // g rounded down to a multiple of the global device
  count, so rows * padded_len <= max_tokens on each side and there is one
  batch shape per bucket. Each epoch shuffles the examples within buckets and
  the order of batches, from (seed, epoch). The last batch of a bucket is
  completed with all-zero rows, so no example is dropped or repeated within
  an epoch and the number of batches per epoch is the same every epoch.
* `PackPlan`: several examples per row of fixed lengths (one batch shape).
  Examples are packed once per seed (first fit over a small window of open
  rows, in a seeded random order); each epoch shuffles the packed rows into
  batches from (seed, epoch). The number of batches per epoch is therefore
  fixed too, which makes resuming at any step cheap.

What `max_tokens` counts (`count`, config.max_tokens_counts):

* "padded" (default): padded positions, rows * padded_len <= max_tokens on
  each side; a bucketed batch of Multi30k is ~77% real tokens, so the
  update holds fewer real tokens than the budget says.
* "real": real (non-padding) tokens, as the paper's "approximately 25000
  source tokens and 25000 target tokens" count them: a bucket (or, packed,
  the plan) gets the rows whose expected real tokens on its longer side
  fill the budget, max_tokens // mean real length (per example of the
  bucket, or per packed row), rounded down to a multiple of the device
  count. Batch shapes stay fixed; a batch's real count varies around the
  budget with the examples drawn, and its padded size exceeds it.

Rows are lists of example ids; `materialize` gathers their tokens with
vectorized numpy indexing.
"""
import dataclasses

import numpy as np

from mha.data.tokenized import TokenizedSplit
from mha.errors import DataError
from mha.validation import TOKEN_COUNTS

LENGTH_MULTIPLE = 8
BUCKET_RATIO = 1.25
_PACK_WINDOW = 8  # Open rows a new example may join when packing.


@dataclasses.dataclass(frozen=True)
class BatchShape:
  """Shape of a global batch: inputs [rows, inputs_length], targets [rows,
  targets_length]."""
  rows: int
  inputs_length: int
  targets_length: int


def ceil_div(n: int, d: int) -> int:
  """⌈n / d⌉ for integers, d > 0."""
  return -(-n // d)


def round_up(n: int, multiple: int) -> int:
  """The smallest multiple of `multiple` that is >= n."""
  return ceil_div(n, multiple) * multiple


def padded_cap(max_length: int, model_max_len: int) -> int:
  """The padded length for sentences of at most `max_length` tokens: rounded
  up to a multiple of 8 unless that exceeds the model's `max_len`."""
  if max_length > model_max_len:
    raise DataError(f"A length limit of {max_length} tokens exceeds "
                    f"config.max_len={model_max_len}, the longest position "
                    "the model encodes.")
  return max(max_length, min(round_up(max_length, LENGTH_MULTIPLE),
                             model_max_len))


def length_grid(max_length: int) -> tuple[int, ...]:
  """Padded lengths: 8, 16, 24, 32, 40, 56, 72, 96, 120, 152, ... up to and
  ending at `max_length`."""
  grid, g = [], LENGTH_MULTIPLE
  while g < max_length:
    grid.append(g)
    g = max(g + LENGTH_MULTIPLE,
            round_up(int(np.ceil(g * BUCKET_RATIO)), LENGTH_MULTIPLE))
  grid.append(max_length)
  return tuple(grid)


def rows_for(max_tokens: int, length: int, num_devices: int) -> int:
  """max_tokens // length, rounded down to a multiple of num_devices."""
  rows = (max_tokens // length) // num_devices * num_devices
  if rows == 0:
    raise DataError(
        f"config.max_tokens={max_tokens} cannot hold one row of {length} "
        f"tokens per device on {num_devices} devices; raise max_tokens to at "
        f"least {length * num_devices} or lower the length limits.")
  return rows


def real_rows_for(max_tokens: int, inputs_lengths: np.ndarray,
                  targets_lengths: np.ndarray, num_devices: int) -> int:
  """Rows whose expected real tokens fill `max_tokens` on the longer side:
  max_tokens // max(mean source length, mean target length), rounded down
  to a multiple of num_devices (the lengths are of one row each)."""
  mean = max(float(np.mean(inputs_lengths)), float(np.mean(targets_lengths)))
  rows = int(max_tokens // mean) // num_devices * num_devices
  if rows == 0:
    raise DataError(
        f"config.max_tokens={max_tokens} real tokens cannot hold one row of "
        f"{mean:.0f} tokens on average per device on {num_devices} devices; "
        f"raise max_tokens to at least {int(np.ceil(mean)) * num_devices}.")
  return rows


def _check_count(count: str) -> None:
  if count not in TOKEN_COUNTS:
    raise DataError(f"config.max_tokens_counts must be one of "
                    f"{TOKEN_COUNTS}, got {count!r}.")


def one_per_row(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(row index, example id) of rows holding one example id each (-1 =
  empty row)."""
  rows = np.flatnonzero(entries >= 0)
  return rows, entries[rows]


def _split_into_batches(entries: np.ndarray, rows: int) -> np.ndarray:
  """[n] entries -> [ceil(n / rows), rows], the last completed with -1."""
  num = ceil_div(len(entries), rows)
  out = np.full(num * rows, -1, dtype=np.int64)
  out[:len(entries)] = entries
  return out.reshape(num, rows)


class BucketPlan:
  """Length-bucketed batches of single examples.

  Attributes:
    shapes: the batch shape of each non-empty bucket.
    batches_per_epoch: number of global batches in every epoch.
  """
  packed = False

  def __init__(self, example_ids: np.ndarray, inputs_lengths: np.ndarray,
               targets_lengths: np.ndarray, *, max_tokens: int,
               inputs_cap: int, targets_cap: int, num_devices: int,
               seed: int, count: str = "padded"):
    """Groups examples by length.

    Args:
      example_ids: [n] ids (indices into the tokenized split) to batch.
      inputs_lengths: [n] source lengths of those examples, <= inputs_cap.
      targets_lengths: [n] target lengths, <= targets_cap.
      max_tokens: token budget of a global batch, each side.
      inputs_cap: padded length of the longest sources.
      targets_cap: padded length of the longest targets.
      num_devices: global device count; rows are a multiple of it.
      seed: shuffling seed.
      count: what max_tokens counts, "padded" or "real" (module doc).
    """
    _check_count(count)
    self.seed = seed
    grid = length_grid(max(inputs_cap, targets_cap))
    bucket = np.searchsorted(grid, np.maximum(inputs_lengths,
                                              targets_lengths))
    if len(bucket) and count == "padded":  # the real minimum, named once
      rows_for(max_tokens, grid[int(bucket.max())], num_devices)
    self.shapes, self._members = [], []
    for b in np.unique(bucket):
      g, members = grid[b], bucket == b
      rows = (rows_for(max_tokens, g, num_devices) if count == "padded" else
              real_rows_for(max_tokens, inputs_lengths[members],
                            targets_lengths[members], num_devices))
      self.shapes.append(BatchShape(rows, min(g, inputs_cap),
                                    min(g, targets_cap)))
      self._members.append(np.asarray(example_ids)[members])
    self._num_batches = [ceil_div(len(m), s.rows)
                         for m, s in zip(self._members, self.shapes)]
    self.batches_per_epoch = sum(self._num_batches)

  def epoch(self, epoch: int) -> list[tuple[BatchShape, np.ndarray]]:
    """The global batches of `epoch`: (shape, [rows] example ids, -1 = none).
    """
    rng = np.random.default_rng([self.seed, 0, epoch])
    batches = []
    for shape, members in zip(self.shapes, self._members):
      for entries in _split_into_batches(rng.permutation(members), shape.rows):
        batches.append((shape, entries))
    return [batches[i] for i in rng.permutation(len(batches))]

  def row_examples(self, entries: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(row index, example id) of each example in rows `entries`."""
    return one_per_row(entries)


def pack(inputs_lengths: np.ndarray, targets_lengths: np.ndarray,
         order: np.ndarray, inputs_length: int, targets_length: int
         ) -> list[list[int]]:
  """Packs examples into rows: first fit over the last few open rows.

  Args:
    inputs_lengths: [n] source lengths, each <= inputs_length.
    targets_lengths: [n] target lengths, each <= targets_length.
    order: the order in which examples are placed (a permutation of n).
    inputs_length: source tokens per row.
    targets_length: target tokens per row.

  Returns:
    Rows as lists of positions (into the length arrays), in packing order.
  """
  inputs_lengths = inputs_lengths.tolist()
  targets_lengths = targets_lengths.tolist()
  rows, open_rows = [], []  # open row: [free inputs, free targets, members]
  for i in order.tolist():
    a, b = inputs_lengths[i], targets_lengths[i]
    for row in open_rows:
      if row[0] >= a and row[1] >= b:
        row[0] -= a
        row[1] -= b
        row[2].append(i)
        break
    else:
      open_rows.append([inputs_length - a, targets_length - b, [i]])
      if len(open_rows) > _PACK_WINDOW:
        rows.append(open_rows.pop(0)[2])
  rows.extend(row[2] for row in open_rows)
  return rows


class PackPlan:
  """Batches of packed rows: several examples per row, one batch shape.

  Attributes:
    shapes: the one batch shape.
    batches_per_epoch: number of global batches in every epoch.
    num_rows: number of packed rows per epoch.
  """
  packed = True

  def __init__(self, example_ids: np.ndarray, inputs_lengths: np.ndarray,
               targets_lengths: np.ndarray, *, max_tokens: int,
               inputs_length: int, targets_length: int, num_devices: int,
               seed: int, count: str = "padded"):
    """Packs the examples (same arguments as `BucketPlan`; the row lengths
    `inputs_length`, `targets_length` replace the caps)."""
    _check_count(count)
    self.seed = seed
    order = np.random.default_rng([seed, 1]).permutation(len(example_ids))
    packed = pack(inputs_lengths, targets_lengths, order, inputs_length,
                  targets_length)
    if count == "padded":
      rows = rows_for(max_tokens, max(inputs_length, targets_length),
                      num_devices)
    else:  # the real tokens of each packed row
      rows = real_rows_for(
          max_tokens, [sum(inputs_lengths[i] for i in r) for r in packed],
          [sum(targets_lengths[i] for i in r) for r in packed], num_devices)
    self.shapes = [BatchShape(rows, inputs_length, targets_length)]
    self._row_offsets = np.cumsum([0] + [len(r) for r in packed])
    self._row_members = np.asarray(example_ids)[
        np.fromiter((i for r in packed for i in r), np.int64,
                    self._row_offsets[-1])]
    self.num_rows = len(packed)
    self.batches_per_epoch = ceil_div(self.num_rows, rows)

  def epoch(self, epoch: int) -> list[tuple[BatchShape, np.ndarray]]:
    """The global batches of `epoch`: (shape, [rows] packed-row ids, -1 =
    empty row)."""
    rng = np.random.default_rng([self.seed, 0, epoch])
    batches = _split_into_batches(rng.permutation(self.num_rows),
                                  self.shapes[0].rows)
    return [(self.shapes[0], entries) for entries in batches]

  def row_examples(self, entries: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(row index, example id) of each example in rows `entries`, in row
    order and, within a row, in segment order."""
    rows = np.flatnonzero(entries >= 0)
    starts = self._row_offsets[entries[rows]]
    counts = self._row_offsets[entries[rows] + 1] - starts
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts,
                                                 counts)
    return (np.repeat(rows, counts),
            self._row_members[np.repeat(starts, counts) + within])


def _fill_side(flat: np.ndarray, offsets: np.ndarray, rows: np.ndarray,
               ids: np.ndarray, num_rows: int, length: int, packed: bool
               ) -> dict[str, np.ndarray]:
  """Tokens (and segment ids, positions when packed) of one side."""
  lengths = offsets[ids + 1] - offsets[ids]
  ends = np.cumsum(lengths)
  starts = ends - lengths
  rep = np.repeat(np.arange(len(ids)), lengths)
  within = np.arange(int(ends[-1]) if len(ids) else 0) - starts[rep]
  if packed:
    first = np.searchsorted(rows, rows, side="left")  # first example of row
    column = (starts - starts[first])[rep] + within
    segment = (np.arange(len(ids)) - first + 1)[rep]
  else:
    column = within
  out_rows = rows[rep]
  tokens = np.zeros((num_rows, length), np.int32)
  tokens[out_rows, column] = flat[offsets[ids][rep] + within]
  result = {"": tokens}
  if packed:
    seg = np.zeros((num_rows, length), np.int32)
    seg[out_rows, column] = segment
    pos = np.zeros((num_rows, length), np.int32)
    pos[out_rows, column] = within
    result["_segmentation"], result["_position"] = seg, pos
  return result


def materialize(data: TokenizedSplit, shape: BatchShape, num_rows: int,
                rows: np.ndarray, ids: np.ndarray, packed: bool
                ) -> dict[str, np.ndarray]:
  """The arrays of a block of `num_rows` rows of a global batch.

  Args:
    data: the tokenized split.
    shape: the global batch's shape (its lengths are used).
    num_rows: rows of the block.
    rows: [m] row (in the block) of each example, ascending.
    ids: [m] example ids; within a row, in segment order.
    packed: whether to return segment ids and positions.

  Returns:
    `inputs` [len(entries), shape.inputs_length] and `targets` [...,
    shape.targets_length], int32, 0 = padding; with a packed plan also
    `inputs_segmentation`, `targets_segmentation` (1, 2, ... per example in
    the row, 0 = padding) and `inputs_position`, `targets_position`
    (0-based position within each example).
  """
  batch = {}
  for side, flat, offsets, length in (
      ("inputs", data.inputs, data.inputs_offsets, shape.inputs_length),
      ("targets", data.targets, data.targets_offsets, shape.targets_length)):
    for suffix, array in _fill_side(flat, offsets, rows, ids, num_rows,
                                    length, packed).items():
      batch[side + suffix] = array
  return batch
