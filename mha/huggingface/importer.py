"""Import a Hugging Face MarianMT folder as an mha workdir.

    from configs import base
    from mha.huggingface import importer
    importer.import_model("/data/opus-mt-de-en", "/tmp/opus",
                          base.get_config())

or `mha-import --from=huggingface --source=DIR --workdir=W
--config=configs/base.py`. `DIR` is a folder on disk (e.g. made by
`huggingface-cli download Helsinki-NLP/opus-mt-de-en --local-dir DIR`:
nothing is downloaded here). `W` becomes what train.py leaves behind:
`config.json` (the given config, its model fields those of Marian's
`config.json`: `MODEL_FIELDS`, `ACTIVATIONS`, Marian's LayerNorm ε 1e-5
and the bias options), the vocabulary and `checkpoints/0/` (the
parameters, written by mha's own checkpoint writer: `mha.store.
checkpoints`). eval.py evaluates it, `mha.load` translates with it,
mha-export exports it again, and a new run fine-tunes it as a warm start
(`--config.init_from=W`, with the model fields `train_overrides` lists;
not by resuming W itself: its checkpoint holds no optimizer state).

The parameters map as `mha.huggingface.marian` says. Non-zero attention
biases make `attention_bias=True` (the biases are parameters), a non-zero
`final_logits_bias` of a shared model `output_bias=True`.

Vocabulary: Marian's ids are vocab.json's (OPUS-MT: </s> 0, <unk> 1,
<pad> last); mha's put <pad>, </s>, <unk> at 0, 1, 2. The import permutes
the ids (`read_vocabulary`: those three, then the others in Marian's
order) and the embedding, lm_head and final_logits_bias rows alike
(`permute_vocabulary`; the decoder's start, Marian's pad id, becomes 0),
and writes source.spm, target.spm and the permuted vocab.json. A model
whose one SentencePiece model's ids are vocab.json's keeps `spm.model`.

What mha's model cannot compute is refused before anything is written,
one line naming the Marian config field (`UNSUPPORTED`), the tensor (one
mha has no place for) or the file (a vocab.json without the ids 0..V-1
once each or <pad>/</s>/<unk>, at other ids than config.json's). A new
model option of mha's is a row moved from `UNSUPPORTED` to
`MODEL_FIELDS`.

The workdir is written in a staging folder beside `W` and renamed to `W`
when complete: a refused or failed import leaves no workdir.
"""
import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any, Callable, NamedTuple

from absl import logging
import ml_collections
import numpy as np

from mha import validation
from mha.data.tokenizer import SEPARATE_FILENAMES
from mha.data.tokenizer import SeparateTokenizer
from mha.data.tokenizer import Tokenizer
from mha.errors import DataError
from mha.errors import ExportError
from mha.errors import ModelImportError
from mha.huggingface import marian
from mha.model.transformer import TransformerConfig
from mha.store import checkpoints
from mha.store import workdir as workdir_lib

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SOURCE_SPM, TARGET_SPM, VOCAB_FILE = "source.spm", "target.spm", "vocab.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
STEP = 0  # the imported checkpoint's step

# `MarianConfig`'s defaults (transformers), for a field config.json omits.
MARIAN_DEFAULTS = {
    "vocab_size": 58101, "decoder_vocab_size": None, "d_model": 1024,
    "encoder_layers": 12, "decoder_layers": 12,
    "encoder_attention_heads": 16, "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096,
    "max_position_embeddings": 1024, "dropout": 0.1,
    "attention_dropout": 0.0, "activation_dropout": 0.0,
    "activation_function": "gelu", "scale_embedding": False,
    "pad_token_id": 58100, "eos_token_id": 0,
    "decoder_start_token_id": 58100,
    "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
    "normalize_before": False, "add_final_layer_norm": False,
    "normalize_embedding": False, "static_position_embeddings": True,
    "layernorm_embedding": False,
}
# Marian config field -> mha config field, read as is.
MODEL_FIELDS = (
    ("d_model", "d_model"), ("encoder_layers", "num_encoder_layers"),
    ("decoder_layers", "num_decoder_layers"),
    ("encoder_attention_heads", "num_heads"), ("encoder_ffn_dim", "d_ff"),
    ("vocab_size", "vocab_size"), ("max_position_embeddings", "max_len"),
    ("dropout", "dropout_rate"),
    ("attention_dropout", "attention_dropout_rate"),
)
# Marian fields that must equal another one: mha has one value for both.
SAME_AS = (("decoder_attention_heads", "encoder_attention_heads"),
           ("decoder_ffn_dim", "encoder_ffn_dim"),
           ("decoder_vocab_size", "vocab_size"))
