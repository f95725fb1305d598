"""Token-budget batches: limits, epochs, resume, processes, packing, eval."""
import collections
import itertools

import numpy as np
import pytest

from configs import base
from mha import data
from mha.data import batching
from mha.data import pipeline
from mha.data.tokenized import tokenize_split

NUM_DEVICES = 4


def _config(**changes):
  config = base.get_config("tiny")
  config.update(dict(dataset_name="synthetic", source_lang="src",
                     target_lang="tgt", vocab_size=100, max_tokens=1024,
                     max_source_length=24, max_target_length=28, max_len=32))
  config.update(changes)
  return config


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return data.get_tokenizer(_config(), str(tmp_path_factory.mktemp("work")))


def _batches(config, tok, start=0, count=None, **kwargs):
  kwargs = dict(dict(process_index=0, process_count=1,
                     num_global_devices=NUM_DEVICES), **kwargs)
  iterator = data.train_batches(config, tok, start_step=start, **kwargs)
  return list(itertools.islice(iterator, count))


def _plan(config, tok):
  split = tokenize_split(config, tok, config.train_split)
  return split, pipeline.make_train_plan(config, split, NUM_DEVICES)


def _rows(batch, packed=False):
  """The (source ids, target ids) of each example of a batch."""
  pairs = []
  for i in range(batch["inputs"].shape[0]):
    if not packed:
      source = batch["inputs"][i][batch["inputs"][i] != 0]
      target = batch["targets"][i][batch["targets"][i] != 0]
      if len(source):
        pairs.append((tuple(source), tuple(target)))
      continue
    for segment in range(1, batch["inputs_segmentation"][i].max() + 1):
      pairs.append(tuple(
          tuple(batch[side][i][batch[f"{side}_segmentation"][i] == segment])
          for side in ("inputs", "targets")))
  return pairs


def _expected(split, config):
  """All (source, target) id tuples within the length limits."""
  return collections.Counter(
      (tuple(split.inputs_of(i)), tuple(split.targets_of(i)))
      for i in range(len(split))
      if (len(split.inputs_of(i)) <= config.max_source_length
          and len(split.targets_of(i)) <= config.max_target_length))


@pytest.mark.parametrize("pack", [False, True])
def test_epoch_covers_each_example_once_within_budget(tok, pack):
  config = _config(pack_examples=pack)
  split, plan = _plan(config, tok)
  expected = _expected(split, config)
  assert 0 < len(split) - sum(expected.values()) < len(split) // 2  # dropped
  seen = collections.Counter()
  shapes = set()
  for batch in _batches(config, tok, count=plan.batches_per_epoch):
    rows, ls = batch["inputs"].shape
    lt = batch["targets"].shape[1]
    shapes.add((rows, ls, lt))
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
    assert rows % NUM_DEVICES == 0
    assert rows * ls <= config.max_tokens and rows * lt <= config.max_tokens
    assert ls <= config.max_len and lt <= config.max_len
    seen.update(_rows(batch, pack))
  assert seen == expected  # no example lost or duplicated
  assert all(len(s) <= config.max_source_length
             and len(t) <= config.max_target_length for s, t in seen)
  assert all(s[-1] == data.EOS_ID and t[-1] == data.EOS_ID for s, t in seen)
  assert shapes <= {(s.rows, s.inputs_length, s.targets_length)
                    for s in plan.shapes}
  assert len(plan.shapes) <= (1 if pack else 4)


def test_bucket_shapes_follow_the_grid():
  assert batching.length_grid(256) == (8, 16, 24, 32, 40, 56, 72, 96, 120,
                                       152, 192, 240, 256)
  assert batching.length_grid(32) == (8, 16, 24, 32)
  assert batching.length_grid(50) == (8, 16, 24, 32, 40, 50)
  assert batching.rows_for(25_000, 56, 8) == 440
  assert batching.padded_cap(50, 64) == 56
  assert batching.padded_cap(50, 52) == 52
  with pytest.raises(data.DataError, match="config.max_len=40"):
    batching.padded_cap(50, 40)
  with pytest.raises(data.DataError, match="config.max_tokens=100"):
    batching.rows_for(100, 32, 4)
  # A length on the grid goes to its own bucket, not the next one up.
  lengths = np.array([8, 16, 24])
  plan = batching.BucketPlan(np.arange(3), lengths, lengths, max_tokens=96,
                             inputs_cap=24, targets_cap=24, num_devices=1,
                             seed=0)
  assert [(s.rows, s.inputs_length, s.targets_length)
          for s in plan.shapes] == [(12, 8, 8), (6, 16, 16), (4, 24, 24)]
  # The shorter side is padded to its own cap, not to the bucket's length:
  # a 30-token target puts the pair in bucket 32, its 20-token source is
  # padded to 24 (96 // 32 = 3 rows).
  plan = batching.BucketPlan(np.arange(1), np.array([20]), np.array([30]),
                             max_tokens=96, inputs_cap=24, targets_cap=32,
                             num_devices=1, seed=0)
  assert [(s.rows, s.inputs_length, s.targets_length)
          for s in plan.shapes] == [(3, 24, 32)]


