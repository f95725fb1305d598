r"""Transformer (base model) of Vaswani et al. 2017 on WMT 2014 English-German.

Every config field of the project is defined here, with the paper's values;
the other config files start from `base_config()` and change what differs.

    python train.py --config=configs/base.py --workdir=/tmp/base
    python train.py --config=configs/base.py:A1 --workdir=/tmp/a1  # Table 3 row
    python train.py --config=configs/base.py:C4,tiny --workdir=/tmp/t

Config arguments (after the colon, comma-separated):
  A1..A4, B1, B2, C1..C7, D1..D4, E   the rows of the paper's Table 3;
  dot, additive                       the §3.2.1 compatibility functions;
  location, multires                  location-aware encoder-decoder attention
                                      (one filter width / one per head);
  tiny                                a few-second model and loop for tests.

Every config file parses its argument with `apply_args`, one ordering rule:
the file's own variants and options, then `tiny`, then the rows left to
right (`C4,tiny` is the tiny loop with row C4's d_model).
"""
from typing import Any, Callable

import ml_collections
from ml_collections import config_dict

# Table 3 of the paper: each row changes a few fields of the base model.
TABLE3_ROWS = {
    # (A) number of heads at constant computation, d_k = d_v = d_model / h:
    # None leaves them to follow d_model and h, which gives the paper's 512,
    # 128, 32 and 16 on the base model and keeps h·d_k = d_model on any other
    # (configs/big.py, configs/multi30k.py, `tiny`).
    "A1": dict(num_heads=1, d_k=None, d_v=None),
    "A2": dict(num_heads=4, d_k=None, d_v=None),
    "A3": dict(num_heads=16, d_k=None, d_v=None),
    "A4": dict(num_heads=32, d_k=None, d_v=None),
    # (B) smaller attention key size: the paper's absolute sizes (base d_k 64).
    "B1": dict(d_k=16),
    "B2": dict(d_k=32),
    # (C) bigger and smaller models.
    "C1": dict(num_layers=2),
    "C2": dict(num_layers=4),
    "C3": dict(num_layers=8),
    "C4": dict(d_model=256, d_k=None, d_v=None),  # d_k = d_v = 256 / 8 = 32
    "C5": dict(d_model=1024, d_k=None, d_v=None),  # 1024 / 8 = 128
    "C6": dict(d_ff=1024),
    "C7": dict(d_ff=4096),
    # (D) dropout and label smoothing.
    "D1": dict(dropout_rate=0.0),
    "D2": dict(dropout_rate=0.2),
    "D3": dict(label_smoothing=0.0),
    "D4": dict(label_smoothing=0.2),
    # (E) learned positional embedding instead of sinusoids.
    "E": dict(position_encoding="learned"),
    # §3.2.1: the two other compatibility functions.
    "dot": dict(attention_type="dot"),
    "additive": dict(attention_type="additive"),
    # Location-aware and multi-resolution encoder-decoder attention.
    "location": dict(attention_type="location"),
    # multires: widths 1, 3, ..., 2h - 1, one per head of the final model
    # (set by apply_args after every argument: `tiny` or a row A changes h).
    "multires": dict(attention_type="location"),
}


def multires_widths(num_heads: int) -> tuple[int, ...]:
  """One odd filter width per head: 1, 3, 5, ..., 2 * num_heads - 1."""
  return tuple(range(1, 2 * num_heads, 2))

# A model and loop small enough for unit tests on a 2-core CPU. `tiny` applies
# before the rows (`apply_args`): `B1,tiny` is the tiny model with row B1's
# key size.
TINY = dict(
    vocab_size=64, num_layers=2, d_model=32, d_ff=64, num_heads=4,
    max_len=64, max_source_length=32, max_target_length=32, max_tokens=512,
    max_corpus_chars=200_000, warmup_steps=10, num_train_steps=6,
    checkpoint_every_steps=3, eval_every_steps=3, log_every_steps=1,
    eval_bleu_sentences=8,
)


