"""The one table of rules for config fields and command-line flags.

`FIELDS` maps a config field to its rule, `FLAGS` an evaluation flag that is
no config field (`--beam_size`, `--alpha`, `--max_decode_extra` and
`--beam_stop` are fields: a flag of that name follows the field's rule). A rule
is a function of the value: None for a value that may be used, else the words
for what is allowed ('an integer >= 1'). `check_field` and `check_flag` turn
those words into the one-line message every check gives:

    config.beam_size must be >= 1, got 0.
    --alpha must be a finite number >= 0 (the length penalty; ...), got nan.

A setting is named as the user gave it (`setting`): `--alpha` in a command
(inside `as_flags()`, which `mha.cli.startup.guarded` enters), `alpha`, the
keyword argument, in the Python API.

The training config's checks (`mha.train.config_check`), the model config's
(`TransformerConfig`), the modules that act on a choice (`mha.model.attention`,
`mha.model.positional`), the evaluation's flags
(`mha.evaluation.evaluator.check_flags`), the search settings
(`mha.search.settings`) and the export's (`mha.export.check_flags`,
`mha.cli.export`) read this table. Rules that tie several fields together
(d_model and num_heads, max_tokens and the lengths) stay with the code that
knows them.

This module imports nothing but the errors (no JAX), so every layer may
read it.
"""
import contextlib
import contextvars
import math
import numbers
from typing import Any, Callable, Iterator

from mha.errors import ConfigError

Rule = Callable[[Any], str | None]

# The names a config may choose from; the modules that act on them import
# them from here (mha.model.attention, mha.model.positional,
# mha.model.transformer, mha.data.batching, mha.search.decoding).
# The names of the tables of mha/model/, which sits above this module: the
# attention variants (`mha.model.attention.ATTENTION_VARIANTS`) and the
# learning-rate schedules (`mha.model.optim.SCHEDULES`), in their order
# (tests/test_attention.py and tests/test_optim_losses.py keep them equal).
ATTENTION_TYPES = ("scaled_dot", "dot", "additive", "location")
LEARNING_RATE_SCHEDULES = ("noam", "constant_warmup")
ATTENTION_IMPLS = ("einsum", "xla")
POSITION_ENCODINGS = ("sinusoidal", "learned")
LAYER_NORMS = ("post", "pre")
# The feed-forward activations (`mha.model.transformer.FFN_ACTIVATIONS`, in
# its order: tests/test_model_options.py keeps them equal).
FFN_ACTIVATIONS = ("relu", "swish", "gelu")
DTYPES = ("float32", "bfloat16", "float16")  # jax.numpy's names
TOKEN_COUNTS = ("padded", "real")  # what max_tokens counts
EXPORT_FORMATS = ("ctranslate2", "huggingface")  # mha-export --format
QUANTIZATIONS = ("float32", "int8")  # mha-export --quantization
# mha.search.decoding.beam_search's stopping rules
BEAM_STOPS = ("exact", "early")
# The searches' weight products (mha.model.attention.weight_product).
MATMUL_DTYPES = ("float32", "bfloat16")
_SPECIAL_PIECES = 3  # PAD, EOS, UNK (mha.data.token_ids)
# True inside a command's main (`as_flags`): messages name its flags.
_AS_FLAGS = contextvars.ContextVar("mha_settings_as_flags", default=False)
# How the reader of a checkpoint chooses its step (`choosing_step`): the verb
# and the setting a damaged checkpoint's message advises; eval.py's and
# `evaluate`'s by default.
_STEP_CHOICE = contextvars.ContextVar(
    "mha_step_choice", default=("evaluate", "checkpoint_step"))


def setting(name: str, flag: str | None = None) -> str:
  """How a message names a setting: `name`, the Python API's keyword
  argument, or inside `as_flags()` the command's flag, `--<flag>` (`flag`
  defaults to `name`)."""
  return f"--{flag or name}" if _AS_FLAGS.get() else name


def refusal(name: str, allowed: str, value: Any,
            flag: str | None = None) -> str:
  """The one line of every refused setting: '<setting> must be <allowed>,
  got <value>.', the setting named by `setting(name, flag)`."""
  return f"{setting(name, flag)} must be {allowed}, got {value!r}."


@contextlib.contextmanager
def as_flags() -> Iterator[None]:
  """Messages raised inside name settings as flags (`setting`)."""
  token = _AS_FLAGS.set(True)
  try:
    yield
  finally:
    _AS_FLAGS.reset(token)


@contextlib.contextmanager
def choosing_step(verb: str, name: str) -> Iterator[None]:
  """Inside, the advice of a damaged checkpoint's message (`use_step`) is
  '<verb> it with <setting>=<step>', the setting named by `setting(name)`:
  each reader enters it with its own (`mha.load`: 'load', 'step';
  `mha.export.export`: 'export', 'step'); outside, eval.py's."""
  token = _STEP_CHOICE.set((verb, name))
  try:
    yield
  finally:
    _STEP_CHOICE.reset(token)


def use_step(step: int) -> str:
  """How to read checkpoint `step` instead: 'evaluate it with
  --checkpoint_step=4' in eval.py, 'load it with step=4' in `mha.load`,
  'load it with --step=4' in mha-translate (`choosing_step`)."""
  verb, name = _STEP_CHOICE.get()
  return f"{verb} it with {setting(name)}={step}"


