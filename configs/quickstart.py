r"""The offline quickstart: a small Transformer on the synthetic language pair.

    python train.py --config=configs/quickstart.py --workdir=/tmp/quickstart
    python eval.py --workdir=/tmp/quickstart

The pair is generated in code (mha/data/synthetic.py: a made-up SOV source
language and an SVO target language with its own words and gendered
determiners), so nothing is downloaded. Sized to reach BLEU >= 90 on the
synthetic test split in a few minutes on 2 CPU cores. The schedule is the
paper's formula with a shorter warmup and scale 2, as fits a small model
trained for few steps. Training examples are packed into rows of 40 tokens
(`pack_examples`: one batch shape, little padding), which trains faster and
better here than length buckets (docs/results.md).
"""
import ml_collections

from configs import base


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base.base_config()
  config.update(
      dataset_name="synthetic", source_lang="src", target_lang="tgt",
      train_split="train", eval_split="validation", test_split="test",
      vocab_size=512, max_corpus_chars=2_000_000,
      num_layers=2, d_model=64, d_ff=256, num_heads=4, max_len=64,
      max_source_length=40, max_target_length=40, max_tokens=2048,
      pack_examples=True,
      warmup_steps=200, learning_rate_scale=2.0,
      num_train_steps=800, checkpoint_every_steps=200, keep_checkpoints=5,
      eval_every_steps=200, eval_bleu_sentences=128, log_every_steps=50,
  )
  return base.apply_args(config, arg)
