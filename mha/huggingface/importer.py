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
`config.json`: `MODEL_FIELDS`), `spm.model` (the folder's source.spm) and
`checkpoints/0/` (the parameters, written by mha's own checkpoint writer:
`mha.store.checkpoints`). eval.py evaluates it, `mha.load` translates with
it, mha-export exports it again, and a new run fine-tunes it as a warm
start (`--config.init_from=W`, with the model fields `train_overrides`
lists; not by resuming W itself: its checkpoint holds no optimizer state).

The parameters map as `mha.huggingface.marian` says. What mha's model
cannot compute is refused before anything is written, one line naming the
Marian config field (`UNSUPPORTED`), the tensor (a non-zero attention bias
or `final_logits_bias`, a tensor mha has no place for) or the file
(source.spm ≠ target.spm, a vocab.json that is not the SentencePiece
model's pieces in id order). A new model option of mha's is a row moved
from `UNSUPPORTED` to `MODEL_FIELDS`.

The workdir is written in a staging folder beside `W` and renamed to `W`
when complete: a refused or failed import leaves no workdir.
"""
import json
import os
import shutil
import tempfile
from typing import Any, Callable

from absl import logging
import ml_collections
import numpy as np

from mha import validation
from mha.data.token_ids import EOS_ID
from mha.data.token_ids import PAD_ID
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
    "activation_function": ("relu", "mha's feed-forward layer is the "
                            "paper's ReLU (no ffn_activation option)"),
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
    "pad_token_id": (PAD_ID, f"mha's pad id is {PAD_ID} (no vocab.json "
                     "id table)"),
    "eos_token_id": (EOS_ID, f"mha's EOS id is {EOS_ID} (no vocab.json "
                     "id table)"),
    "decoder_start_token_id": (PAD_ID, f"mha's decoder starts from id "
                               f"{PAD_ID}"),
}
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


def read_vocabulary(source: str, vocab_size: int) -> bytes:
  """source.spm, once target.spm, tokenizer_config.json and vocab.json
  agree with it as mha's one shared vocabulary needs."""
  spm_bytes = {}
  for name in (SOURCE_SPM, TARGET_SPM):
    try:
      with open(os.path.join(source, name), "rb") as f:
        spm_bytes[name] = f.read()
    except OSError as e:
      raise _refuse(source, name, f"cannot be read ({e.strerror or e})."
                    ) from None
  if spm_bytes[SOURCE_SPM] != spm_bytes[TARGET_SPM]:
    raise _refuse(source, TARGET_SPM, f"differs from {SOURCE_SPM}: mha has "
                  "one SentencePiece model for both languages (no separate "
                  "source and target vocabularies).")
  if os.path.exists(os.path.join(source, TOKENIZER_CONFIG)):
    if _read_json(source, TOKENIZER_CONFIG).get("separate_vocabs"):
      raise _refuse(source, TOKENIZER_CONFIG, "separate_vocabs=true: mha "
                    "has one vocabulary for both languages.")
  try:
    tokenizer = Tokenizer(spm_bytes[SOURCE_SPM])
  except DataError as e:
    reason = str(e).split(". ")[0].replace(" (in memory)", "")
    raise _refuse(source, SOURCE_SPM, f"{reason}.") from None
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  _check_vocab_json(source, pieces)
  if len(pieces) != vocab_size:
    raise _refuse(source, CONFIG_FILE, f"vocab_size={vocab_size} but "
                  f"{SOURCE_SPM} has {len(pieces)} pieces.")
  return spm_bytes[SOURCE_SPM]


def _check_vocab_json(source: str, pieces: list[str]) -> None:
  """vocab.json must give each piece its SentencePiece id (mha has no id
  table of its own)."""
  vocab = _read_json(source, VOCAB_FILE)
  for i, piece in enumerate(pieces):
    if vocab.get(piece) != i:
      raise _refuse(source, VOCAB_FILE, f"{piece!r} has id "
                    f"{vocab.get(piece)!r}, {SOURCE_SPM} id {i}: mha's ids "
                    "are the SentencePiece model's (no vocab.json id table).")
  if len(vocab) != len(pieces):
    extra = sorted(set(vocab) - set(pieces))[:3]
    raise _refuse(source, VOCAB_FILE, f"{len(vocab)} entries, {SOURCE_SPM} "
                  f"{len(pieces)} pieces (not in it: {extra}).")


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


def _check_extras(source: str, extras: dict[str, np.ndarray]) -> None:
  """Refuses the first non-zero tensor mha's model has no parameter for."""
  for name, value in extras.items():
    if np.any(value != 0):
      what = ("mha's model with shared embeddings has no output bias"
              if name == "final_logits_bias" else
              "mha's attention projections have no biases (§3.2.2)")
      raise _refuse(source, WEIGHTS_FILE, f"{name} is not zero: {what}.")


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
                  state: dict[str, np.ndarray]) -> dict:
  """mha's parameters of Marian's state dict, every tensor of it used,
  checked against the model's shapes."""
  try:
    params, extras = marian.marian_to_params(model_config, state)
  except KeyError as e:
    raise _refuse(source, WEIGHTS_FILE, f"has no tensor {e.args[0]} "
                  "(config.json describes another model).") from None
  except (ValueError, IndexError) as e:
    raise _refuse(source, WEIGHTS_FILE, f"a tensor of another shape than "
                  f"config.json describes ({e}).") from None
  mismatch = checkpoints.first_mismatch(params, _model_shapes(model_config))
  if mismatch:
    raise _refuse(source, WEIGHTS_FILE, f"does not fit config.json: "
                  f"{mismatch}.")
  _check_extras(source, extras)
  _check_keys(source, state,
              set(marian.params_to_marian(model_config, params)),
              model_config.share_embeddings)
  return params


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
                   spm_model: bytes, params: dict, source: str) -> None:
  """config.json, spm.model and checkpoint `STEP` in `folder`."""
  workdir_lib.write_config(config, folder)
  with open(os.path.join(folder, workdir_lib.VOCABULARY_FILE), "wb") as f:
    f.write(spm_model)
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
  fields = [ours for _, ours in MODEL_FIELDS] + ["num_layers",
                                                  "share_embeddings"]
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
  spm_model = read_vocabulary(source, model_config.vocab_size)
  params = marian_params(source, model_config, read_weights(source))
  _staged(workdir, lambda folder: _write_workdir(
      folder, config, spm_model, params, source))
  logging.info("Imported %s as workdir %s.", source, workdir)
  return config