def base_config() -> ml_collections.ConfigDict:
  """The paper's base model and training recipe; all fields of the project."""
  c = ml_collections.ConfigDict()

  # Model (Table 3, "base").
  c.vocab_size = 37000            # shared source/target BPE vocabulary (§5.1)
  c.num_layers = 6                # N
  c.num_encoder_layers = config_dict.placeholder(int)  # None: num_layers
  c.num_decoder_layers = config_dict.placeholder(int)  # None: num_layers
  c.d_model = 512
  c.d_ff = 2048
  c.num_heads = 8                 # h
  c.d_k = config_dict.placeholder(int)  # None: d_model // num_heads
  c.d_v = config_dict.placeholder(int)  # None: d_model // num_heads
  c.dropout_rate = 0.1            # P_drop, residual and embedding dropout
  c.attention_dropout_rate = 0.0  # the paper uses none
  c.label_smoothing = 0.1         # epsilon_ls
  # scaled_dot | dot | additive | location (mha/model/attention.py's
  # ATTENTION_VARIANTS)
  c.attention_type = "scaled_dot"
  # attention_type='location' (encoder-decoder attention only; self-attention
  # stays scaled_dot): one odd filter width for all heads, or one per head
  # (multi-resolution, e.g. (1, 3, 5, 7) for 4 heads); mha/model/location.py.
  c.location_filter_sizes = (7,)
  c.location_num_filters = 8
  c.attention_impl = "einsum"     # einsum | xla (jax.nn.dot_product_attention)
  c.position_encoding = "sinusoidal"  # sinusoidal | learned
  c.layer_norm = "post"           # post (the paper) | pre
  c.layer_norm_epsilon = 1e-6     # every LayerNorm's ε (flax's default)
  # The feed-forward network's activation (mha/model/transformer.py's
  # FFN_ACTIVATIONS): relu, eq. 2's max(0, x); swish, x·sigmoid(x) (SiLU,
  # Marian's and OPUS-MT's); gelu, the exact x·Φ(x) with erf (PyTorch's
  # default, not the tanh approximation).
  c.ffn_activation = "relu"
  # Biases on the attention's Q, K, V and output projections (Marian's);
  # the paper's projections (§3.2.2) have none. The FFN has its biases
  # (eq. 2) either way.
  c.attention_bias = False
  # A learned bias on the pre-softmax logits with shared embeddings
  # (Marian's final_logits_bias); the separate output projection
  # (share_embeddings=False) has its own bias either way.
  c.output_bias = False
  c.share_embeddings = True       # one matrix: source, target, pre-softmax
  c.dtype = "float32"             # computation dtype: float32 | bfloat16
  c.max_len = 512                 # longest position the model can encode

  # Optimizer (§5.3).
  # The learning-rate schedule (mha/model/optim.py's SCHEDULES): "noam",
  # the paper's warmup then k^-0.5 decay; "constant_warmup", the same
  # warmup then constant at its peak.
  c.learning_rate_schedule = "noam"
  c.warmup_steps = 4000
  c.learning_rate_scale = 1.0
  c.adam_b1 = 0.9
  c.adam_b2 = 0.98
  c.adam_eps = 1e-9
  c.grad_accum_steps = 1
  c.grad_clip_norm = 0.0          # 0 = off (the paper clips nothing)

  # Data (§5.1).
  c.dataset_name = "wmt14_translate/de-en"
  c.data_dir = config_dict.placeholder(str)  # parallel_text folder / TFDS dir
  c.source_lang = "en"
  c.target_lang = "de"
  c.train_split = "train"
  c.eval_split = "validation"
  c.test_split = "test"
  c.max_corpus_chars = 10_000_000  # characters used to train SentencePiece
  c.max_source_length = 256
  c.max_target_length = 256
  c.max_tokens = 25_000           # per batch, source and target each (§5.1)
  # What max_tokens counts: padded positions ('padded', rows * padded length
  # <= max_tokens) or real tokens ('real', the paper's count; rows chosen so
  # that the expected real tokens fill it; mha/data/batching.py).
  c.max_tokens_counts = "padded"
  c.pack_examples = False
  c.seed = 0                      # init, dropout and data order
  c.synthetic_seed = 0            # the language of dataset_name='synthetic'
  # Processes that tokenize a split (the same ids on any count): 0 = every
  # core of the host for a split of 64k pairs or more (mha/data/tokenized.py).
  c.tokenize_processes = 0

  # Loop.
  c.num_train_steps = 100_000
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 5          # the paper averages the last 5 (base)
  c.eval_every_steps = 1000
  c.eval_bleu_sentences = 256
  c.log_every_steps = 100
  # Warm start: 'WORKDIR' or 'WORKDIR:STEP', whose parameters and vocabulary
  # a new run starts from (not its optimizer state or step;
  # mha/train/warm_start.py). A run that resumes from its own checkpoint
  # ignores it.
  c.init_from = config_dict.placeholder(str)
  # A jax.profiler trace of `count` updates from the one that makes step
  # `first`, into <workdir>/plugins/profile/ (TensorBoard's Profile tab):
  # (first, count), e.g. --config.profile_steps="(100, 5)"; () = off.
  c.profile_steps = ()

  # Decoding (§6.1).
  c.beam_size = 4
  c.alpha = 0.6                   # length penalty
  c.max_decode_extra = 50         # maximum output length: input + 50
  # When a sentence's beam search ends: "exact" once no live hypothesis can
  # beat the best finished one at any length up to the limit (the search's
  # result is that of a search run to the limit); "early" once none would
  # if it ended at the next step (faster, may miss a longer hypothesis:
  # docs/evaluation.md).
  c.beam_stop = "exact"
  # The searches' products with the weight matrices: "float32", or
  # "bfloat16" (float32 results; faster on CPUs with bfloat16 instructions,
  # other outputs: docs/evaluation.md). The training steps are not affected;
  # the in-training BLEU, a search, is.
  c.matmul_dtype = "float32"
  # N > 0: no output repeats an n-gram of N tokens (fairseq's
  # --no-repeat-ngram-size); 0: off, the paper's search.
  c.no_repeat_ngram_size = 0
  return c


