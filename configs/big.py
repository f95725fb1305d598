r"""Transformer (big) of Vaswani et al. 2017 (Table 3, last row).

    python train.py --config=configs/big.py --workdir=/tmp/big

Same arguments as configs/base.py (Table 3 rows, `tiny`). The paper trains the
big model for 300k steps and averages the last 20 checkpoints.
"""
import ml_collections

from configs import base


# What the big model changes in the base model (Table 3, last row).
BIG = dict(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3,
           num_train_steps=300_000, keep_checkpoints=20)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base.base_config()
  config.update(BIG)
  return base.apply_args(config, arg)
