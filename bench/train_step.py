r"""Training speed: tokens/s, FLOP/s and MFU of the pmapped train step.

    python bench/train_step.py                       # both shapes, < 5 min
    python bench/train_step.py --shapes=reference --breakdown
    python bench/train_step.py --batching=synthetic  # no Multi30k needed
    python bench/train_step.py --baseline=HEAD~3     # that commit vs now

The process restarts itself once with glibc's huge-page tunable
(`mha/runtime/host_memory.py`; `--no-huge_pages` keeps 4 KiB pages).
`--baseline=REV` imports REV's `mha/` under another name and times its train
step and this tree's in turn, round by round, on the same batches (both under
the same machine load), with XLA's temporary memory of each compiled step.

Two model shapes, each timed with the trainer's own update function
(`train_step.CompiledUpdate`: `make_train_step` pmapped over the local devices,
state donated), after a warm-up call that compiles each batch shape:

* `reference`: the google/flax examples/wmt shape (configs/multi30k.py): 3+3
  layers, d_model 256, 4 heads, d_ff 1024, one shared 8,000-piece vocabulary,
  ~7.6M parameters, on real Multi30k batches (`data.train_batches`) from
  $MHA_MULTI30K_DIR or ../shared/data/multi30k, `max_tokens` 4,096 per side,
  the tokens of one of configs/multi30k.py's updates (its `max_tokens` times
  its `grad_accum_steps`) as one batch: by default packed rows of 64 tokens (its
  `pack_examples`; one batch shape, ~7,500 non-padding source + target
  tokens per step). `--batching=bucket`: the paper's length buckets instead,
  one shape per bucket; the `--num_shapes` most frequent buckets (about 85%
  of an epoch's batches) are timed and their figures combined with the
  epoch's bucket frequencies (before 2026-11-23 22:00 UTC the default, with
  `--max_tokens=4480`: ~6,700 non-padding tokens per step, flax's batch).
  Reference point: flax examples/wmt on this machine, 3.9 s/step, ~1,700
  non-padding tokens/s. Target: >= 2,300 non-padding tokens/s.
* `base`: the paper's base model (6+6 layers, d_model 512, 8 heads, d_ff 2048,
  37,000 shared vocabulary, ~63M parameters) on one synthetic batch of 64
  rows x 32 tokens per side (2,048 tokens each side, no padding). Target: >=
  50% model-FLOP utilisation (MFU).

Model FLOPs per step are counted analytically from the padded shapes
(`mha/model/flops.py: training_flops`). The figure is cross-checked against
XLA's own count (`lower(...).cost_analysis()['flops']` of the pmapped step,
which also counts element-wise work). Achieved FLOP/s = model FLOPs / median
step time; MFU = achieved / the measured float32 peak of this process (a jitted
2048 x 2048 `jnp.dot` on the same device, best of 9 runs, measured at the start
and after each shape; the best of all is used, since other processes only slow
it down). "MFU best step" uses the fastest timed step instead of the median.

`--breakdown` also times the step's parts for the most frequent shape: the
forward pass with the loss as the train step computes it (in chunks, whose
forward pass also computes the loss's gradient with respect to the logits),
forward + backward (`make_grad_step`), and the
optimizer update (`make_apply_step`), each pmapped alone. `--profile` traces
two steps with `jax.profiler` and sums XLA's op times by category (attention
projections, feed-forward, vocabulary projection, loss, layer norm, dropout,
...), from each op's source metadata in the optimized HLO.
"""
import argparse
import collections
import dataclasses
import glob
import gzip
import importlib
import json
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench import common  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import base as base_configs  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import multi30k  # pylint: disable=g-import-not-at-top,wrong-import-position
import mha  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.runtime import host_memory  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model import flops  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model import optim  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.train import devices  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.train import step as train_step  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model.transformer import create_model  # pylint: disable=g-import-not-at-top,wrong-import-position

REFERENCE_TOKENS_PER_SEC = 1700   # flax examples/wmt, this machine
REFERENCE_SECONDS_PER_STEP = 3.9  # flax examples/wmt, this machine
TARGET_TOKENS_PER_SEC = 2300      # reference shape, non-padding
TARGET_MFU = 0.5                  # base shape


def _met(ok: bool) -> str:
  return "met" if ok else "NOT met"


def count_params(params) -> tuple[int, int]:
  """(all parameters, parameters outside the embedding matrix)."""
  return (common.count_params(params),
          common.count_params(params, skip="embedding"))