# Marian config field -> (the one value mha's model computes, what mha
# lacks for another).
UNSUPPORTED = {
    "activation_dropout": (0.0, "mha has no dropout after the "
                           "feed-forward activation"),
    "scale_embedding": (True, "mha multiplies embeddings by √d_model "
                        "(§3.4)"),
    "normalize_before": (False, "pre-LN Marian (a final layer norm per "
                         "stack) is not mha's layer_norm='pre'"),
    "add_final_layer_norm": (False, "mha's post-LN stacks end with no "
                             "extra layer norm"),
    "normalize_embedding": (False, "mha has no layer norm of the "
                            "embeddings (BART-style)"),
    "layernorm_embedding": (False, "mha has no layer norm of the "
                            "embeddings (BART-style)"),
    "static_position_embeddings": (True, "mha's sinusoids are fixed"),
}
# Marian's activation_function -> mha's ffn_activation (transformers'
# "silu" and "swish" are one function).
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish",
               "gelu": "gelu"}
# vocab.json's special pieces, by the Marian config field giving their id
# (None: no field), in the order of mha's ids 0, 1, 2.
SPECIAL_PIECES = (("<pad>", "pad_token_id"), ("</s>", "eos_token_id"),
                  ("<unk>", None))
# Marian's tensors with one row (the last axis: final_logits_bias) per id.
VOCABULARY_ROWS = ("model.shared.weight", "model.encoder.embed_tokens.weight",
                   "model.decoder.embed_tokens.weight", "lm_head.weight")
# Tensors Marian's state dict may hold that mha's model recomputes or ties:
# its sinusoid tables, and the tied copies of a shared embedding.
POSITION_TABLES = ("model.encoder.embed_positions.weight",
                   "model.decoder.embed_positions.weight")
TIED_COPIES = ("model.encoder.embed_tokens.weight",
               "model.decoder.embed_tokens.weight", "lm_head.weight")


def _refuse(source: str, name: str, message: str) -> ModelImportError:
  return ModelImportError(f"{os.path.join(source, name)}: {message}")


def _read_json(source: str, name: str) -> dict:
  """The JSON object in `source/name` (ModelImportError naming it)."""
  path = os.path.join(source, name)
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except FileNotFoundError:
    raise _refuse(source, name, "missing: --source is not a Hugging Face "
                  "MarianMT folder.") from None
  except (OSError, ValueError) as e:
    raise _refuse(source, name, f"not a readable JSON file ({e}).") from None
  if not isinstance(value, dict):
    raise _refuse(source, name, "does not hold a JSON object.")
  return value


def marian_config(source: str) -> dict[str, Any]:
  """Marian's config.json, with `MarianConfig`'s defaults where it is
  silent; refuses a folder of another model type."""
  raw = _read_json(source, CONFIG_FILE)
  model_type = raw.get("model_type")
  if model_type != "marian":
    raise _refuse(source, CONFIG_FILE, f"model_type={model_type!r}: mha "
                  "imports MarianMT models ('marian') only.")
  found = {**MARIAN_DEFAULTS, **raw}
  if found["decoder_vocab_size"] is None:
    found["decoder_vocab_size"] = found["vocab_size"]
  return found


