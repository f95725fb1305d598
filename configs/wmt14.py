r"""The paper's WMT 2014 English→German recipe (§5, Table 2), base or big.

    python train.py --config=configs/wmt14.py:devices=8 --workdir=/data/base
    python train.py --config=configs/wmt14.py:big,devices=8 --workdir=/data/big
    python eval.py --workdir=/data/base --average_last=5     # big: 20

Data: TFDS `wmt14_translate/de-en` (about 4.5M sentence pairs; prepared by
TFDS on first use into `--config.data_dir`, default ~/tensorflow_datasets),
English source, German target; `validation` is newstest2013 (3,000 pairs,
dev) and `test` is newstest2014 (3,003 pairs, the paper's Table 2). One
SentencePiece vocabulary of 37,000 pieces shared by both languages (§5.1 uses
a shared BPE of about 37,000 tokens), trained on the first 10M characters of
the training split.

Arguments (after the colon, comma-separated):
  base (default) | big   Table 3's base model (100k steps, P_drop 0.1) or
                         the big model (300k steps, d_model 1024, d_ff 4096,
                         h 16, P_drop 0.3).
  devices=N              the number of accelerators over all hosts: every
                         update sees the paper's batch of about 25,000
                         source and 25,000 target tokens (§5.1: 8 GPUs of
                         about 3,125 tokens each). With N < 8,
                         A = `grad_accum_steps` = 8 // N (integer
                         division) micro-batches of 25,000 // A tokens,
                         each split over the N devices, make one update
                         (N = 1, 2, 4: about 3,125 tokens per device;
                         N = 3: A = 2, about 4,167); with N >= 8
                         the 25,000 tokens are split over the N devices
                         (N = 32: about 780 per device, the pod slice then
                         runs below its capacity but trains the paper's
                         recipe). Default 8, the paper's. The tokens are
                         counted as the paper counts them, real tokens
                         (`max_tokens_counts='real'`): the bucketed
                         batches are padded to their bucket's length, and
                         a budget of 25,000 padded positions would hold
                         about a fifth fewer real tokens
                         (tests/test_wmt14.py measures both on WMT-like
                         lengths).
  tiny, A1 ... E         as in configs/base.py (Table 3 rows, test model).

Checkpoints: the paper averages the last 5 (base) or 20 (big) checkpoints
written at 10-minute intervals. At the paper's speed (base: 100k steps in
12 h, 2.3 steps/s; big: 300k in 3.5 days, 1.0 steps/s) that is every 1,400
(base) or 600 (big) steps, and the workdir keeps the last 5 or 20, which
`eval.py --average_last=5` (big: 20) averages.
"""
import ml_collections

from configs import base
from configs import big

PAPER_DEVICES = 8
PAPER_TOKENS_PER_SIDE = 25_000  # per update, source and target each (§5.1)


def batch_fields(devices: int) -> dict[str, int]:
  """`max_tokens` and `grad_accum_steps` for `devices` accelerators.

  Raises:
    ValueError: for devices < 1.
  """
  if devices < 1:
    raise ValueError(f"devices={devices} must be >= 1.")
  accum = max(1, PAPER_DEVICES // devices)
  return {"max_tokens": PAPER_TOKENS_PER_SIDE // accum,
          "grad_accum_steps": accum}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base.base_config()
  config.update(
      dataset_name="wmt14_translate/de-en", source_lang="en",
      target_lang="de", train_split="train", eval_split="validation",
      test_split="test", vocab_size=37_000, max_corpus_chars=10_000_000,
      checkpoint_every_steps=1400, keep_checkpoints=5, eval_every_steps=5000,
      eval_bleu_sentences=256, max_tokens_counts="real")
  variants = {"base": {}, "big": dict(big.BIG, checkpoint_every_steps=600),
              **base.VARIANTS}
  options = {"devices": (int, PAPER_DEVICES, batch_fields)}
  return base.apply_args(config, arg, variants, own=("base", "big"),
                         options=options)