class Peak:
  """The float32 matmul peak, measured again after each shape: the best
  of all measurements is used, since other processes only slow it down."""

  def __init__(self, size: int):
    self.size = size
    self.best = 0.0

  def measure(self, when: str) -> None:
    best, median = common.matmul_peak_flops(self.size)
    self.best = max(self.best, best)
    print(f"float32 matmul peak {when} ({self.size}x{self.size} jnp.dot, "
          f"9 runs): best {common.fmt_si(best, 'FLOP/s')}, median "
          f"{common.fmt_si(median, 'FLOP/s')}; load average "
          f"{common.load_average():.2f}")


@dataclasses.dataclass
class ShapeResult:
  """Figures of one batch shape."""
  shape: tuple[int, int, int]   # rows, source length, target length
  frequency: float              # share of the epoch's batches
  seconds: float                # median step time
  times: list[float]
  first_call: float             # compile + first step
  nonpad: float                 # mean non-padding tokens per timed step
  padded: int                   # padded tokens per step (both sides)
  flops: float                  # analytic model FLOPs per step
  xla_flops: float              # XLA cost analysis of the pmapped step


def reference_config(args, config_arg: str | None = None) -> tuple:
  """(config, [batch dicts] of one epoch, description) of the reference;
  `config_arg`: configs/multi30k.py's argument (e.g. 'tiny')."""
  config = multi30k.get_config(config_arg)
  # One batch per update: the step timed is the fused train step.
  config.update(max_tokens=args.max_tokens or (config.max_tokens *
                                               config.grad_accum_steps),
                grad_accum_steps=1, seed=0)
  if args.data_dir:
    config.data_dir = args.data_dir
  have_data = os.path.exists(os.path.join(config.data_dir, "train.de.gz"))
  if args.batching == "synthetic" or not have_data:
    if args.batching != "synthetic":
      print(f"No Multi30k at {config.data_dir}: synthetic packed batches.")
    return config, synthetic_batches(config, 64, 64, 64, seed=0,
                                     fill=0.82), "synthetic 64x64, 82% full"
  if args.batching:
    config.pack_examples = args.batching == "pack"
  os.makedirs(args.workdir, exist_ok=True)
  start = time.perf_counter()
  tok = data.get_tokenizer(config, args.workdir)
  batches = data.train_batches(config, tok, process_index=0, process_count=1,
                               num_global_devices=jax.device_count())
  # The plan of epoch 0; the iterator is infinite.
  plan = data.pipeline.make_train_plan(
      config, data.tokenized.tokenize_split(config, tok, config.train_split),
      jax.device_count())
  epoch = [next(batches) for _ in range(plan.batches_per_epoch)]
  print(f"Multi30k {config.data_dir}: {len(epoch)} batches per epoch "
        f"(max_tokens {config.max_tokens}, "
        f"{'packed' if config.pack_examples else 'bucketed'}), tokenizer and "
        f"plan in {time.perf_counter() - start:.1f} s")
  return config, epoch, ("Multi30k " + ("packed" if config.pack_examples
                                        else "token-budget buckets"))


def shape_setup(name: str, args, config_arg: str | None = None) -> tuple:
  """(config, [batch dicts], description) of the shape `name`.

  Args:
    name: 'reference' (configs/multi30k.py, `reference_config`) or 'base'
      (configs/base.py on synthetic `--base_rows` x `--base_length` batches).
    args: the command's flags (`make_parser`).
    config_arg: the config file's argument (e.g. 'tiny'), None: its default.
  """
  if name == "reference":
    config, epoch, description = reference_config(args, config_arg)
  elif name == "base":
    config = base_configs.get_config(config_arg)
    epoch = synthetic_batches(config, args.base_rows, args.base_length,
                              args.base_length, seed=1,
                              count=args.warmup + args.steps)
    description = (f"synthetic {args.base_rows}x{args.base_length} "
                   "per side, no padding")
  else:
    raise ValueError(f"Unknown shape {name!r}; known: reference, base.")
  config.attention_impl = args.attention_impl
  return config, epoch, description