def check_config(source: str, found: dict[str, Any]) -> None:
  """Refuses a Marian config field mha's model cannot compute (one line
  naming it and what mha lacks)."""
  for field, (value, why) in UNSUPPORTED.items():
    if found[field] != value:
      raise _refuse(source, CONFIG_FILE, f"{field}={found[field]!r} cannot "
                    f"be imported: {why}; only {field}={value!r} maps.")
  if found["activation_function"] not in ACTIVATIONS:
    raise _refuse(source, CONFIG_FILE, "activation_function="
                  f"{found['activation_function']!r} cannot be imported: "
                  f"mha's ffn_activation maps {sorted(ACTIVATIONS)}.")
  if found["decoder_start_token_id"] != found["pad_token_id"]:
    raise _refuse(source, CONFIG_FILE, "decoder_start_token_id="
                  f"{found['decoder_start_token_id']!r} differs from "
                  f"pad_token_id={found['pad_token_id']!r}: mha's decoder "
                  "starts from the pad id.")
  for field, other in SAME_AS:
    if found[field] != found[other]:
      raise _refuse(source, CONFIG_FILE, f"{field}={found[field]!r} differs "
                    f"from {other}={found[other]!r}: mha's model has one "
                    "value for both.")
  if (not found["share_encoder_decoder_embeddings"]
      and found["tie_word_embeddings"]):
    raise _refuse(source, CONFIG_FILE, "share_encoder_decoder_embeddings="
                  "False with tie_word_embeddings=True cannot be imported: "
                  "mha ties all three matrices or none (share_embeddings).")


def model_changes(found: dict[str, Any]) -> dict[str, Any]:
  """The mha config fields of a Marian config (`MODEL_FIELDS`), with the
  paper's architecture Marian's is."""
  changes = {ours: found[theirs] for theirs, ours in MODEL_FIELDS}
  changes.update(
      num_layers=found["encoder_layers"], d_k=None, d_v=None,
      attention_type="scaled_dot", position_encoding="sinusoidal",
      layer_norm="post",
      ffn_activation=ACTIVATIONS[found["activation_function"]],
      layer_norm_epsilon=marian.MARIAN_LAYER_NORM_EPSILON,
      share_embeddings=bool(found["share_encoder_decoder_embeddings"]))
  return changes


def mha_config(source: str, base: ml_collections.ConfigDict,
               found: dict[str, Any]
               ) -> tuple[ml_collections.ConfigDict, TransformerConfig]:
  """`base` with the model fields of `found` (a config mha's model and
  Marian's mapping accept, or ModelImportError naming config.json)."""
  config = ml_collections.ConfigDict(base.to_dict())
  config.update(model_changes(found))
  config.init_from = None
  try:
    model_config = TransformerConfig.from_config(config)
    marian.check_representable(model_config)
  except (ExportError, ValueError) as e:
    raise _refuse(source, CONFIG_FILE, f"{e}") from None
  return config, model_config


class Vocabulary(NamedTuple):
  """The workdir's vocabulary files ({name: bytes}: spm.model, or
  source.spm, target.spm and vocab.json) and `order`: mha's id i is
  Marian's id order[i] (None: the same ids)."""
  files: dict[str, bytes]
  order: np.ndarray | None


def _read_spm(source: str) -> dict[str, bytes]:
  spm_bytes = {}
  for name in (SOURCE_SPM, TARGET_SPM):
    try:
      with open(os.path.join(source, name), "rb") as f:
        spm_bytes[name] = f.read()
    except OSError as e:
      raise _refuse(source, name, f"cannot be read ({e.strerror or e})."
                    ) from None
  return spm_bytes


def _marian_ids(source: str, found: dict[str, Any],
                vocab_size: int) -> dict[str, int]:
  """vocab.json: piece -> Marian's id, every id 0..vocab_size-1 once, its
  special pieces at config.json's ids."""
  vocab = _read_json(source, VOCAB_FILE)
  if (not all(isinstance(v, int) and not isinstance(v, bool)
              for v in vocab.values())
      or sorted(vocab.values()) != list(range(len(vocab)))):
    raise _refuse(source, VOCAB_FILE, "does not give the ids "
                  f"0..{len(vocab) - 1} each to one piece.")
  if len(vocab) != vocab_size:
    raise _refuse(source, CONFIG_FILE, f"vocab_size={vocab_size} but "
                  f"{VOCAB_FILE} has {len(vocab)} pieces.")
  for piece, field in SPECIAL_PIECES:
    if piece not in vocab:
      raise _refuse(source, VOCAB_FILE, f"has no {piece!r}: a Marian "
                    "vocabulary has <pad>, </s> and <unk>.")
    if field and vocab[piece] != found[field]:
      raise _refuse(source, CONFIG_FILE, f"{field}={found[field]!r} but "
                    f"{VOCAB_FILE} gives {piece!r} the id {vocab[piece]}.")
  return vocab