def test_epochs_reshuffle_and_repeat(tok):
  config = _config()
  _, plan = _plan(config, tok)
  first = plan.epoch(0)
  second = plan.epoch(1)
  assert len(first) == len(second) == plan.batches_per_epoch
  assert not all(np.array_equal(a[1], b[1]) for a, b in zip(first, second))
  # The order of the batches is shuffled too, not only the rows within a
  # bucket: the buckets' batches come interleaved, in another order each
  # epoch.
  orders = [[shape for shape, _ in epoch] for epoch in (first, second)]
  assert orders[0] != orders[1]
  assert orders[0] != sorted(orders[0], key=plan.shapes.index)
  other_seed = pipeline.make_train_plan(
      _config(seed=1), tokenize_split(config, tok, "train"), NUM_DEVICES)
  assert not np.array_equal(other_seed.epoch(0)[0][1], first[0][1])


@pytest.mark.parametrize("pack", [False, True])
def test_restart_at_step_k_gives_identical_batches(tok, pack):
  config = _config(pack_examples=pack)
  _, plan = _plan(config, tok)
  k = plan.batches_per_epoch - 3  # the resumed run crosses an epoch boundary
  uninterrupted = _batches(config, tok, count=k + 6)[k:]
  resumed = _batches(config, tok, start=k, count=6)
  assert len(resumed) == 6
  for a, b in zip(uninterrupted, resumed):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  # Far into training: starting there equals the plan of that epoch.
  step = 5 * plan.batches_per_epoch + 7
  (late,) = _batches(config, tok, start=step, count=1)
  (again,) = _batches(config, tok, start=step, count=1)
  np.testing.assert_array_equal(late["inputs"], again["inputs"])


@pytest.mark.parametrize("pack", [False, True])
def test_two_processes_split_the_global_batch(tok, pack):
  config = _config(pack_examples=pack)
  _, plan = _plan(config, tok)
  steps = plan.batches_per_epoch
  single = _batches(config, tok, count=steps)
  shards = [_batches(config, tok, count=steps, process_index=p,
                     process_count=2) for p in range(2)]
  examples = [collections.Counter(), collections.Counter()]
  for k in range(steps):
    for key in single[k]:
      np.testing.assert_array_equal(
          np.concatenate([shards[0][k][key], shards[1][k][key]]),
          single[k][key])
    assert shards[0][k]["inputs"].shape[0] % (NUM_DEVICES // 2) == 0
    for p in range(2):
      examples[p].update(_rows(shards[p][k], pack))
  assert not set(examples[0]) & set(examples[1])  # disjoint
  split = tokenize_split(config, tok, "train")
  assert examples[0] + examples[1] == _expected(split, config)  # covering


def test_packing_matches_the_unpacked_examples(tok):
  config = _config(pack_examples=True, max_source_length=64,
                   max_target_length=64, max_len=64, max_tokens=2048)
  split = tokenize_split(config, tok, "train")
  lookup = {tuple(split.inputs_of(i)): tuple(split.targets_of(i))
            for i in range(len(split))}
  segments_per_row = []
  for batch in _batches(config, tok, count=20):
    assert set(batch) == {
        "inputs", "targets", "inputs_segmentation", "targets_segmentation",
        "inputs_position", "targets_position"}
    for side in ("inputs", "targets"):
      tokens, seg, pos = (batch[side], batch[f"{side}_segmentation"],
                          batch[f"{side}_position"])
      assert tokens.shape == seg.shape == pos.shape == (32, 64)
      np.testing.assert_array_equal(tokens != 0, seg != 0)  # no pad inside
      for i in range(tokens.shape[0]):
        ids = seg[i][seg[i] != 0]
        # Segments are 1, 2, ... contiguous and in order, then padding.
        assert np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1)
        assert not ids.size or ids[0] == 1
        assert np.all(seg[i][len(ids):] == 0)
        for s in range(1, (ids.max() if ids.size else 0) + 1):
          np.testing.assert_array_equal(pos[i][seg[i] == s],
                                        np.arange((seg[i] == s).sum()))
    for i in range(batch["inputs"].shape[0]):
      n = batch["inputs_segmentation"][i].max()
      assert n == batch["targets_segmentation"][i].max()
      segments_per_row.append(n)
    for source, target in _rows(batch, packed=True):
      assert lookup[source] == target  # the pairs stay aligned
  assert np.mean([n for n in segments_per_row if n]) > 1.5