def synthetic_batches(config, rows: int, source_len: int, target_len: int,
                      seed: int, fill: float = 1.0, count: int = 8):
  """`count` batches of random ids; rows are `fill` full (rest padding)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    batch = {}
    for side, length in (("inputs", source_len), ("targets", target_len)):
      ids = rng.integers(3, config.vocab_size, (rows, length), dtype=np.int32)
      keep = np.arange(length)[None, :] < rng.integers(
          max(1, int(length * (2 * fill - 1))), length + 1, (rows, 1))
      batch[side] = np.where(keep if fill < 1 else True, ids, 0).astype(
          np.int32)
    out.append(batch)
  return out


def nonpad(batch) -> int:
  return int((batch["inputs"] > 0).sum() + (batch["targets"] > 0).sum())


def padded(batch) -> int:
  return int(batch["inputs"].size + batch["targets"].size)


def measure_shape(update, state, batches, model_cfg, frequency, args):
  """Times `update` on `batches` (all of one shape); returns the new state."""
  num_devices = jax.local_device_count()
  stop = np.zeros((num_devices,), np.int32)
  sharded = [devices.shard(b, num_devices) for b in batches]
  rows, s = batches[0]["inputs"].shape
  t = batches[0]["targets"].shape[1]
  p_step = update._train_step  # pylint: disable=protected-access
  xla = p_step.lower(state, sharded[0], stop).cost_analysis()
  xla = xla[0] if isinstance(xla, list) else xla
  start = time.perf_counter()
  state, metrics = update(state, [sharded[0]], stop)
  common.block(metrics)
  first = time.perf_counter() - start
  for i in range(1, args.warmup):
    state, metrics = update(state, [sharded[i % len(sharded)]], stop)
    common.block(metrics)
  times, tokens = [], []
  for i in range(args.steps):
    batch = sharded[(args.warmup + i) % len(sharded)]
    start = time.perf_counter()
    state, metrics = update(state, [batch], stop)
    common.block((state, metrics))
    times.append(time.perf_counter() - start)
    tokens.append(nonpad(batches[(args.warmup + i) % len(batches)]))
  result = ShapeResult(
      shape=(rows, s, t), frequency=frequency,
      seconds=statistics.median(times), times=times, first_call=first,
      nonpad=float(np.mean(tokens)), padded=rows * (s + t),
      flops=flops.training_flops(model_cfg, rows, s, t),
      xla_flops=float(xla.get("flops", float("nan"))) * num_devices)
  return state, result


def breakdown(model, tx, config, state, batch, args):
  """Median seconds of the forward pass + loss, forward + backward, and the
  optimizer update, each pmapped alone on `batch` (one shape)."""
  num_devices = jax.local_device_count()
  sharded = devices.shard(batch, num_devices)
  grad_step = train_step.make_grad_step(model, config)
  apply_step = train_step.make_apply_step(tx, config)

  def forward(state, batch):
    loss, _ = train_step._loss_sums(  # pylint: disable=protected-access
        model, config, state["params"], batch,
        train_step._dropout_rng(state, 0),  # pylint: disable=protected-access
        chunked=True)  # as the train step computes it
    return loss

  p_forward = jax.pmap(forward, axis_name=devices.AXIS)
  p_grad = jax.pmap(grad_step, axis_name=devices.AXIS)
  p_apply = jax.pmap(apply_step, axis_name=devices.AXIS)
  micro = np.zeros((num_devices,), np.int32)
  stop = np.zeros((num_devices,), np.int32)
  grads, sums = p_grad(state, sharded, micro)
  parts = {"forward + loss": lambda: p_forward(state, sharded),
           "forward + backward": lambda: p_grad(state, sharded, micro),
           "optimizer (psum, Adam)": lambda: p_apply(state, grads, sums,
                                                     stop)}
  return {name: common.median_seconds(fn, repeats=max(args.steps, 5))
          for name, fn in parts.items()}


# Categories of the profile: the first rule whose words occur in an op's
# `op_name` metadata (its jax source: module path and primitive) wins.
_CATEGORIES = (
    ("vocabulary projection and loss (chunked)", ("projected_token_sums",)),
    ("loss: log_softmax, smoothing", ("log_softmax", "losses")),
    ("optimizer (Adam, psum)", ("adam", "apply_updates", "psum", "global_norm",
                                "scale_by", "noam")),
    ("layer norm", ("layer_norm",)),
    ("residual / embedding dropout", ("Dropout",)),
    ("feed-forward matmuls", ("ffn",)),
    ("attention QKᵀ, AV", ("BQHD,BKHD", "BHQK,BKHV")),
    ("attention Q, K, V, O projections", ("BLM,MHD", "BQHV,HVM")),
    ("attention softmax and mask", ("attention",)),
    ("embedding gather, positions", ("embed", "positions", "gather")),
)


def _category(op_name: str, name: str) -> str:
  for category, words in _CATEGORIES:
    if any(w in op_name for w in words):
      return category
  if not op_name:
    return "unattributed (" + re.sub(r"[.\d]+$", "", name) + ")"
  # e.g. the accuracy's argmax: jit(_fun)/jvp()/reduce
  return "other: " + op_name.rsplit("/", 1)[-1]


def profile(update, state, batch, steps: int = 2) -> None:
  """Traces `steps` train steps (jax.profiler, Perfetto JSON) and prints the
  time of XLA's ops summed by category (op metadata of the optimized HLO)."""
  num_devices = jax.local_device_count()
  sharded = devices.shard(batch, num_devices)
  stop = np.zeros((num_devices,), np.int32)
  compiled = update._train_step.lower(  # pylint: disable=protected-access
      state, sharded, stop).compile()
  op_names = dict(re.findall(
      r'^\s*%?([\w.\-]+) = .*?metadata=\{op_name="([^"]*)"',
      compiled.as_text(), re.M))
  state, metrics = compiled(state, sharded, stop)
  common.block(metrics)
  with tempfile.TemporaryDirectory() as logdir:
    with jax.profiler.trace(logdir, create_perfetto_trace=True):
      for _ in range(steps):
        state, metrics = compiled(state, sharded, stop)
        common.block((state, metrics))
    path = glob.glob(os.path.join(logdir, "**", "*.trace.json.gz"),
                     recursive=True)[0]
    with gzip.open(path) as f:
      events = json.load(f)["traceEvents"]
  totals = collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") == "X" and name in op_names:
      totals[_category(op_names[name], name)] += e.get("dur", 0) / 1e6
  total = sum(totals.values())
  print(f"profile ({steps} steps traced; op time summed over XLA's threads, "
        f"{total / steps:.3f} s per step):")
  for category, seconds in totals.most_common():
    if seconds / total >= 0.002:
      print(f"  {category:40s} {seconds / steps:7.3f} s "
            f"{seconds / total:6.1%}")
  return state