def read_vocabulary(source: str, found: dict[str, Any],
                    vocab_size: int) -> Vocabulary:
  """The workdir's vocabulary of the folder's SentencePiece models and
  vocab.json: mha's ids are Marian's permuted so that <pad>, </s>, <unk>
  are 0, 1, 2 (then the other pieces in Marian's order). One model for
  both sides whose pieces are in that order stays spm.model."""
  spm_bytes = _read_spm(source)
  if os.path.exists(os.path.join(source, TOKENIZER_CONFIG)):
    if _read_json(source, TOKENIZER_CONFIG).get("separate_vocabs"):
      raise _refuse(source, TOKENIZER_CONFIG, "separate_vocabs=true: mha "
                    f"has one id table ({VOCAB_FILE}) for both languages.")
  vocab = _marian_ids(source, found, vocab_size)
  special = [vocab[piece] for piece, _ in SPECIAL_PIECES]
  order = np.array(special + sorted(set(vocab.values()) - set(special)))
  by_id = sorted(vocab, key=vocab.get)
  table = {by_id[old]: new for new, old in enumerate(order)}
  same = np.array_equal(order, np.arange(len(order)))
  try:
    if spm_bytes[SOURCE_SPM] == spm_bytes[TARGET_SPM]:
      tokenizer = Tokenizer(spm_bytes[SOURCE_SPM])
      if [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)
          ] == by_id and same:
        return Vocabulary({workdir_lib.VOCABULARY_FILE:
                           spm_bytes[SOURCE_SPM]}, None)
    text = json.dumps(table, ensure_ascii=False).encode()
    SeparateTokenizer(spm_bytes[SOURCE_SPM], spm_bytes[TARGET_SPM], text,
                      folder=source)
  except DataError as e:
    raise ModelImportError(str(e).replace(" (in memory)", "")) from None
  return Vocabulary(dict(zip(SEPARATE_FILENAMES, (
      spm_bytes[SOURCE_SPM], spm_bytes[TARGET_SPM], text))),
      None if same else order)


def permute_vocabulary(source: str, state: dict[str, np.ndarray],
                       order: np.ndarray | None) -> dict[str, np.ndarray]:
  """Marian's state dict with the rows of its embeddings, lm_head and
  final_logits_bias in mha's id order (`Vocabulary.order`)."""
  if order is None:
    return state
  state = dict(state)
  for name in VOCABULARY_ROWS + ("final_logits_bias",):
    if name not in state:
      continue
    axis = -1 if name == "final_logits_bias" else 0
    if np.shape(state[name])[axis] != len(order):
      raise _refuse(source, WEIGHTS_FILE, f"{name} has "
                    f"{np.shape(state[name])[axis]} rows, {VOCAB_FILE} "
                    f"{len(order)} pieces.")
    state[name] = np.take(state[name], order, axis=axis)
  return state


def read_weights(source: str) -> dict[str, np.ndarray]:
  """model.safetensors as numpy arrays (one line on a damaged file)."""
  path = os.path.join(source, WEIGHTS_FILE)
  if not os.path.exists(path):
    others = [n for n in ("pytorch_model.bin", "tf_model.h5")
              if os.path.exists(os.path.join(source, n))]
    raise _refuse(source, WEIGHTS_FILE, "missing" + (
        f" ({', '.join(others)} is not read: save the model as safetensors)"
        if others else "") + ".")
  # pylint: disable=g-import-not-at-top  (optional)
  try:
    from safetensors import numpy as st_numpy
  except ImportError:
    raise ModelImportError(
        "mha-import needs the optional safetensors package, which is not "
        "installed: pip install 'mha[hf]' (or pip install safetensors)."
    ) from None
  try:
    return st_numpy.load_file(path)
  except Exception as e:  # pylint: disable=broad-exception-caught
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise _refuse(source, WEIGHTS_FILE, f"damaged or incomplete ({first}); "
                  "download it again.") from None


