"""Checks of a training config, run before anything is written.

`validate(config)` refuses every field whose value cannot be right: ranges of
the numeric fields, the names of the model's variants, the model config as a
whole (`TransformerConfig.from_config`), and the smallest `max_tokens` that
holds one row of the longest allowed sentence on every device. Each refusal is
a `ConfigError` naming `config.<field>`, the value and what is allowed, so the
entry point can print it as one line.

The checks read nothing but the config: the data splits and the workdir are
checked by the trainer (`mha.trainer.check_inputs`).
"""
import math
import numbers
from typing import Any

import ml_collections

from mha.attention import ATTENTION_IMPLS
from mha.attention import ATTENTION_TYPES
from mha.data import batching
from mha.errors import ConfigError
from mha.positional import POSITION_ENCODINGS
from mha.transformer import LAYER_NORMS
from mha.transformer import TransformerConfig

_SPECIAL_PIECES = 3  # PAD, EOS, UNK of mha.data.tokenizer
_DTYPES = ("float32", "bfloat16", "float16")

# Integer fields and their smallest value; an optional field may be None.
_MIN_INT = {
    "vocab_size": _SPECIAL_PIECES + 1, "num_layers": 1, "d_model": 1,
    "d_ff": 1, "num_heads": 1, "location_num_filters": 1, "max_len": 1,
    "warmup_steps": 1, "grad_accum_steps": 1, "max_corpus_chars": 1,
    "max_source_length": 1, "max_target_length": 1, "max_tokens": 1,
    "seed": 0, "synthetic_seed": 0, "num_train_steps": 0,
    "checkpoint_every_steps": 1, "keep_checkpoints": 1, "eval_every_steps": 1,
    "eval_bleu_sentences": 0, "log_every_steps": 1, "beam_size": 1,
    "max_decode_extra": 0,
}
_OPTIONAL_INT = ("num_encoder_layers", "num_decoder_layers", "d_k", "d_v")
# Real fields: (low, high, high included); low is always included. None: no
# bound. `learning_rate_scale`, `adam_eps` must be > 0: low is excluded.
_REAL = {
    "dropout_rate": (0.0, 1.0, False),
    "attention_dropout_rate": (0.0, 1.0, False),
    "label_smoothing": (0.0, 1.0, False),
    "adam_b1": (0.0, 1.0, False),
    "adam_b2": (0.0, 1.0, False),
    "grad_clip_norm": (0.0, None, False),
    "alpha": (0.0, None, False),
}
_POSITIVE_REAL = ("learning_rate_scale", "adam_eps")
_CHOICES = {
    "attention_type": ATTENTION_TYPES, "attention_impl": ATTENTION_IMPLS,
    "position_encoding": POSITION_ENCODINGS, "layer_norm": LAYER_NORMS,
    "dtype": _DTYPES, "max_tokens_counts": batching.TOKEN_COUNTS,
}
_BOOLS = ("share_embeddings", "pack_examples")
_NAMES = ("dataset_name", "source_lang", "target_lang", "train_split",
          "eval_split", "test_split")


def _refuse(field: str, value: Any, allowed: str) -> ConfigError:
  return ConfigError(f"config.{field} must be {allowed}, got {value!r}.")


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_ints(config: ml_collections.ConfigDict) -> None:
  for field, low in _MIN_INT.items():
    if field in config:
      value = config[field]
      if not _is_int(value):
        raise _refuse(field, value, f"an integer >= {low}")
      if value < low:
        raise _refuse(field, value, f">= {low}")
  for field in _OPTIONAL_INT:
    value = config.get(field)
    if value is not None and (not _is_int(value) or value < 1):
      raise _refuse(field, value, "an integer >= 1, or None (the default)")