def _most_frequent_shapes(epoch, n: int):
  """(number of batch shapes in `epoch`, the batches of its `n` most
  frequent shapes, one list a shape, the most frequent first)."""
  by_shape = {}
  for b in epoch:
    by_shape.setdefault((b["inputs"].shape, b["targets"].shape), []).append(b)
  ranked = sorted(by_shape.values(), key=len, reverse=True)
  return len(by_shape), ranked[:n]


def run_shape(name, config, epoch, description, peak, args):
  """Builds the model and optimizer of `config`, times it, prints figures."""
  model = create_model(config)
  tx = optim.create_optimizer(config)
  state = devices.pmap_replicate(train_step.init_state(config, model, tx),
                                 jax.local_devices())
  sizes = count_params(devices.pmap_unreplicate(state["params"]))
  # The trainer's own update: make_train_step pmapped, state donated.
  update = train_step.CompiledUpdate(model, tx, config)

  num_shapes, chosen = _most_frequent_shapes(epoch, args.num_shapes)
  results = []
  with common.CompileCounter() as compiles:
    for group in chosen:
      state, r = measure_shape(update, state, group, model.config,
                               len(group) / len(epoch), args)
      results.append(r)
  epoch_nonpad = np.mean([nonpad(b) for b in epoch])
  peak.measure(f"after {name}")

  print(f"\n== {name}: {_model_line(model.config, *sizes)}; {description}; "
        f"attention_impl {model.config.attention_impl}; "
        f"{jax.local_device_count()} device(s)")
  print(f"epoch: {len(epoch)} batches in {num_shapes} shapes, mean "
        f"{epoch_nonpad:.0f} non-padding tokens per step; timed the "
        f"{len(chosen)} most frequent shapes "
        f"({sum(r.frequency for r in results):.0%} of the batches), "
        f"{args.steps} steps each after {args.warmup} warm-up")
  _print_shapes(results, peak.best)
  summary = _summary(results, peak.best, compiles)
  _print_summary(name, summary)
  if args.breakdown:
    _print_breakdown(breakdown(model, tx, config, state, chosen[0][0], args),
                     results[0])
  if args.profile:
    state = profile(update, state, chosen[0][0])
  return summary


