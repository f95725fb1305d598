r"""Decoding speed: greedy and beam search, sentences/s and tokens/s.

    python bench/decode.py                            # random model, no workdir
    python bench/decode.py --workdir=/tmp/m30k        # a trained workdir
    python bench/decode.py --workdir=/tmp/m30k --split=val --num_sentences=200

Two modes, and the output says which one ran:

* `--workdir=DIR`: the workdir's latest checkpoint, config and vocabulary on
  `--split` (default: the config's `test_split`, `test_2016_flickr` for
  configs/multi30k.py). Real search: outputs end at EOS (or at input + the
  config's `max_decode_extra`). Reports BLEU too.
* no workdir: nothing is trained. A randomly initialised model of the
  Multi30k reference shape (configs/multi30k.py: 3+3 layers, d_model 256,
  4 heads, d_ff 1024, vocabulary 8,000) translates the Multi30k
  `test_2016_flickr` German sources ($MHA_MULTI30K_DIR, else
  ../shared/data/multi30k), tokenized with an 8,000-piece BPE SentencePiece
  trained here on the Multi30k training text (a few seconds). Without the
  corpus, random ids with Multi30k-like lengths are used. A random model does
  not stop at a sensible length, so EOS is disabled (eos_id=-1) and every
  output is forced to exactly its source's length (German sources and English
  references have similar token counts, both are printed), while the decode
  cache keeps eval.py's size (padded source + max_decode_extra 50 positions:
  the cost of beam search grows with it); tokens/s counts the forced tokens.

Each distinct batch shape is compiled (and run once) before timing, then
`--repeats` full passes are timed (the fastest is reported). Sentences are
decoded as `eval.py` does (`mha.translate`: length-sorted batches of
`--batch_size`, bucketed padding). Prints sentences/s and tokens/s for
greedy and for beam search and the greedy/beam speed ratio, then beam search
again in one stage (`first_stage_extra=None`: every step over the whole
input + 50 cache, as before the two-stage search) and the speed ratio of the
two, with a check that their outputs are identical.
"""
import argparse
import gzip
import io
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from configs import multi30k
from mha import data
from mha import evaluator
from mha import scoring
from mha import translate
from mha.errors import UserError
from mha.transformer import Transformer
from mha.transformer import TransformerConfig
# pylint: enable=g-import-not-at-top,wrong-import-position

REPO = pathlib.Path(__file__).resolve().parents[1]
TEST_SPLIT = "test_2016_flickr"
# google/flax examples/wmt at the configs/multi30k.py shape on this project's
# 2-core machine decoded Multi30k test at beam 4 at about 9 sentences/s; the
# target (issue 7) is twice that.
REFERENCE_BEAM_SENTENCES_PER_SEC = 9.0
TARGET_BEAM_SENTENCES_PER_SEC = 18.0


def multi30k_dir() -> pathlib.Path | None:
  """$MHA_MULTI30K_DIR, else ../shared/data/multi30k, if it holds the files."""
  env = os.environ.get("MHA_MULTI30K_DIR")
  candidates = [pathlib.Path(env)] if env else []
  candidates.append(REPO.parent / "shared" / "data" / "multi30k")
  for path in candidates:
    if (path / f"{TEST_SPLIT}.de.gz").exists():
      return path
  return None


def _read_gz(path: pathlib.Path) -> list[str]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return f.read().rstrip("\n").split("\n")


def _train_tokenizer(folder: pathlib.Path, vocab_size: int) -> data.Tokenizer:
  """A BPE SentencePiece on Multi30k's training text, the project's ids."""
  lines = _read_gz(folder / "train.de.gz") + _read_gz(folder / "train.en.gz")
  writer = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=writer,
      vocab_size=vocab_size, model_type="bpe", pad_id=data.PAD_ID,
      eos_id=data.EOS_ID, unk_id=2, bos_id=-1, character_coverage=1.0,
      num_threads=os.cpu_count() or 1, minloglevel=2)
  return data.Tokenizer(writer.getvalue())


