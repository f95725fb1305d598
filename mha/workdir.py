"""The workdir's resolved config: written by training, read by evaluation."""
import json
import os

import ml_collections

from mha.data import files

# Fields that change the shapes of the parameters or the vocabulary: a workdir
# trained with other values cannot be resumed with these.
MODEL_SHAPE_FIELDS = (
    "vocab_size", "num_layers", "num_encoder_layers", "num_decoder_layers",
    "d_model", "d_ff", "num_heads", "d_k", "d_v", "attention_type",
    "location_filter_sizes", "location_num_filters", "position_encoding",
    "layer_norm", "share_embeddings", "max_len",
)
# Fields that shape parameters only when attention_type is 'location': for
# another attention type they may change freely.
LOCATION_FIELDS = ("location_filter_sizes", "location_num_filters")
# Fields that decide which examples fill which batch: changed on resume, the
# run goes on (from the checkpoint's count of batches read) but does not
# replay the batches an uninterrupted run would have seen.
DATA_ORDER_FIELDS = (
    "dataset_name", "data_dir", "source_lang", "target_lang", "train_split",
    "max_source_length", "max_target_length", "max_tokens", "pack_examples",
    "grad_accum_steps", "seed",
)
CONFIG_FILE = "config.json"


def check_local(workdir: str) -> None:
  """Refuses a workdir given as a URL (gs://...).

  config.json, metrics.jsonl and the evaluation outputs are written with
  local file I/O (metrics.jsonl is appended to, which object stores do not
  offer), so a URL would silently become a local folder named 'gs:'.
  """
  if files.has_scheme(workdir):
    raise ValueError(
        f"--workdir={workdir}: URLs are not supported as workdirs. Mount the "
        "bucket (e.g. gcsfuse on a TPU VM) or use a shared filesystem, and "
        "pass its local path.")


def _saved_and_given(config: ml_collections.ConfigDict, workdir: str
                     ) -> tuple[dict | None, dict]:
  """(the workdir's config.json or None if it has none, `config`), as dicts."""
  path = os.path.join(workdir, CONFIG_FILE)
  saved = None
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
  return saved, json.loads(config.to_json())


def check_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a workdir whose saved config differs in a model-shape field.

  Raises:
    ValueError naming the field, the saved and the given value.
  """
  saved, given = _saved_and_given(config, workdir)
  if saved is None:
    return
  path = os.path.join(workdir, CONFIG_FILE)
  location = "location" in (saved.get("attention_type"),
                            given.get("attention_type"))
  for field in MODEL_SHAPE_FIELDS:
    if field in LOCATION_FIELDS and not location:
      continue
    if field in saved and saved[field] != given.get(field):
      raise ValueError(
          f"{path} was written with {field}={saved[field]!r} but the config "
          f"gives {field}={given.get(field)!r}; a workdir holds one model. "
          f"Use another --workdir or --config.{field}={saved[field]!r}.")


def changed_data_fields(config: ml_collections.ConfigDict,
                        workdir: str) -> list[str]:
  """DATA_ORDER_FIELDS whose value differs from the workdir's config.json,
  as 'field: saved -> given' (empty for a new workdir)."""
  saved, given = _saved_and_given(config, workdir)
  if saved is None:
    return []
  return [f"{field}: {saved[field]!r} -> {given.get(field)!r}"
          for field in DATA_ORDER_FIELDS
          if field in saved and saved[field] != given.get(field)]


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  path = os.path.join(workdir, CONFIG_FILE)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(config.to_json(indent=2))
  os.replace(tmp, path)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config a training run stored in `workdir`."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: is {workdir} a workdir "
                            "written by train.py?")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))
