r"""Train step time around a checkpoint: synchronous vs asynchronous saving.

    python bench/checkpoint.py                 # the base model, ~2 min
    python bench/checkpoint.py --model=tiny    # a quick check, ~20 s

The trainer's own update (`train_step.CompiledUpdate`, state donated) runs
`--before` steps, then the step that saves a checkpoint, then `--after`
steps; each step's time is measured from its dispatch to its metrics on the
host (the loop fetches them at a save step), the save included in its step.
Two ways of saving alternate in one run (`--rounds` rounds each, medians
per step position):

* `synchronous` (the trainer before asynchronous saves): a host copy of the
  whole state (`devices.pmap_unreplicate`), then `checkpoints.save(...,
  wait=True)`, which returns once Orbax has written and renamed the step;
* `asynchronous` (the trainer now, `train_actions.Saver`): `devices.
  checkpoint_arrays` (device copies, no host copy here), then
  `checkpoints.save(..., wait=False)`, which returns once Orbax holds its
  host copy; the files are written by Orbax's background thread while the
  next steps run, and the run waits for the write only at the next save or
  at the end (`finish`, printed as "wait at the end").

Printed: the step times at each position, the time the save step adds over
the median step before it and the ratio of the two, the time the save step
and the steps after it add together (the background write shares the CPU
with them: on a host with few cores the write's work moves to the next
steps rather than vanishing), and the load average (the machine is
shared). Each save writes a new step into a temporary folder
that keeps one step; nothing is asserted about time.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench import common  # noqa: E402
from configs import base as base_config  # noqa: E402
from mha.store import checkpoints  # noqa: E402
from mha.model import optim  # noqa: E402
from mha.train.devices import checkpoint_arrays  # noqa: E402
from mha.train.devices import pmap_replicate  # noqa: E402
from mha.train.devices import pmap_unreplicate  # noqa: E402
from mha.train.devices import shard  # noqa: E402
from mha.train.actions import Saver  # noqa: E402
from mha.train.step import CompiledUpdate  # noqa: E402
from mha.train.step import init_state  # noqa: E402
from mha.model.transformer import create_model  # noqa: E402


def synchronous_save(manager, step: int, state) -> float:
  """The trainer's save before asynchronous saving: host copy, then a write
  that is waited for. Returns its seconds."""
  begin = time.perf_counter()
  checkpoints.save(manager, step, pmap_unreplicate(state),
                   {"step": step, "data_position": step,
                    "grad_accum_steps": 1}, force=True, wait=True)
  return time.perf_counter() - begin


def run_round(update, state, batch, mode: str, folder: str, first_step: int,
              args) -> tuple:
  """`before` steps, the saving step, `after` steps.

  Returns:
    (state, step seconds by position, save seconds, wait at the end).
  """
  manager = checkpoints.make_manager(folder, keep=1)
  saver = Saver(manager, start_step=0, start_position=0, grad_accum_steps=1)
  stop = np.zeros((jax.local_device_count(),), np.int32)
  times, save_seconds = [], 0.0
  for position in range(args.before + 1 + args.after):
    begin = time.perf_counter()
    state, metrics = update(state, [batch], stop)
    float(pmap_unreplicate(metrics)["loss"])
    if position == args.before:
      step = first_step + position
      if mode == "synchronous":
        save_seconds = synchronous_save(manager, step, state)
      else:
        save_seconds = saver(step, state)
    times.append(time.perf_counter() - begin)
  begin = time.perf_counter()
  saver.finish()
  wait = time.perf_counter() - begin
  manager.close()
  return state, times, save_seconds, wait


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="base", choices=("base", "tiny"),
                      help="configs/base.py (63M parameters, a 0.76 GB "
                      "state) or its `tiny` variant")
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--length", type=int, default=32)
  parser.add_argument("--before", type=int, default=2)
  parser.add_argument("--after", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--warmup", type=int, default=2,
                      help="untimed steps first (the first compiles)")
  parser.add_argument("--folder", default=None,
                      help="where checkpoints are written (default: a new "
                      "temporary folder, deleted at the end)")
  args = parser.parse_args()

  config = base_config.get_config("tiny" if args.model == "tiny" else None)
  model = create_model(config)
  tx = optim.create_optimizer(config)
  devices = jax.local_devices()
  state = pmap_replicate(init_state(config, model, tx), devices)
  size = sum(x.nbytes for x in jax.tree_util.tree_leaves(
      pmap_unreplicate(state)))
  update = CompiledUpdate(model, tx, config)
  rng = np.random.default_rng(0)
  rows = args.rows * len(devices)
  batch = shard({
      side: rng.integers(3, config.vocab_size, (rows, args.length),
                         dtype=np.int32) for side in ("inputs", "targets")},
                len(devices))
  stop = np.zeros((len(devices),), np.int32)
  print(common.machine_line())
  print(f"model {args.model}: state {size / 2**30:.2f} GiB; batch {rows} x "
        f"{args.length} per side; {args.before} steps, the saving step, "
        f"{args.after} steps; {args.rounds} round(s) of each way")
  for _ in range(args.warmup):  # the first compiles
    state, metrics = update(state, [batch], stop)
    float(pmap_unreplicate(metrics)["loss"])
  common.block(checkpoint_arrays(state))  # compiles the device copy
  modes = ("synchronous", "asynchronous")
  results = {m: [] for m in modes}
  with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
    step = 1
    for r in range(args.rounds):
      for mode in (modes if r % 2 == 0 else modes[::-1]):
        state, times, saved, wait = run_round(
            update, state, batch, mode, os.path.join(tmp, mode), step, args)
        step += len(times)
        results[mode].append((times, saved, wait))
        print(f"  round {r + 1} {mode:>12}: "
              + " ".join(f"{t:.2f}" for t in times)
              + f" s; save call {saved:.2f} s, wait at the end {wait:.2f} s")

  positions = [p - args.before for p in range(args.before + 1 + args.after)]
  print("\nmedian step time (s) by position (0 = the step that saves):")
  print(f"{'':>14}" + "".join(f"{p:>+8d}" for p in positions)
        + f"{'added':>8}{'added 0..':>11}{'wait':>6}")
  added, total = {}, {}
  for mode in modes:
    median = [statistics.median(t[i] for t, _, _ in results[mode])
              for i in range(len(positions))]
    baseline = statistics.median(median[:args.before])
    added[mode] = median[args.before] - baseline
    # The save step and the steps after it, over the baseline: the
    # background write competes with them for the CPU.
    total[mode] = sum(median[args.before:]) - baseline * (args.after + 1)
    wait = statistics.median(w for _, _, w in results[mode]) + 0.0
    print(f"{mode:>14}" + "".join(f"{t:8.2f}" for t in median)
          + f"{added[mode]:8.2f}{total[mode]:11.2f}{wait:6.2f}")
  ratio = added["synchronous"] / max(added["asynchronous"], 1e-3)
  print(f"\n(added: the save step over the median step before it; added "
        f"0..: the save step and the {args.after} after it, over that "
        f"median; wait: at the end of the run)")
  print(f"the save adds {added['synchronous']:.2f} s to its step "
        f"synchronously, {added['asynchronous']:.2f} s asynchronously "
        f"({ratio:.1f}x less); with the {args.after} steps after it "
        f"{total['synchronous']:.2f} s vs {total['asynchronous']:.2f} s; "
        f"load average {common.load_average():.2f}")


if __name__ == "__main__":
  main()