def _timed(model_config, params, batches, num_sentences, *, beam_size,
           alpha, max_decode_extra, eos_id, repeats,
           first_stage_extra=translate.FIRST_STAGE_EXTRA):
  """Compiles every batch shape, then times `repeats` passes over `batches`."""
  kwargs = dict(beam_size=beam_size, alpha=alpha,
                max_decode_extra=max_decode_extra, eos_id=eos_id,
                first_stage_extra=first_stage_extra)
  start = time.perf_counter()
  seen = {}
  for batch in batches:
    seen.setdefault(batch.shape_key, batch)
  translate.decode_batches(model_config, params, list(seen.values()),
                           **kwargs)
  warmup = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    outputs = translate.decode_batches(model_config, params, batches,
                                       **kwargs)
    times.append(time.perf_counter() - start)
  seconds = min(times)
  tokens = 0
  for batch, out in zip(batches, outputs):
    out = out[:len(batch.indices)]
    if eos_id >= 0:  # up to and including EOS
      ends = np.where((out == eos_id).any(1), (out == eos_id).argmax(1) + 1,
                      (out != data.PAD_ID).sum(1))
      tokens += int(ends.sum())
    else:
      tokens += int((out != data.PAD_ID).sum())
  return {"seconds": seconds, "warmup_seconds": warmup,
          "num_shapes": len(seen), "tokens": tokens,
          "sentences_per_sec": num_sentences / seconds,
          "tokens_per_sec": tokens / seconds, "outputs": outputs}


def _random_setup(args):
  """Random multi30k-shaped model and Multi30k test sources (or random ids)."""
  config = multi30k.get_config()
  model_config = TransformerConfig.from_config(config, deterministic=True)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(Transformer(model_config).init)(
      jax.random.PRNGKey(0), dummy, dummy)["params"]
  folder = multi30k_dir()
  rng = np.random.default_rng(0)
  if folder is not None:
    start = time.perf_counter()
    tokenizer = _train_tokenizer(folder, config.vocab_size)
    sources = _read_gz(folder / f"{TEST_SPLIT}.de.gz")
    references = _read_gz(folder / f"{TEST_SPLIT}.en.gz")
    if args.num_sentences:
      sources = sources[:args.num_sentences]
      references = references[:args.num_sentences]
    encoded = translate.encode_sources(tokenizer, sources, model_config.max_len)
    ref_tokens = np.mean([len(tokenizer.encode(r)) + 1 for r in references])
    what = (f"Multi30k {TEST_SPLIT} German sources from {folder}, tokenized "
            f"with a {config.vocab_size}-piece BPE SentencePiece trained on "
            f"Multi30k train ({time.perf_counter() - start:.1f} s); English "
            f"references average {ref_tokens:.1f} tokens with EOS")
  else:
    n = args.num_sentences or 1000
    lengths = np.clip(np.round(rng.normal(15.0, 5.0, n)), 3, 40).astype(int)
    encoded = [list(rng.integers(3, config.vocab_size, k - 1)) + [data.EOS_ID]
               for k in lengths]
    what = ("random ids with Multi30k-like lengths (normal, mean 15, sd 5, "
            "3..40 tokens): Multi30k not found (set MHA_MULTI30K_DIR)")
  print(f"Random model (nothing trained): configs/multi30k.py shape, "
        f"{config.num_layers}+{config.num_layers} layers, d_model "
        f"{config.d_model}, {config.num_heads} heads, d_ff {config.d_ff}, "
        f"vocab {config.vocab_size}.")
  print(f"Data: {len(encoded)} sentences, {what}; sources average "
        f"{np.mean([len(e) for e in encoded]):.1f} tokens with EOS.")
  print("Outputs: EOS disabled (eos_id=-1), every output forced to exactly "
        "its source's token count; decode cache of padded source + "
        f"{config.max_decode_extra} positions as in eval.py.")
  return (model_config, params, encoded, None, None, config.alpha,
          config.max_decode_extra, 0, -1)