def _model_line(model_cfg, n_params: int, n_nonembed: int) -> str:
  """The model's shape and parameter counts, for the shape's heading."""
  return (f"{model_cfg.num_encoder_layers}+{model_cfg.num_decoder_layers} "
          f"layers, d_model {model_cfg.d_model}, {model_cfg.num_heads} heads, "
          f"d_ff {model_cfg.d_ff}, vocab {model_cfg.vocab_size}; "
          f"{n_params / 1e6:.2f}M parameters ({n_nonembed / 1e6:.2f}M outside "
          "the embedding)")


def _print_shapes(results, best: float) -> None:
  """The table of the timed batch shapes' figures (MFU against `best`)."""
  print(common.table(
      ["batch rows x src+tgt", "share", "non-pad tok", "padded tok",
       "step min/med/max", "1st call", "non-pad tok/s", "padded tok/s",
       "model FLOPs", "XLA/model", "achieved", "MFU", "MFU best step"],
      [[f"{r.shape[0]}x{r.shape[1]}+{r.shape[2]}", f"{r.frequency:.0%}",
        f"{r.nonpad:.0f}", f"{r.padded}", common.percentiles(r.times),
        f"{r.first_call:.1f} s",
        f"{r.nonpad / r.seconds:.0f}", f"{r.padded / r.seconds:.0f}",
        common.fmt_si(r.flops, "FLOP"), f"{r.xla_flops / r.flops:.2f}",
        common.fmt_si(r.flops / r.seconds, "FLOP/s"),
        f"{r.flops / r.seconds / best:.1%}",
        f"{r.flops / min(r.times) / best:.1%}"] for r in results]))


def _summary(results, best: float, compiles) -> dict[str, float]:
  """The timed shapes' figures weighted by their shares of the epoch."""
  weight = np.array([r.frequency for r in results])
  seconds = float(np.dot(weight, [r.seconds for r in results]))
  tokens = float(np.dot(weight, [r.nonpad for r in results]))
  pad_tokens = float(np.dot(weight, [r.padded for r in results]))
  flops = float(np.dot(weight, [r.flops for r in results]))
  return {
      "seconds_per_step": seconds / weight.sum(),
      "nonpad_per_step": tokens / weight.sum(),
      "nonpad_tokens_per_sec": tokens / seconds,
      "padded_tokens_per_sec": pad_tokens / seconds,
      "achieved_flops": flops / seconds,
      "mfu": flops / seconds / best,
      "mfu_best": float(np.dot(weight, [r.flops for r in results]) / np.dot(
          weight, [min(r.times) for r in results]) / best),
      "compiles": compiles.count,
      "compile_seconds": compiles.seconds,
      "shapes": len(results),
  }


def _print_summary(name: str, summary: dict[str, float]) -> None:
  """The weighted figures, the compilations and the shape's target."""
  print(f"weighted over the timed shapes: {summary['seconds_per_step']:.2f} "
        f"s/step, {summary['nonpad_per_step']:.0f} non-padding tokens/step, "
        f"{summary['nonpad_tokens_per_sec']:.0f} non-padding tokens/s, "
        f"{summary['padded_tokens_per_sec']:.0f} padded tokens/s, "
        f"{common.fmt_si(summary['achieved_flops'], 'FLOP/s')} = "
        f"{summary['mfu']:.1%} MFU")
  print(f"train-step compilations: {summary['compiles']} for "
        f"{summary['shapes']} batch shape(s) "
        f"({summary['compile_seconds']:.1f} s compiling)")
  if name == "reference":
    print(f"reference point (flax examples/wmt): {REFERENCE_SECONDS_PER_STEP} "
          f"s/step, ~{REFERENCE_TOKENS_PER_SEC} non-padding tokens/s -> "
          f"{summary['nonpad_tokens_per_sec'] / REFERENCE_TOKENS_PER_SEC:.2f}"
          f"x; target >= {TARGET_TOKENS_PER_SEC}: "
          f"{_met(summary['nonpad_tokens_per_sec'] >= TARGET_TOKENS_PER_SEC)}")
  else:
    print(f"target >= {TARGET_MFU:.0%} MFU: "
          f"{_met(summary['mfu'] >= TARGET_MFU)}")