def _check_reals(config: ml_collections.ConfigDict) -> None:
  for field, (low, high, high_included) in _REAL.items():
    if field not in config:
      continue
    value = config[field]
    inside = _is_real(value) and math.isfinite(value) and value >= low
    if high is not None:
      inside = inside and (value <= high if high_included else value < high)
      allowed = f"in [{low:g}, {high:g}{']' if high_included else ')'}"
    else:
      allowed = f"finite and >= {low:g}"
    if not inside:
      raise _refuse(field, value, allowed)
  for field in _POSITIVE_REAL:
    if field in config:
      value = config[field]
      if not (_is_real(value) and math.isfinite(value) and value > 0):
        raise _refuse(field, value, "finite and > 0")


def _check_names(config: ml_collections.ConfigDict) -> None:
  for field, options in _CHOICES.items():
    if field in config and config[field] not in options:
      raise _refuse(field, config[field], f"one of {', '.join(options)}")
  for field in _BOOLS:
    if field in config and not isinstance(config[field], bool):
      raise _refuse(field, config[field], "True or False")
  for field in _NAMES:
    if field in config:
      value = config[field]
      if not isinstance(value, str) or not value.strip():
        raise _refuse(field, value, "a non-empty string")


def _check_profile(config: ml_collections.ConfigDict) -> None:
  """`profile_steps`: empty (off) or (first step >= 1, count >= 0)."""
  value = config.get("profile_steps", ())
  if value is None or (isinstance(value, (tuple, list)) and not value):
    return
  if not (isinstance(value, (tuple, list)) and len(value) == 2
          and all(_is_int(v) for v in value) and value[0] >= 1
          and value[1] >= 0):
    raise _refuse("profile_steps", value,
                  "() (off) or (first, count): integers, the first step "
                  ">= 1 and the count of steps >= 0, e.g. (100, 5)")


def _check_model(config: ml_collections.ConfigDict) -> None:
  """The model config as a whole: heads, key sizes, filters, impl."""
  if (config.get("attention_impl") == "xla"
      and config.get("attention_dropout_rate", 0.0) > 0):
    raise _refuse("attention_dropout_rate", config.attention_dropout_rate,
                  "0 with config.attention_impl='xla' (it has no attention "
                  "dropout; use attention_impl='einsum')")
  try:
    TransformerConfig.from_config(config)
  except ValueError as e:  # its messages name config.<field> already
    raise ConfigError(str(e)) from None
  for field in ("max_source_length", "max_target_length"):
    if config[field] > config.max_len:
      raise _refuse(field, config[field],
                    f"<= config.max_len={config.max_len}, the longest "
                    "position the model encodes")


def min_max_tokens(config: ml_collections.ConfigDict,
                   num_devices: int) -> int:
  """The smallest `max_tokens` that serves every training batch.

  A global batch holds at least one row per device, and a row of the longest
  allowed sentence (max_source_length or max_target_length, padded as the
  batches pad it) takes that many tokens on each side.
  """
  longest = max(batching.padded_cap(config.max_source_length, config.max_len),
                batching.padded_cap(config.max_target_length, config.max_len))
  return longest * num_devices


def validate(config: ml_collections.ConfigDict,
             num_devices: int | None = None) -> None:
  """Refuses a training config with a field whose value cannot be right.

  Args:
    config: a config with the fields of `configs/base.py`.
    num_devices: the global device count; given, `max_tokens` is checked
      against its real minimum (`min_max_tokens`).

  Raises:
    ConfigError: naming `config.<field>`, the value and the allowed range.
  """
  _check_ints(config)
  _check_reals(config)
  _check_names(config)
  _check_profile(config)
  _check_model(config)
  if num_devices is not None:
    least = min_max_tokens(config, num_devices)
    if config.max_tokens < least:
      raise ConfigError(
          f"config.max_tokens must be >= {least}, got {config.max_tokens}: "
          "one row of the longest allowed sentence (max_source_length="
          f"{config.max_source_length}, max_target_length="
          f"{config.max_target_length}, padded to {least // num_devices} "
          f"tokens) on each of {num_devices} device(s). Raise it or lower "
          "the length limits.")