def parse_arg(arg: str | None, options: dict[str, type] | None = None
              ) -> tuple[list[str], dict[str, object]]:
  """Splits a config argument `A1,tiny,devices=8` into names and options.

  Args:
    arg: the text after the config file's colon (None: no argument).
    options: the `key=value` options the config file takes, with their
      types (`{'devices': int}`); any other `key=value` is refused.

  Returns:
    (the bare names in order, {option: typed value}).

  Raises:
    ValueError: naming an unknown option or a value of the wrong type.
  """
  options = options or {}
  names, values = [], {}
  for part in (p.strip() for p in (arg or "").split(",")):
    if not part:
      continue
    if "=" not in part:
      names.append(part)
      continue
    key, _, text = part.partition("=")
    if key not in options:
      known = ", ".join(f"{k}=" for k in options) or "none"
      raise ValueError(f"Unknown config option {key!r} in {arg!r}; "
                       f"options: {known}.")
    try:
      values[key] = options[key](text)
    except ValueError:
      raise ValueError(f"Config option {key}={text!r} is not a "
                       f"{options[key].__name__}.") from None
  return names, values


# What a config argument changes: fields and values, or a function of the
# config built so far that returns them (rows that follow the model's width).
Changes = dict[str, Any] | Callable[[ml_collections.ConfigDict],
                                    dict[str, Any]]
# The names every config file takes: `tiny` and the Table 3 rows.
VARIANTS: dict[str, Changes] = {"tiny": TINY, **TABLE3_ROWS}
# A `key=value` option: (type, default, value -> changes).
Option = tuple[type, Any, Callable[[Any], dict[str, Any]]]


def _update(config: ml_collections.ConfigDict, changes: Changes) -> None:
  config.update(changes(config) if callable(changes) else changes)


def apply_args(config: ml_collections.ConfigDict, arg: str | None,
               variants: dict[str, Changes] | None = None,
               own: tuple[str, ...] = (),
               options: dict[str, Option] | None = None
               ) -> ml_collections.ConfigDict:
  """Applies a config argument: the one parser of every config file.

  `arg` is comma-separated names of `variants` and typed `key=value` options
  (`parse_arg`). The ordering rule, the same in every config file:

    1. the file's own variants (`own`, e.g. multi30k's `gpu`), as given;
    2. its `key=value` options (every option: given, or its default);
    3. `tiny`, wherever it appears;
    4. every other name (Table 3 rows, attention variants), left to right;
    5. `multires`: one filter width per head of the resulting model (1, 3,
       ..., 2h - 1).

  So `tiny,A1` and `A1,tiny` are both the tiny model with one head.

  Args:
    config: the file's config, changed in place.
    arg: the text after the config file's colon (None: none).
    variants: the names the file takes, in the order an error lists them;
      default `VARIANTS` (`tiny` and the Table 3 rows).
    own: the names of `variants` applied first (step 1).
    options: the `key=value` options: name -> (type, default, value ->
      changes).

  Returns:
    `config`.

  Raises:
    ValueError: naming an unknown argument or option, or a mistyped value.
  """
  variants = VARIANTS if variants is None else variants
  options = options or {}
  names, values = parse_arg(arg, {k: t for k, (t, _, _) in options.items()})
  for name in names:
    if name not in variants:
      raise ValueError(f"Unknown config argument {name!r}; known: "
                       f"{', '.join(variants)}.")
  for name in (n for n in names if n in own):
    _update(config, variants[name])
  for key, (_, default, changes) in options.items():
    config.update(changes(values.get(key, default)))
  if "tiny" in names:
    _update(config, variants["tiny"])
  for name in (n for n in names if n not in own and n != "tiny"):
    _update(config, variants[name])
  if "multires" in names:
    config.location_filter_sizes = multires_widths(config.num_heads)
  return config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return apply_args(base_config(), arg)