# Marian's attention layer (by its name's end) -> mha's.
_ATTENTION_LAYERS = {"self_attn": "self_attention",
                     "encoder_attn": "cross_attention"}


def bias_options(extras: dict[str, np.ndarray]) -> dict[str, bool]:
  """The model options the non-zero tensors of `extras` need:
  attention_bias (any attention bias), output_bias (final_logits_bias)."""
  nonzero = {name for name, value in extras.items() if np.any(value != 0)}
  return {"attention_bias": bool(nonzero - {"final_logits_bias"}),
          "output_bias": "final_logits_bias" in nonzero}


def add_biases(params: dict, extras: dict[str, np.ndarray],
               options: dict[str, bool], num_heads: int) -> dict:
  """`params` with the biases of `extras` where mha's attention module
  keeps them (`<query|key|value>_bias` [h, d], `out_bias` [M]) and
  `output_bias` [V], as `options` (`bias_options`) asks."""
  params = dict(params)
  if options["output_bias"]:
    params["output_bias"] = extras["final_logits_bias"]
  if not options["attention_bias"]:
    return params
  for name, value in extras.items():
    if name == "final_logits_bias":
      continue
    # model.<encoder|decoder>.layers.<i>.<layer>.<projection>.bias
    _, stack, _, i, layer, projection, _ = name.split(".")
    ours = f"{stack}_layers_{i}"
    params[ours] = dict(params[ours])
    attention = params[ours][_ATTENTION_LAYERS[layer]] = dict(
        params[ours][_ATTENTION_LAYERS[layer]])
    if projection == "out_proj":
      attention["out_bias"] = value
    else:
      mha_name = {t: o for o, t in marian.PROJECTIONS}[projection]
      attention[f"{mha_name}_bias"] = value.reshape(num_heads, -1)
  return params


def _check_keys(source: str, state: dict, expected: set[str],
                shared: bool) -> None:
  """Refuses a tensor mha has no place for (e.g. a BART-style embedding
  layer norm) and a tied copy that is not the shared matrix."""
  for name in sorted(set(state) - expected):
    if name in POSITION_TABLES:
      continue
    if shared and name in TIED_COPIES:
      if np.array_equal(state[name], state["model.shared.weight"]):
        continue
      raise _refuse(source, WEIGHTS_FILE, f"{name} differs from "
                    "model.shared.weight: mha shares one embedding matrix.")
    raise _refuse(source, WEIGHTS_FILE, f"holds {name}, which mha's "
                  "post-LN Transformer has no parameter for.")


def _model_shapes(model_config: TransformerConfig) -> Any:
  # pylint: disable=g-import-not-at-top  (JAX)
  import jax
  from mha.model.transformer import Transformer
  dummy = np.ones((1, 1), np.int32)
  return jax.eval_shape(Transformer(model_config).init,
                        jax.random.PRNGKey(0), dummy, dummy)["params"]


def marian_params(source: str, model_config: TransformerConfig,
                  state: dict[str, np.ndarray]
                  ) -> tuple[dict, dict[str, bool]]:
  """mha's parameters of Marian's state dict (its ids already mha's:
  `permute_vocabulary`), every tensor of it used, checked against the
  model's shapes, and the bias options (`bias_options`) they need."""
  try:
    params, extras = marian.marian_to_params(model_config, state)
  except KeyError as e:
    raise _refuse(source, WEIGHTS_FILE, f"has no tensor {e.args[0]} "
                  "(config.json describes another model).") from None
  except (ValueError, IndexError) as e:
    raise _refuse(source, WEIGHTS_FILE, f"a tensor of another shape than "
                  f"config.json describes ({e}).") from None
  options = bias_options(extras)
  if not model_config.share_embeddings:
    options["output_bias"] = False  # output_projection's own bias
  model_config = dataclasses.replace(model_config, **options)
  try:
    params = add_biases(params, extras, options, model_config.num_heads)
  except ValueError as e:
    raise _refuse(source, WEIGHTS_FILE, f"an attention bias of another "
                  f"shape than config.json describes ({e}).") from None
  mismatch = checkpoints.first_mismatch(params, _model_shapes(model_config))
  if mismatch:
    raise _refuse(source, WEIGHTS_FILE, f"does not fit config.json: "
                  f"{mismatch}.")
  _check_keys(source, state,
              set(marian.params_to_marian(model_config, params)),
              model_config.share_embeddings)
  return params, options


