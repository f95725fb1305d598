r"""Input-pipeline throughput on Multi30k: tokens per second of batches.

    python bench/input_pipeline.py                 # ../shared/data/multi30k
    python bench/input_pipeline.py --data_dir=/path/to/multi30k --seconds=10

Builds the SentencePiece vocabulary in a temporary workdir (timed), then for
max_tokens in {6700, 25000}, with and without packing, pulls training batches
for `--seconds` and prints batches/s, non-padding tokens/s (source + target)
and padded tokens/s (the array sizes), and the share of padding. Runs in
well under two minutes with the defaults.
"""
import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
# pylint: disable=g-import-not-at-top,wrong-import-position
from configs import base
from configs import multi30k
from mha import data
from mha.data import tokenized
# pylint: enable=g-import-not-at-top,wrong-import-position


def _measure(config, tok, num_devices: int, seconds: float) -> dict:
  """Pulls batches for `seconds`; returns counts and rates."""
  start = time.perf_counter()
  batches = data.train_batches(config, tok, process_index=0, process_count=1,
                               num_global_devices=num_devices)
  setup = time.perf_counter() - start
  count = real = padded = 0
  shapes = set()
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    batch = next(batches)
    count += 1
    for side in ("inputs", "targets"):
      real += int((batch[side] != data.PAD_ID).sum())
      padded += batch[side].size
    shapes.add(batch["inputs"].shape + batch["targets"].shape[1:])
  elapsed = time.perf_counter() - start
  return dict(setup=setup, batches=count / elapsed, real=real / elapsed,
              padded=padded / elapsed, fill=real / max(padded, 1),
              shapes=len(shapes), tokens_per_batch=real / max(count, 1))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=multi30k.default_data_dir(),
                      help="folder of {split}.{lang}[.gz] files")
  parser.add_argument("--source_lang", default="de")
  parser.add_argument("--target_lang", default="en")
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--max_corpus_chars", type=int, default=10_000_000)
  parser.add_argument("--max_length", type=int, default=128,
                      help="max_source_length = max_target_length (and the "
                      "row length when packing)")
  parser.add_argument("--max_tokens", default="6700,25000")
  parser.add_argument("--num_devices", type=int, default=8,
                      help="global device count (rows are a multiple of it)")
  parser.add_argument("--seconds", type=float, default=5.0,
                      help="measuring time per setting")
  parser.add_argument("--workdir", default=None,
                      help="default: a temporary folder (vocabulary rebuilt)")
  args = parser.parse_args(argv)
  if not os.path.isdir(args.data_dir):
    sys.exit(f"No Multi30k folder at {args.data_dir}: pass --data_dir or set "
             "MHA_MULTI30K_DIR.")

  config = base.get_config()
  config.update(dict(
      dataset_name="parallel_text", data_dir=args.data_dir,
      source_lang=args.source_lang, target_lang=args.target_lang,
      train_split="train", vocab_size=args.vocab_size,
      max_corpus_chars=args.max_corpus_chars, max_len=args.max_length,
      max_source_length=args.max_length, max_target_length=args.max_length))
  with tempfile.TemporaryDirectory() as tmp:
    workdir = args.workdir or tmp
    start = time.perf_counter()
    tok = data.get_tokenizer(config, workdir)
    build = time.perf_counter() - start
    start = time.perf_counter()
    split = tokenized.tokenize_split(config, tok, config.train_split)
    encode = time.perf_counter() - start
    print(f"Multi30k {args.source_lang}-{args.target_lang} train: "
          f"{len(split)} pairs, {len(split.inputs) + len(split.targets)} "
          f"tokens (EOS included)")
    print(f"tokenizer build (or load): {build:.2f} s (vocab "
          f"{tok.vocab_size}); tokenize train split (or read cache): "
          f"{encode:.2f} s")
    print(f"{'max_tokens':>10} {'pack':>5} {'setup s':>8} {'batches/s':>10} "
          f"{'tokens/s':>11} {'padded/s':>11} {'fill':>5} {'tok/batch':>9} "
          f"{'shapes':>6}")
    ratios = []
    for max_tokens in [int(x) for x in args.max_tokens.split(",")]:
      measured = {}
      for pack in (False, True):
        config.max_tokens, config.pack_examples = max_tokens, pack
        r = measured[pack] = _measure(config, tok, args.num_devices,
                                      args.seconds)
        print(f"{max_tokens:>10} {str(pack):>5} {r['setup']:>8.2f} "
              f"{r['batches']:>10.1f} {r['real']:>11,.0f} "
              f"{r['padded']:>11,.0f} {r['fill']:>5.2f} "
              f"{r['tokens_per_batch']:>9,.0f} {r['shapes']:>6}")
      ratios.append(
          f"max_tokens {max_tokens}, packed/unpacked: fill "
          f"{measured[True]['fill'] / measured[False]['fill']:.2f}x, "
          f"non-padding tokens per batch "
          f"{measured[True]['tokens_per_batch'] / measured[False]['tokens_per_batch']:.2f}x, "
          f"non-padding tokens/s "
          f"{measured[True]['real'] / measured[False]['real']:.2f}x")
    for line in ratios:
      print(line)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
  main()
