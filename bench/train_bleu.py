r"""The in-training BLEU's cost: its first call (compilation) and later ones.

    python bench/train_bleu.py --workdir=/tmp/m30k --sentences=100

Runs a training run's BLEU evaluation (`mha.train.evals.BeamBleu`: the
config's beam search on the first `--sentences` pairs of its `eval_split`)
`--calls` times on the workdir's last checkpoint, in a fresh process per
run with the compilation cache off (a training run's first evaluation on a
machine that has not compiled this search before), for two batchings in
turn, `--repeats` runs each:

* `one`: all the sentences in one batch, up to
  `train_evals.BLEU_ROWS_PER_DEVICE` search rows a device (the in-training
  BLEU's batching on one device before 2026-11-27; still its batching on
  several devices);
* `bleu_batch_size`: what the in-training BLEU uses now (on one device:
  batches of 64, searched as one with refilled rows).

Prints each run's first call, its later calls' median and the search's
compile time (XLA's backend compilation and JAX's trace, from
jax.monitoring), and checks that the two batchings give the same
translations. Nothing is asserted on a time: the figures go to
bench/README.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EVENTS = {"/jax/core/compile/backend_compile_duration": "compile",
           "/jax/core/compile/jaxpr_trace_duration": "trace"}


def run(args: argparse.Namespace, batching: str) -> dict:
  """One run in this process: the calls' seconds, compile and trace
  seconds, the number of batches and the translations."""
  # pylint: disable=import-outside-toplevel  (a fresh process per run)
  import jax
  jax.config.update("jax_enable_compilation_cache", False)
  seconds = {name: 0.0 for name in _EVENTS.values()}
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, duration, **_: event in _EVENTS and seconds.__setitem__(
          _EVENTS[event], seconds[_EVENTS[event]] + duration))
  import mha
  from mha import data
  from mha.search import texts as translate
  from mha.train import evals as train_evals
  translator = mha.load(args.workdir)
  config = translator.config
  sources, references = data.load_text_pairs(config, config.eval_split)
  sources = sources[:args.sentences]
  if batching == "one":
    batch_size = max(1, min(len(sources), train_evals.BLEU_ROWS_PER_DEVICE
                            * jax.local_device_count() // config.beam_size))
  else:
    batch_size = train_evals.bleu_batch_size(
        len(sources), config.beam_size, jax.local_device_count())
  params = translator.params.params
  calls = []
  for _ in range(args.calls):
    start = time.perf_counter()
    result = train_evals.evaluate_bleu(
        translator.model_config, params, translator.tokenizer, sources,
        references[:args.sentences], config, batch_size=batch_size)
    calls.append(time.perf_counter() - start)
  texts = translate.translate_texts(
      translator.model_config, params, translator.tokenizer, sources,
      beam_size=config.beam_size, alpha=config.alpha,
      max_decode_extra=config.max_decode_extra, batch_size=batch_size)
  encoded = translate.encode_sources(translator.tokenizer, sources,
                                     translator.model_config.max_len)
  batches = translate.make_batches(
      encoded, batch_size=batch_size, max_len=translator.model_config.max_len,
      max_decode_extra=config.max_decode_extra)
  return dict(calls=calls, bleu=result["eval_bleu"], texts=texts,
              batches=[list(b.inputs.shape) for b in batches], **seconds)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--sentences", type=int, default=100)
  parser.add_argument("--calls", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--one", choices=("one", "bleu_batch_size"),
                      help=argparse.SUPPRESS)  # a run (the child process)
  args = parser.parse_args()
  if args.one:
    print(json.dumps(run(args, args.one)))
    return
  print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
  results = {"one": [], "bleu_batch_size": []}
  for _ in range(args.repeats):
    for batching in results:
      out = subprocess.run(
          [sys.executable, __file__, f"--workdir={args.workdir}",
           f"--sentences={args.sentences}", f"--calls={args.calls}",
           f"--one={batching}"], cwd=ROOT, check=True, capture_output=True,
          text=True).stdout
      found = json.loads(out.strip().splitlines()[-1])
      results[batching].append(found)
      later = statistics.median(found["calls"][1:])
      print(f"{batching:>15}: batches {found['batches']}, first call "
            f"{found['calls'][0]:.2f} s (compile {found['compile']:.2f} s, "
            f"trace {found['trace']:.2f} s), later calls {later:.2f} s "
            f"(median), all {args.calls} calls {sum(found['calls']):.2f} s, "
            f"BLEU {found['bleu']:.2f}", flush=True)
  same = all(r["texts"] == results["one"][0]["texts"]
             for runs in results.values() for r in runs)
  print(f"translations identical in every run: {same}")
  old = [sum(r["calls"]) for r in results["one"]]
  new = [sum(r["calls"]) for r in results["bleu_batch_size"]]
  print("all calls, one / bleu_batch_size: "
        + ", ".join(f"{o / n:.2f}x" for o, n in zip(old, new)))
  print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