def check_target(workdir: str) -> None:
  """Refuses a target that exists and is not an empty folder, or a path
  the checkpoint library cannot use."""
  if "://" in workdir:
    raise ModelImportError(
        f"{validation.setting('workdir')}={workdir}: mha-import writes a "
        "local workdir; copy it to Cloud Storage afterwards.")
  workdir_lib.check_path_characters(workdir)
  if os.path.lexists(workdir) and (not os.path.isdir(workdir)
                                   or os.listdir(workdir)):
    raise ModelImportError(
        f"{validation.setting('workdir')}={workdir} exists and is not an "
        "empty folder: import into a new workdir.")


def _write_workdir(folder: str, config: ml_collections.ConfigDict,
                   vocabulary: dict[str, bytes], params: dict,
                   source: str) -> None:
  """config.json, the vocabulary's files and checkpoint `STEP` in
  `folder`."""
  workdir_lib.write_config(config, folder)
  for name, content in vocabulary.items():
    with open(os.path.join(folder, name), "wb") as f:
      f.write(content)
  manager = checkpoints.make_manager(folder, keep=1)
  try:
    checkpoints.save(manager, STEP, {"params": params},
                     {"step": STEP, "imported_from": os.path.abspath(source)})
  finally:
    manager.close()


def _staged(workdir: str, write: Callable[[str], None]) -> None:
  """`write(folder)` into a staging folder beside `workdir`, renamed to
  `workdir` once complete; removed if anything fails."""
  parent = os.path.dirname(os.path.abspath(workdir))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(
      prefix=f".{os.path.basename(os.path.abspath(workdir))}.import-",
      dir=parent)
  try:
    write(staging)
    if os.path.isdir(workdir):
      os.rmdir(workdir)  # empty (check_target)
    os.rename(staging, workdir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


def train_overrides(config: ml_collections.ConfigDict) -> str:
  """The --config flags that give a new run the imported model's shape (a
  warm start, `init_from`, needs it)."""
  fields = [ours for _, ours in MODEL_FIELDS] + [
      "num_layers", "share_embeddings", "ffn_activation", "attention_bias",
      "output_bias", "layer_norm_epsilon"]
  return " ".join(f"--config.{field}={config[field]}" for field in fields)


def import_model(source: str, workdir: str,
                 base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Writes the MarianMT folder `source` as the mha workdir `workdir`.

  Args:
    source: a local Hugging Face MarianMT folder (config.json,
      model.safetensors, source.spm, target.spm, vocab.json); only read.
    workdir: a new (or empty) local folder.
    base: the config the workdir records (data, training, search); its
      model fields are replaced by the imported model's.

  Returns:
    The config written as the workdir's config.json.

  Raises:
    ModelImportError: one line naming the file, field or tensor at fault;
      nothing is written.
  """
  check_target(workdir)
  if not os.path.isdir(source):
    raise ModelImportError(f"{validation.setting('source')}={source} is "
                           "not a folder.")
  found = marian_config(source)
  check_config(source, found)
  config, model_config = mha_config(source, base, found)
  vocabulary = read_vocabulary(source, found, model_config.vocab_size)
  state = permute_vocabulary(source, read_weights(source), vocabulary.order)
  params, options = marian_params(source, model_config, state)
  config.update(options)
  _staged(workdir, lambda folder: _write_workdir(
      folder, config, vocabulary.files, params, source))
  logging.info("Imported %s as workdir %s.", source, workdir)
  return config
