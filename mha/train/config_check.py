"""Checks of a training config, run before anything is written.

`validate(config)` refuses every field whose value cannot be right: each
field by its rule in the one table of rules (`mha.validation.FIELDS`: ranges
of the numeric fields, the names of the model's variants), then the model
config as a whole (`TransformerConfig.from_config`), and the smallest
`max_tokens` that holds one row of the longest allowed sentence on every
device. Each refusal is a `ConfigError` naming `config.<field>`, the value
and what is allowed, so the entry point can print it as one line.

The checks read nothing but the config: the data splits and the workdir are
checked by the trainer (`mha.train.setup.check_inputs`).
"""
from typing import Any

import ml_collections

from mha import validation
from mha.data import batching
from mha.errors import ConfigError
from mha.model.transformer import TransformerConfig


def _refuse(field: str, value: Any, allowed: str) -> ConfigError:
  return ConfigError(f"config.{field} must be {allowed}, got {value!r}.")


def _check_fields(config: ml_collections.ConfigDict) -> None:
  """Each field of the config that the table (`mha.validation.FIELDS`) has a
  rule for: the first one whose value breaks its rule is refused."""
  for field in validation.FIELDS:
    if field in config:
      validation.check_field(field, config[field])


def _check_model(config: ml_collections.ConfigDict) -> TransformerConfig:
  """The model config as a whole: heads, key sizes, filters, impl; returns
  it (built once, here)."""
  if (config.get("attention_impl") == "xla"
      and config.get("attention_dropout_rate", 0.0) > 0):
    raise _refuse("attention_dropout_rate", config.attention_dropout_rate,
                  "0 with config.attention_impl='xla' (it has no attention "
                  "dropout; use attention_impl='einsum')")
  model_config = TransformerConfig.from_config(config)  # ConfigError
  if config.get("beam_size", 0) > config.vocab_size:
    raise _refuse("beam_size", config.beam_size,
                  f"<= config.vocab_size={config.vocab_size}")
  for field in ("max_source_length", "max_target_length"):
    if config[field] > config.max_len:
      raise _refuse(field, config[field],
                    f"<= config.max_len={config.max_len}, the longest "
                    "position the model encodes")
  return model_config


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
             num_devices: int | None = None) -> TransformerConfig:
  """Refuses a training config with a field whose value cannot be right.

  Args:
    config: a config with the fields of `configs/base.py`.
    num_devices: the global device count; given, `max_tokens` is checked
      against its real minimum (`min_max_tokens`).

  Returns:
    The model config the checks built (`TransformerConfig.from_config`),
    for the run: it is built once.

  Raises:
    ConfigError: naming `config.<field>`, the value and the allowed range.
  """
  _check_fields(config)
  model_config = _check_model(config)
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
  return model_config
