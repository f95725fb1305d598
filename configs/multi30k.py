r"""German -> English on Multi30k (29,000 training pairs of image captions).

    python train.py --config=configs/multi30k.py --workdir=/tmp/m30k
    python eval.py --workdir=/tmp/m30k --average_last=5

Reads `{train,val,test_2016_flickr}.{de,en}.gz` through the project's
`parallel_text` TFDS builder from $MHA_MULTI30K_DIR, else
`../shared/data/multi30k` beside the repository (or --config.data_dir=...).

Default: a model sized for a 2-core CPU and a run of minutes, the shape of
the flax examples/wmt reference (3+3 layers, d_model 256, 4 heads, d_ff 1024,
one shared 8,000-piece vocabulary). Batches are rows of 64 tokens packed
with several sentence pairs each (attention masked per pair, positions
restarting at each pair), 64 rows per update: 4,096 tokens per side, few
of them padding, one batch shape (120 steps per epoch). Each
update sums the gradients of two micro-batches of 32 rows
(`max_tokens=2048, grad_accum_steps=2`): the same batch as one of 64 rows,
in half the step's temporary memory and no more time (bench/README.md).
1,200 steps are 10 epochs. Small data over-fits quickly, so dropout is 0.2 (the
paper's big-model value) instead of 0.1. The schedule is the paper's formula
with warmup 400 (the whole run is 1,200 steps, not 100k) and scale 0.7, a
peak learning rate of 2.2e-3; nothing else departs from §5.

Why packing and not the paper's length buckets (still there:
`--config.pack_examples=False`, 145 steps per epoch): a bucketed batch of
this data holds more padding, which costs as much as real tokens; packed,
an epoch takes less time, and the one batch shape compiles once.

Arguments (configs/base.py's `apply_args`): `long` (the same recipe for
2,000 steps, 16.7 epochs: the second Multi30k run of the README's Results), `gpu`
(the base model's width for one accelerator: 6+6 layers, d_model 512, 8
heads, 25k-token batches as §5.1), then `tiny` (tests), then Table 3 rows.
"""
import os

import ml_collections

from configs import base


# `long`: the same recipe, 2,000 steps, for the Results' ~40-minute run.
LONG = dict(num_train_steps=2000, eval_every_steps=500)

# `gpu`: the base model's width for one accelerator, 25k-token batches.
GPU = dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8,
           max_tokens=25_000, warmup_steps=4000, num_train_steps=20_000,
           checkpoint_every_steps=1000, eval_every_steps=1000)


def default_data_dir() -> str:
  """$MHA_MULTI30K_DIR, else `../shared/data/multi30k` beside the repo."""
  env = os.environ.get("MHA_MULTI30K_DIR")
  if env:
    return env
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return os.path.join(os.path.dirname(repo), "shared", "data", "multi30k")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base.base_config()
  config.update(
      dataset_name="parallel_text", data_dir=default_data_dir(),
      source_lang="de", target_lang="en",
      train_split="train", eval_split="val", test_split="test_2016_flickr",
      vocab_size=8000, max_corpus_chars=10_000_000,
      num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout_rate=0.2,
      max_len=256, max_source_length=64, max_target_length=64,
      max_tokens=2048, grad_accum_steps=2, pack_examples=True,
      warmup_steps=400, learning_rate_scale=0.7,
      num_train_steps=1200, checkpoint_every_steps=100, keep_checkpoints=5,
      eval_every_steps=300, eval_bleu_sentences=100, log_every_steps=50,
  )
  return base.apply_args(config, arg, {"long": LONG, "gpu": GPU,
                                       **base.VARIANTS},
                         own=("long", "gpu"))