def _workdir_setup(args):
  """A trained workdir's latest checkpoint on a split."""
  try:
    config, tokenizer = evaluator.load_workdir(args.workdir)
    params, step, _ = evaluator.load_params(args.workdir)
  except UserError as e:
    sys.exit(f"bench/decode.py: {e}")
  split = args.split or config.test_split
  sources, references = data.load_text_pairs(config, split)
  if args.num_sentences:
    sources = sources[:args.num_sentences]
    references = references[:args.num_sentences]
  model_config = TransformerConfig.from_config(config, deterministic=True)
  encoded = translate.encode_sources(tokenizer, sources, model_config.max_len)
  print(f"Trained model: {args.workdir} step {step} "
        f"({config.num_layers} layers, d_model {config.d_model}, vocab "
        f"{config.vocab_size}); split {split}: {len(sources)} sentences, "
        f"sources average {np.mean([len(e) for e in encoded]):.1f} tokens "
        f"with EOS.")
  print(f"Outputs: real search, ending at EOS or at input + "
        f"{config.max_decode_extra} tokens; tokens/s counts output tokens up "
        "to and including EOS.")
  return (model_config, params, encoded, tokenizer, references, config.alpha,
          config.max_decode_extra, config.max_decode_extra, data.EOS_ID)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default=None,
                      help="a trained workdir; default: a random model")
  parser.add_argument("--split", default=None,
                      help="with --workdir; default: its config's test_split")
  parser.add_argument("--num_sentences", type=int, default=0,
                      help="0 = the whole split (Multi30k test: 1,000)")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=1)
  args = parser.parse_args()

  total_start = time.perf_counter()
  setup = _workdir_setup if args.workdir else _random_setup
  # cache_extra sizes the decode cache (batch.max_decode_len), extra limits
  # each output to its source length + extra.
  (model_config, params, encoded, tokenizer, references, alpha, cache_extra,
   extra, eos_id) = setup(args)
  batches = translate.make_batches(
      encoded, batch_size=args.batch_size, max_len=model_config.max_len,
      max_decode_extra=cache_extra)
  print(f"{len(batches)} batches of up to {args.batch_size} sentences; "
        f"{jax.device_count()} {jax.default_backend()} device(s), load "
        f"average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.")
  results = {}
  beam_name = f"beam {args.beam_size}"
  one_stage = f"{beam_name}, one stage"
  for name, beam, stage in (
      ("greedy", 1, translate.FIRST_STAGE_EXTRA),
      (beam_name, args.beam_size, translate.FIRST_STAGE_EXTRA),
      (one_stage, args.beam_size, None)):
    r = _timed(model_config, params, batches, len(encoded), beam_size=beam,
               alpha=alpha, max_decode_extra=extra, eos_id=eos_id,
               repeats=args.repeats, first_stage_extra=stage)
    results[name] = r
    line = (f"{name:>18}: {r['sentences_per_sec']:7.1f} sentences/s "
            f"{r['tokens_per_sec']:8.1f} tokens/s ({r['tokens']} tokens, "
            f"{r['seconds']:.2f} s per pass; {r['num_shapes']} shapes "
            f"compiled in {r['warmup_seconds']:.1f} s)")
    if tokenizer is not None:
      hypotheses = [""] * len(encoded)
      for batch, out in zip(batches, r["outputs"]):
        for row, i in enumerate(batch.indices):
          hypotheses[i] = tokenizer.decode(out[row])
      line += f"  BLEU {scoring.score(hypotheses, references)['bleu']:.2f}"
    print(line, flush=True)
  greedy, beam = results["greedy"], results[beam_name]
  single = results[one_stage]
  same = all(np.array_equal(a, b) for a, b in zip(beam["outputs"],
                                                  single["outputs"]))
  print(f"greedy/beam {args.beam_size} speed ratio: "
        f"{greedy['sentences_per_sec'] / beam['sentences_per_sec']:.2f}x "
        f"(sentences/s), "
        f"{greedy['tokens_per_sec'] / beam['tokens_per_sec']:.2f}x "
        f"(tokens/s).")
  print(f"two-stage/one-stage beam {args.beam_size} speed ratio: "
        f"{single['seconds'] / beam['seconds']:.2f}x (first stage: padded "
        f"source + {translate.FIRST_STAGE_EXTRA} positions, then source + "
        f"{cache_extra}); outputs {'identical' if same else 'DIFFER'}; "
        f"total {time.perf_counter() - total_start:.0f} s.")
  speed = beam["sentences_per_sec"]
  print(f"beam {args.beam_size}: {speed:.1f} sentences/s = "
        f"{speed / REFERENCE_BEAM_SENTENCES_PER_SEC:.2f}x the reference "
        f"point's {REFERENCE_BEAM_SENTENCES_PER_SEC:g} (google/flax "
        f"examples/wmt, beam 4, same shape and machine); target "
        f">= {TARGET_BEAM_SENTENCES_PER_SEC:g}"
        + ("" if args.workdir else
           " (the target is for a trained model: run with --workdir)") + ".")


if __name__ == "__main__":
  main()