def is_int(value: Any) -> bool:
  """An integer, not a bool."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(low: int) -> Rule:
  def rule(value):
    if not is_int(value):
      return f"an integer >= {low}"
    return f">= {low}" if value < low else None
  return rule


def optional_integer(low: int) -> Rule:
  def rule(value):
    if value is None or (is_int(value) and value >= low):
      return None
    return f"an integer >= {low}, or None (the default)"
  return rule


def real(low: float, high: float | None = None, *,
         low_excluded: bool = False, note: str = "") -> Rule:
  """A finite number >= low (> low if `low_excluded`), < high if given."""
  if high is not None:
    words = f"in [{low:g}, {high:g})"
  else:
    words = f"a finite number {'>' if low_excluded else '>='} {low:g}{note}"

  def rule(value):
    inside = (_is_real(value) and math.isfinite(value)
              and (value > low if low_excluded else value >= low)
              and (high is None or value < high))
    return None if inside else words
  return rule


def one_of(options: tuple[str, ...]) -> Rule:
  return lambda value: None if value in options else (
      f"one of {', '.join(options)}")


def _boolean(value: Any) -> str | None:
  return None if isinstance(value, bool) else "True or False"


def _name(value: Any) -> str | None:
  return (None if isinstance(value, str) and value.strip()
          else "a non-empty string")


def _profile_steps(value: Any) -> str | None:
  """() or None (off), or (first step >= 1, count >= 0)."""
  if value is None or (isinstance(value, (tuple, list)) and not value):
    return None
  if (isinstance(value, (tuple, list)) and len(value) == 2
      and all(is_int(v) for v in value) and value[0] >= 1 and value[1] >= 0):
    return None
  return ("() (off) or (first, count): integers, the first step >= 1 and "
          "the count of steps >= 0, e.g. (100, 5)")


FIELDS: dict[str, Rule] = {
    # model
    "vocab_size": integer(_SPECIAL_PIECES + 1), "num_layers": integer(1),
    "num_encoder_layers": optional_integer(1),
    "num_decoder_layers": optional_integer(1),
    "d_model": integer(1), "d_ff": integer(1), "num_heads": integer(1),
    "d_k": optional_integer(1), "d_v": optional_integer(1),
    "location_num_filters": integer(1), "max_len": integer(1),
    "dropout_rate": real(0.0, 1.0), "attention_dropout_rate": real(0.0, 1.0),
    "label_smoothing": real(0.0, 1.0),
    "attention_type": one_of(ATTENTION_TYPES),
    "attention_impl": one_of(ATTENTION_IMPLS),
    "position_encoding": one_of(POSITION_ENCODINGS),
    "layer_norm": one_of(LAYER_NORMS), "dtype": one_of(DTYPES),
    "share_embeddings": _boolean,
    "ffn_activation": one_of(FFN_ACTIVATIONS),
    "attention_bias": _boolean, "output_bias": _boolean,
    "layer_norm_epsilon": real(0.0, low_excluded=True),
    # optimizer
    "warmup_steps": integer(1), "grad_accum_steps": integer(1),
    "learning_rate_scale": real(0.0, low_excluded=True),
    "learning_rate_schedule": one_of(LEARNING_RATE_SCHEDULES),
    "adam_b1": real(0.0, 1.0), "adam_b2": real(0.0, 1.0),
    "adam_eps": real(0.0, low_excluded=True), "grad_clip_norm": real(0.0),
    # data
    "dataset_name": _name, "source_lang": _name, "target_lang": _name,
    "train_split": _name, "eval_split": _name, "test_split": _name,
    "max_corpus_chars": integer(1), "max_source_length": integer(1),
    "max_target_length": integer(1), "max_tokens": integer(1),
    "max_tokens_counts": one_of(TOKEN_COUNTS), "pack_examples": _boolean,
    "seed": integer(0), "synthetic_seed": integer(0),
    "tokenize_processes": integer(0),
    # loop
    "num_train_steps": integer(0), "checkpoint_every_steps": integer(1),
    "keep_checkpoints": integer(1), "eval_every_steps": integer(1),
    "eval_bleu_sentences": integer(0), "log_every_steps": integer(1),
    "profile_steps": _profile_steps,
    # decoding (also eval.py's and mha-translate's flags of the same names)
    "beam_size": integer(1),
    "alpha": real(0.0, note=" (the length penalty; the paper: 0.6)"),
    "max_decode_extra": integer(0), "beam_stop": one_of(BEAM_STOPS),
    "matmul_dtype": one_of(MATMUL_DTYPES), "no_repeat_ngram_size": integer(0),
}

FLAGS: dict[str, Rule] = {
    # eval.py, mha-translate
    "checkpoint_step": integer(0), "average_last": integer(1),
    "batch_size": integer(1), "plot_attention": integer(0),
    "cpu_devices": integer(1),  # also mha.use_cpu_cores's count
    # mha-translate
    "nbest": integer(0),
    # mha-export
    "format": one_of(EXPORT_FORMATS), "quantization": one_of(QUANTIZATIONS),
    "step": integer(0),
}


def check_field(field: str, value: Any) -> None:
  """Refuses `value` for config field `field` (one of `FIELDS`).

  Raises:
    ConfigError: 'config.<field> must be <allowed>, got <value>.'
  """
  allowed = FIELDS[field](value)
  if allowed is not None:
    raise ConfigError(f"config.{field} must be {allowed}, got {value!r}.")


def check_flag(name: str, value: Any,
               error: type[Exception] = ConfigError,
               keyword: str | None = None) -> None:
  """Refuses `value` for the setting `name` (a `FLAGS` or `FIELDS` name):
  a command's flag `--name` or an API's keyword argument (`setting`;
  `keyword` where the argument has another name than the flag).

  Raises:
    error: '--<name> must be <allowed>, got <value>.' (no '--' in the API)
  """
  allowed = FLAGS.get(name, FIELDS.get(name))(value)
  if allowed is not None:
    raise error(refusal(keyword or name, allowed, value, name))