def test_examples_that_fill_a_row_exactly_share_it():
  # Rows of 8 + 8 tokens: example 1 (4 + 3) fills what example 0 (4 + 5)
  # left of its row to the last token on both sides; example 2 needs a row
  # of its own.
  assert batching.pack(np.array([4, 4, 8]), np.array([5, 3, 8]),
                       np.arange(3), 8, 8) == [[0, 1], [2]]


def test_default_process_arguments_come_from_jax(tok):
  import jax  # pylint: disable=g-import-not-at-top
  batch = next(data.train_batches(_config(), tok))
  assert batch["inputs"].shape[0] % jax.device_count() == 0


def test_bad_process_arguments(tok):
  with pytest.raises(ValueError, match="process_index=2"):
    _batches(_config(), tok, process_index=2, process_count=2)
  with pytest.raises(ValueError, match="not a multiple of process_count=3"):
    _batches(_config(), tok, process_index=0, process_count=3)
  with pytest.raises(data.DataError, match="No example of split 'train'"):
    _batches(_config(max_source_length=2), tok)


def test_eval_batches_whole_split_in_order(tok):
  config = _config(max_len=24)
  split = tokenize_split(config, tok, "validation")
  longest = np.maximum(split.inputs_lengths, split.targets_lengths)
  kept = np.flatnonzero(longest <= 24)
  assert 0 < len(kept) < len(split)  # some are too long for max_len
  batches = data.eval_batches(config, tok, "validation", batch_rows=30,
                              num_global_devices=NUM_DEVICES,
                              process_index=0, process_count=1)
  rows = []
  for batch in batches:
    assert set(batch) == {"inputs", "targets"}
    assert batch["inputs"].shape[0] == 32  # 30 rounded up to 4 devices
    assert batch["inputs"].shape == batch["targets"].shape
    assert batch["inputs"].shape[1] in batching.length_grid(24)
    rows.extend(_rows(batch))
  assert rows == [(tuple(split.inputs_of(i)), tuple(split.targets_of(i)))
                  for i in kept]
  # Only the last batch has all-zero rows.
  assert all(np.all(b["inputs"][:, 0] != 0) for b in batches[:-1])
  assert np.all(batches[-1]["inputs"][len(kept) % 32:] == 0)
  halves = [data.eval_batches(config, tok, "validation", batch_rows=30,
                              num_global_devices=NUM_DEVICES,
                              process_index=p, process_count=2)
            for p in range(2)]
  for whole, first, second in zip(batches, *halves):
    np.testing.assert_array_equal(
        np.concatenate([first["targets"], second["targets"]]),
        whole["targets"])


def test_eval_batches_default_rows_respect_the_budget(tok):
  config = _config(max_len=64)  # long enough for every test sentence
  batches = data.eval_batches(config, tok, "test",
                              num_global_devices=NUM_DEVICES,
                              process_index=0, process_count=1)
  assert sum(len(_rows(b)) for b in batches) == 500
  for batch in batches:
    assert batch["inputs"].size <= config.max_tokens
    assert batch["inputs"].shape[0] % NUM_DEVICES == 0


def test_each_eval_batch_is_padded_to_its_own_longest_sentence(tok):
  """An evaluation batch's length is the smallest grid length that holds
  its own longest sentence, not the split's longest."""
  config = _config(max_len=64)
  grid = batching.length_grid(64)
  batches = data.eval_batches(config, tok, "test", batch_rows=16,
                              num_global_devices=NUM_DEVICES,
                              process_index=0, process_count=1)
  lengths = set()
  for batch in batches:
    longest = max((batch[side] != 0).sum(axis=1).max()
                  for side in ("inputs", "targets"))
    want = min(g for g in grid if g >= longest)
    assert batch["inputs"].shape[1] == batch["targets"].shape[1] == want
    lengths.add(want)
  assert len(lengths) > 1  # the batches differ: the check means something
