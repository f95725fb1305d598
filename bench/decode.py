r"""Decoding speed: greedy and beam search on a trained workdir's test split.

    python bench/decode.py --workdir=workdirs/quickstart
    python bench/decode.py --workdir=/tmp/m30k --split=test_2016_flickr

Translates the split (or its first --num_sentences sentences) once to compile
every batch shape, then times --repeats full passes for greedy search and for
beam search, and prints sentences/s, generated tokens/s (non-pad output
tokens, EOS included), the beam/greedy cost ratio and the BLEU of each pass.
The reference point: flax examples/wmt decoded the 1,000 Multi30k test
sentences at about 9 sentences/s with beam 4 on this 2-core CPU; the target is
18 sentences/s.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mha import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha import evaluator  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha import workdir as workdir_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.transformer import TransformerConfig  # pylint: disable=g-import-not-at-top,wrong-import-position


def measure(model_config, params, tokenizer, sources, references, *,
            beam_size, alpha, max_decode_extra, batch_size, repeats):
  kwargs = dict(beam_size=beam_size, alpha=alpha,
                max_decode_extra=max_decode_extra, batch_size=batch_size)
  evaluator.translate_texts(model_config, params, tokenizer, sources,
                            **kwargs)  # compiles every shape
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    hypotheses = evaluator.translate_texts(model_config, params, tokenizer,
                                           sources, **kwargs)
    times.append(time.perf_counter() - start)
  seconds = statistics.median(times)
  tokens = sum(len(tokenizer.encode(h)) + 1 for h in hypotheses)
  bleu = evaluator.score(hypotheses, references)["bleu"]
  return {"seconds": seconds, "sentences_per_sec": len(sources) / seconds,
          "tokens_per_sec": tokens / seconds, "bleu": bleu}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="workdirs/quickstart")
  parser.add_argument("--split", default=None,
                      help="default: the workdir config's test_split")
  parser.add_argument("--num_sentences", type=int, default=0,
                      help="0 = the whole split")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()

  if not os.path.exists(os.path.join(args.workdir, "config.json")):
    sys.exit(f"{args.workdir} is not a trained workdir; run the README's "
             "quickstart first or pass --workdir.")
  config = workdir_lib.load_config(args.workdir)
  split = args.split or config.test_split
  sources, references = data.load_text_pairs(config, split)
  if args.num_sentences:
    sources = sources[:args.num_sentences]
    references = references[:args.num_sentences]
  tokenizer = data.get_tokenizer(config, args.workdir)
  params, step, _ = evaluator.load_params(args.workdir)
  model_config = TransformerConfig.from_config(config, deterministic=True)
  print(f"workdir {args.workdir} step {step}, split {split}: "
        f"{len(sources)} sentences, batch {args.batch_size}, "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
  results = {}
  for name, beam in (("greedy", 1), (f"beam {args.beam_size}",
                                     args.beam_size)):
    results[name] = measure(
        model_config, params, tokenizer, sources, references,
        beam_size=beam, alpha=config.alpha,
        max_decode_extra=config.max_decode_extra,
        batch_size=args.batch_size, repeats=args.repeats)
    r = results[name]
    print(f"{name:>8}: {r['sentences_per_sec']:8.1f} sentences/s "
          f"{r['tokens_per_sec']:9.1f} tokens/s  ({r['seconds']:.2f} s per "
          f"pass)  BLEU {r['bleu']:.2f}")
  greedy, beam = results["greedy"], results[f"beam {args.beam_size}"]
  print(f"beam/greedy time ratio: {beam['seconds'] / greedy['seconds']:.2f}; "
        f"beam {args.beam_size} vs the 18 sentences/s target: "
        f"{beam['sentences_per_sec'] / 18.0:.2f}x")


if __name__ == "__main__":
  main()