def _print_breakdown(parts, first) -> None:
  """`breakdown`'s parts beside the most frequent shape's (`first`) step."""
  step = first.seconds
  print(f"breakdown at {first.shape[0]}x{first.shape[1]}+{first.shape[2]} "
        f"(step {step:.3f} s):")
  for part, (sec, times) in parts.items():
    print(f"  {part:24s} median {sec:.3f} s, best {min(times):.3f} s "
          f"({sec / step:.0%} of the median step)")


def _build(pkg, config):
  """(update, state, model config) of package `pkg` (this tree's mha or a
  revision's) for `config`."""
  model = pkg.transformer.create_model(config)
  tx = pkg.optim.create_optimizer(config)
  if hasattr(pkg, "train_step"):  # trainer.py split (issue 31) and later
    state = pkg.devices.pmap_replicate(
        pkg.train_step.init_state(config, model, tx), jax.local_devices())
    update = pkg.train_step.CompiledUpdate(model, tx, config)
  else:  # a revision before: all in trainer.py
    state = pkg.trainer.replicate(pkg.trainer.init_state(config, model, tx),
                                  jax.local_devices())
    update = pkg.trainer._Updater(  # pylint: disable=protected-access
        model, tx, config)
  return update, state, model.config


def _temp_memory(update, state, batch, stop) -> int:
  """XLA's temporary bytes of `update`'s step compiled for `batch`."""
  compiled = update._train_step.lower(  # pylint: disable=protected-access
      state, batch, stop).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def compare_shape(name, config, epoch, packages, peak, args):
  """Times each package's train step in turn, round by round, on the same
  batches (both see the same machine load); prints one row per batch shape.
  """
  _, groups = _most_frequent_shapes(epoch, args.num_shapes)
  num_devices = jax.local_device_count()
  stop = np.zeros((num_devices,), np.int32)
  runs = {label: _build(pkg, config) for label, pkg in packages.items()}
  rows, weights, seconds = [], [], {label: [] for label in runs}
  flops_all = []
  for group in groups:
    sharded = [devices.shard(b, num_devices) for b in group]
    rows_, s = group[0]["inputs"].shape
    t = group[0]["targets"].shape[1]
    times = {label: [] for label in runs}
    temp = {label: _temp_memory(update, state, sharded[0], stop)
            for label, (update, state, _) in runs.items()}
    for i in range(args.warmup + args.steps):
      order = list(runs) if i % 2 == 0 else list(reversed(runs))
      for label in order:
        update, state, model_cfg = runs[label]
        start = time.perf_counter()
        state, metrics = update(state, [sharded[i % len(sharded)]], stop)
        common.block((state, metrics))
        if i >= args.warmup:
          times[label].append(time.perf_counter() - start)
        runs[label] = (update, state, model_cfg)
    step_flops = flops.training_flops(runs[list(runs)[-1]][2], rows_, s, t)
    base_label, new_label = list(runs)
    ratio = statistics.median(
        a / b for a, b in zip(times[base_label], times[new_label]))
    medians = {label: statistics.median(v) for label, v in times.items()}
    rows.append((f"{rows_}x{s}+{t}", len(group) / len(epoch), medians, ratio,
                 step_flops, temp))
    weights.append(len(group) / len(epoch))
    flops_all.append(step_flops)
    for label in runs:
      seconds[label].append(medians[label])
  peak.measure(f"after {name}")
  labels = list(runs)
  peak_best = max(peak.best, 1.0)  # the best of every measurement so far
  rows = [[batch, f"{share:.0%}"] + [f"{medians[label]:.3f}" for label in runs]
          + [f"{ratio:.2f}x"]
          + [f"{step_flops / medians[label] / peak_best:.1%}"
             for label in runs]
          + [common.fmt_bytes(temp[label]) for label in runs]
          for batch, share, medians, ratio, step_flops, temp in rows]
  print(f"\n== {name}: {labels[0]} vs {labels[1]}, in turn, "
        f"{args.steps} rounds after {args.warmup} warm-up; load average "
        f"{common.load_average():.2f}")
  print(common.table(
      ["batch", "share"] + [f"{label} s/step" for label in labels]
      + ["speed-up (median per round)"] + [f"{label} MFU" for label in labels]
      + [f"{label} XLA temp memory" for label in labels], rows))
  w = np.array(weights)
  summary = {label: float(np.dot(w, flops_all) / np.dot(w, seconds[label])
                          / max(peak.best, 1.0)) for label in labels}
  print("weighted MFU: " + ", ".join(f"{label} {mfu:.1%}"
                                     for label, mfu in summary.items()))
  return summary


def make_parser() -> argparse.ArgumentParser:
  """The command's flags (bench/accelerator.py takes their defaults too)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shapes", default="reference,base",
                      help="comma-separated: reference, base")
  parser.add_argument("--batching", default=None,
                      choices=("bucket", "pack", "synthetic"),
                      help="reference batches: Multi30k token-budget "
                      "buckets, Multi30k packed rows, or synthetic ids "
                      "(default: configs/multi30k.py's pack_examples)")
  parser.add_argument("--max_tokens", type=int, default=None,
                      help="reference token budget per side (default: "
                      "configs/multi30k.py's max_tokens x grad_accum_steps)")
  parser.add_argument("--num_shapes", type=int, default=2,
                      help="reference: time the N most frequent bucket shapes")
  parser.add_argument("--base_rows", type=int, default=64)
  parser.add_argument("--base_length", type=int, default=32)
  parser.add_argument("--attention_impl", default="einsum",
                      choices=("einsum", "xla"))
  parser.add_argument("--warmup", type=int, default=1,
                      help="untimed calls per shape (the first compiles)")
  parser.add_argument("--steps", type=int, default=3,
                      help="timed steps per shape (median reported)")
  parser.add_argument("--breakdown", action="store_true",
                      help="also time forward, backward and optimizer alone")
  parser.add_argument("--profile", action="store_true",
                      help="trace 2 steps of the most frequent shape and "
                      "print the op time by category")
  parser.add_argument("--data_dir", default=None,
                      help="default: configs/multi30k.py's data_dir")
  parser.add_argument("--workdir", default="/tmp/mha_bench_multi30k",
                      help="where the 8k SentencePiece model and the "
                      "tokenized split are cached")
  parser.add_argument("--peak_size", type=int, default=2048)
  parser.add_argument("--huge_pages", action=argparse.BooleanOptionalAction,
                      default=True,
                      help="restart with glibc.malloc.hugetlb=1 "
                      "(mha/runtime/host_memory.py); --no-huge_pages keeps "
                      "4 KiB pages")
  parser.add_argument("--baseline", default=None,
                      help="a git revision (e.g. HEAD~3): time its mha/ and "
                      "this tree's in turn, round by round, on the same "
                      "batches, and print both and their ratio")
  return parser


def main():
  args = make_parser().parse_args()
  args.warmup = max(args.warmup, 1)
  # The commands' rule (mha/runtime/host_memory.py), forced on or off by the
  # flag.
  os.environ[host_memory.ENV] = "1" if args.huge_pages else "0"
  host_memory.start()

  start = time.perf_counter()
  print(common.machine_line())
  print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; GLIBC_TUNABLES="
        f"{os.environ.get('GLIBC_TUNABLES', '')!r} (huge pages "
        f"{'on' if host_memory.huge_pages_enabled() else 'off'})")
  peak = Peak(args.peak_size)
  peak.measure("start")
  if args.baseline:
    baseline = common.import_revision(args.baseline, tempfile.mkdtemp())
    importlib.import_module(baseline.__name__ + ".trainer")
  summaries = {}
  for name in [s.strip() for s in args.shapes.split(",") if s.strip()]:
    config, epoch, description = shape_setup(name, args)
    if args.baseline:
      summaries[name] = compare_shape(
          name, config, epoch, {args.baseline: baseline, "this tree": mha},
          peak, args)
      continue
    summaries[name] = run_shape(name, config, epoch, description, peak, args)
  if args.baseline:
    return
  print(f"\nload average {common.load_average():.2f} at the end; total "
        f"{time.perf_counter() - start:.0f} s; float32 matmul peak (best "
        f"of every measurement) {common.fmt_si(peak.best, 'FLOP/s')}")
  print(common.table(
      ["shape", "s/step", "non-pad tok/step", "non-pad tok/s", "padded tok/s",
       "achieved", "MFU", "MFU best step", "compiles/shapes"],
      [[name, f"{s['seconds_per_step']:.2f}", f"{s['nonpad_per_step']:.0f}",
        f"{s['nonpad_tokens_per_sec']:.0f}",
        f"{s['padded_tokens_per_sec']:.0f}",
        common.fmt_si(s["achieved_flops"], "FLOP/s"), f"{s['mfu']:.1%}",
        f"{s['mfu_best']:.1%}", f"{s['compiles']}/{s['shapes']}"]
       for name, s in summaries.items()]))


if __name__ == "__main__":
  main()
