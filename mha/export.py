"""Export a trained workdir to CTranslate2, the inference engine of OpenNMT,
fairseq and Marian users.

    from mha import export
    export.export("/tmp/run", "/tmp/run_ct2", quantization="int8")

    import ctranslate2, sentencepiece
    sp = sentencepiece.SentencePieceProcessor(
        model_file="/tmp/run_ct2/spm.model")
    translator = ctranslate2.Translator("/tmp/run_ct2")
    out = translator.translate_batch(
        [sp.encode("Ein Hund läuft.", out_type=str)], beam_size=4,
        min_decoding_length=0, max_input_length=MAX_LEN)  # mha_export.json
    print(sp.decode(out[0].hypotheses[0]))

CTranslate2's search is not mha's (its length penalty is |Y|^α, not
GNMT's, its beam stops once `beam_size` hypotheses have ended, its length
limit is per call): greedy outputs are the same given the same limit and
min_decoding_length=0; beam outputs may differ.

The output folder holds CTranslate2's `model.bin` and `config.json`, the
vocabulary (`shared_vocabulary.json`: the SentencePiece pieces in id order,
so CTranslate2's ids are the project's), the workdir's `spm.model`, and
`mha_export.json` (which checkpoint it is, the workdir's search
settings, the files written: a re-export into the folder refuses to delete
others). The parameters are one checkpoint (the latest, or `step`) or the
element-wise mean of the last N (`average_last`), read by the evaluator's
own `load_params`.

How the model maps onto `ctranslate2.specs.TransformerSpec`:

* token embeddings times √d_model (`scale_embeddings`), the position table
  written out whole (`position_encodings.encodings`, `[max_len, d_model]`:
  the project's interleaved sinusoids or its learned table), so CTranslate2
  never makes its own (its sinusoids are laid out differently);
* the decoder starts from token 0 (`decoder_start_token` = piece 0), and
  the source ends with EOS (`add_source_eos`), as in `mha.search.texts`;
* post-LN (`pre_norm=False`, LayerNorm(x + Sublayer(x)), no final norm) or
  pre-LN (`pre_norm=True` with the final encoder and decoder norms); layer
  norm ε = `config.layer_norm_epsilon` (flax's 1e-6 by default);
* the FFN's activation (`config.ffn_activation`): relu, swish or gelu,
  CTranslate2's RELU, SWISH and GELU (its exact erf form, as ours);
* the h heads' projections (no bias, §3.2.2; with `config.attention_bias`
  their biases, fused the same way) fused as CTranslate2 reads them
  (`[h·d_k, d_model]`, heads major; it takes d_k from their size, so h·d_k
  ≠ d_model is fine), and the logit scale 1/√d_k (scaled dot) or 1 (`dot`,
  `queries_scale`);
* the pre-softmax map: the shared embedding matrix (§3.4) with
  `output_bias` where `config.output_bias`, or the separate projection
  with its bias.

Additive and location-aware attention, and keys and values of different
sizes (d_k ≠ d_v), have no CTranslate2 layer: they are refused with one line
(`ExportError`) before anything is read or written.
"""
import contextlib
import json
import os
import shutil
import uuid
from typing import Any, Callable, Iterator, NamedTuple

from absl import logging
import numpy as np

from mha.evaluation import output as eval_output
from mha.store import trained
from mha.runtime import files
from mha import validation
from mha.store import workdir as workdir_lib
from mha.data import tokenizer as tokenizer_lib
from mha.errors import DiskError
from mha.errors import ExportError
from mha.errors import UserError
from mha.errors import WorkdirError
from mha.errors import os_reason
from mha.model.positional import sinusoidal_encoding
from mha.search.settings import SearchSettings
from mha.model.transformer import TransformerConfig

# The formats, and CTranslate2's quantisations offered (its own, made at
# conversion): the one table of rules holds them, beside the rules of the
# flags that choose them.
FORMATS = validation.EXPORT_FORMATS
QUANTIZATIONS = validation.QUANTIZATIONS
MANIFEST_FILE = workdir_lib.EXPORT_MANIFEST  # marks a folder written here
VOCABULARY_FILE = "spm.model"
# config.ffn_activation -> the name of CTranslate2's `specs.Activation`.
ACTIVATIONS = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}


def check_exportable(model_config: TransformerConfig) -> None:
  """Refuses the variants CTranslate2 has no layer for.

  Raises:
    ExportError: naming the config field at fault.
  """
  if model_config.ffn_activation not in ACTIVATIONS:
    raise ExportError(
        f"config.ffn_activation={model_config.ffn_activation!r} cannot be "
        f"exported to CTranslate2: it has {', '.join(ACTIVATIONS)} here.")
  if model_config.attention_type not in ("scaled_dot", "dot"):
    raise ExportError(
        f"config.attention_type={model_config.attention_type!r} cannot be "
        "exported to CTranslate2: it has only dot-product attention "
        "('scaled_dot' or 'dot').")
  d_k, d_v = _head_sizes(model_config)
  if d_k != d_v:
    raise ExportError(
        f"config.d_k={d_k} and config.d_v={d_v} differ: CTranslate2's "
        "attention has one head size for keys and values.")


def _head_sizes(model_config: TransformerConfig) -> tuple[int, int]:
  default = model_config.d_model // model_config.num_heads
  return model_config.d_k or default, model_config.d_v or default


# ------------------------------------------------------------ the model spec


def _f32(x: Any) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x, np.float32))


def _linear(spec, kernel: Any, bias: Any = None) -> None:
  """A CTranslate2 linear layer from a flax kernel `[in, out]` (transposed:
  CTranslate2 stores `[out, in]`)."""
  spec.weight = _f32(np.asarray(kernel).T)
  if bias is not None:
    spec.bias = _f32(bias)


def _heads_kernel(kernel: Any) -> np.ndarray:
  """A fused projection `[d_model, h, d]` as `[d_model, h·d]` (heads major,
  CTranslate2's split of its output into heads)."""
  kernel = np.asarray(kernel)
  return kernel.reshape(kernel.shape[0], -1)


def _fused(p: dict, names: tuple[str, ...], part: str) -> np.ndarray | None:
  """The projections `names` side by side, heads major: their kernels
  (`part` 'kernel', `[d_model, h·d]` each) or biases ('bias', `[h·d]`
  each; None for a model without them)."""
  if f"{names[0]}_{part}" not in p:
    return None
  arrays = [np.asarray(p[f"{n}_{part}"]) for n in names]
  if part == "kernel":
    arrays = [_heads_kernel(a) for a in arrays]
  return np.concatenate([a.reshape(a.shape[0], -1) if part == "kernel"
                         else a.reshape(-1) for a in arrays], axis=-1)


def _attention(spec, p: dict, self_attention: bool, scale: float) -> None:
  """linear_0 = [Q; K; V] (self) or Q, linear_1 = [K; V] (cross), last =
  W^O `[h, d_v, d_model]` as `[h·d_v, d_model]`; with their biases where
  the model has them (config.attention_bias)."""
  groups = ([("query", "key", "value")] if self_attention
            else [("query",), ("key", "value")])
  for linear, names in zip(spec.linear, groups):
    _linear(linear, _fused(p, names, "kernel"), _fused(p, names, "bias"))
  w_out = np.asarray(p["out_kernel"])
  _linear(spec.linear[-1], w_out.reshape(-1, w_out.shape[-1]),
          p.get("out_bias"))
  spec.queries_scale = np.float32(scale)


def _layer_norm(spec, p: dict) -> None:
  spec.gamma = _f32(p["scale"])
  spec.beta = _f32(p["bias"])


def _ffn(spec, p: dict, norm: dict) -> None:
  _linear(spec.linear_0, p["w1"]["kernel"], p["w1"]["bias"])
  _linear(spec.linear_1, p["w2"]["kernel"], p["w2"]["bias"])
  _layer_norm(spec.layer_norm, norm)


def _positions(model_config: TransformerConfig, params: dict,
               name: str) -> np.ndarray:
  """The `[max_len, d_model]` table the model adds to its embeddings."""
  if model_config.position_encoding == "learned":
    return _f32(params[name]["embedding"])
  return sinusoidal_encoding(model_config.max_len, model_config.d_model)


def build_spec(model_config: TransformerConfig, params: dict,
               pieces: list[str]):
  """The `ctranslate2.specs.TransformerSpec` of a model and its parameters.

  Args:
    model_config: the model's config (`check_exportable` passes).
    params: its parameters (the `params` collection), as arrays.
    pieces: the vocabulary's pieces in id order.

  Returns:
    The spec, with vocabularies and config set, not yet validated.
  """
  from ctranslate2 import specs  # pylint: disable=import-outside-toplevel
  check_exportable(model_config)
  pre_norm = model_config.layer_norm == "pre"
  activation = getattr(specs.Activation,
                       ACTIVATIONS[model_config.ffn_activation])
  # No head_dim: CTranslate2 takes the head size from the projections' rows
  # (h·d_k may differ from d_model; a head_dim given here is not read).
  encoder = specs.TransformerEncoderSpec(
      model_config.num_encoder_layers, model_config.num_heads,
      pre_norm=pre_norm, activation=activation)
  decoder = specs.TransformerDecoderSpec(
      model_config.num_decoder_layers, model_config.num_heads,
      pre_norm=pre_norm, activation=activation)
  _fill_encoder(encoder, model_config, params)
  _fill_decoder(decoder, model_config, params)
  spec = specs.TransformerSpec(encoder, decoder)
  spec.config.layer_norm_epsilon = model_config.layer_norm_epsilon
  spec.config.unk_token = pieces[tokenizer_lib.UNK_ID]
  spec.config.eos_token = pieces[tokenizer_lib.EOS_ID]
  # No BOS in the project's vocabulary; the decoder starts from token 0.
  spec.config.bos_token = pieces[tokenizer_lib.PAD_ID]
  spec.config.decoder_start_token = pieces[tokenizer_lib.PAD_ID]
  spec.config.add_source_eos = True
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  return spec


def _fill_stack(spec, model_config: TransformerConfig, params: dict,
                side: str) -> None:
  """The positions, the layers and, pre-LN, the final norm of the side
  `encoder` or `decoder` (whose layers also attend to the encoder)."""
  decoder = side == "decoder"
  spec.position_encodings.encodings = _positions(
      model_config, params,
      "target_positions" if decoder else "source_positions")
  scale = _queries_scale(model_config)
  self_block = "self_attention_block" if decoder else "attention_block"
  for i, layer_spec in enumerate(spec.layer):
    p = params[f"{side}_layers_{i}"]
    _attention(layer_spec.self_attention, p["self_attention"], True, scale)
    _layer_norm(layer_spec.self_attention.layer_norm,
                p[self_block]["layer_norm"])
    if decoder:
      _attention(layer_spec.attention, p["cross_attention"], False, scale)
      _layer_norm(layer_spec.attention.layer_norm,
                  p["cross_attention_block"]["layer_norm"])
    _ffn(layer_spec.ffn, p["ffn"], p["ffn_block"]["layer_norm"])
  if model_config.layer_norm == "pre":
    _layer_norm(spec.layer_norm, params[f"{side}_norm"])


def _fill_encoder(spec, model_config: TransformerConfig, params: dict
                  ) -> None:
  spec.embeddings[0].weight = _f32(params["source_embed"]["embedding"])
  _fill_stack(spec, model_config, params, "encoder")


def _fill_decoder(spec, model_config: TransformerConfig, params: dict
                  ) -> None:
  embed = "source_embed" if model_config.share_embeddings else "target_embed"
  spec.embeddings.weight = _f32(params[embed]["embedding"])
  _fill_stack(spec, model_config, params, "decoder")
  if model_config.share_embeddings:  # §3.4: the embedding matrix, [V, M]
    spec.projection.weight = _f32(params["source_embed"]["embedding"])
    if model_config.output_bias:
      spec.projection.bias = _f32(params["output_bias"])
  else:
    projection = params["output_projection"]
    _linear(spec.projection, projection["kernel"], projection["bias"])


def _queries_scale(model_config: TransformerConfig) -> float:
  """The logits' factor: 1/√d_k (eq. 1), or 1 for unscaled `dot`."""
  if model_config.attention_type == "dot":
    return 1.0
  return _head_sizes(model_config)[0] ** -0.5


# ------------------------------------------------------------ output folder


def _check_output_dir(output_dir: str) -> None:
  """Refuses a URL, a file, a folder inside a workdir's checkpoints/, and a
  non-empty folder that is not an export. A symbolic link is followed: the
  folder it points at is the one checked (and written).

  Raises:
    ExportError: naming `output_dir` (`--output_dir`) and what is there.
  """
  name = f"{validation.setting('output_dir')}={output_dir}"
  if files.has_scheme(output_dir):
    raise ExportError(
        f"{name}: an export is written to a local folder; export locally "
        "and copy the folder.")
  target = os.path.realpath(output_dir)
  _check_not_in_checkpoints(name, target)
  if not os.path.lexists(target):
    return
  if not os.path.isdir(target):
    raise ExportError(f"{name} is a file, not a folder.")
  present = os.listdir(target)
  manifest = os.path.join(target, MANIFEST_FILE)
  if present and not os.path.isfile(manifest):
    raise ExportError(
        f"{name} is a non-empty folder that is not an export of this project "
        f"(no {MANIFEST_FILE}): choose an empty or new folder.")
  # An earlier export is replaced whole: files put there since would go.
  try:
    with open(manifest, encoding="utf-8") as f:
      written = set(json.load(f).get("files", _EXPORT_FILES))
  except (OSError, ValueError, AttributeError):
    written = set(_EXPORT_FILES)
  others = sorted(set(present) - written)
  if others:
    raise ExportError(
        f"{name} is an earlier export that also holds files it did not write "
        f"({', '.join(others)}), which replacing it would delete: move them, "
        "or choose another folder.")


def _check_not_in_checkpoints(name: str, target: str) -> None:
  """Refuses a folder `target` (links resolved) that is a workdir's
  checkpoints/ or lies inside it: a step folder that is not a checkpoint
  would make the workdir's newest step "damaged" for training and
  translation."""
  folder = target
  while folder != os.path.dirname(folder):
    if (os.path.basename(folder) == workdir_lib.CHECKPOINTS_DIR
        and workdir_lib.is_workdir(os.path.dirname(folder))):
      raise ExportError(
          f"{name} lies inside {folder}, the checkpoints of the workdir "
          f"{os.path.dirname(folder)}: an export there would read as a "
          "damaged checkpoint; choose a folder outside checkpoints/.")
    folder = os.path.dirname(folder)


# What an export wrote before its manifest listed its files.
_EXPORT_FILES = ("config.json", "model.bin", "shared_vocabulary.json",
                 "source_vocabulary.json", "target_vocabulary.json",
                 VOCABULARY_FILE, MANIFEST_FILE)


def _move_into_place(staging: str, output_dir: str) -> None:
  """Renames the finished `staging` folder to `output_dir` (a symbolic
  link: to the folder it points at, the link kept); a previous export there
  is set aside first and deleted only once the new one is in place. An
  error or a SIGTERM on the way puts the previous one back."""
  output_dir = os.path.realpath(output_dir)
  old = f"{output_dir}.old-{uuid.uuid4().hex[:8]}"
  emptied = False
  try:
    if os.path.lexists(output_dir):
      if os.listdir(output_dir):
        os.rename(output_dir, old)
      else:
        os.rmdir(output_dir)
        emptied = True
    os.rename(staging, output_dir)
  except BaseException:
    if not os.path.lexists(output_dir):
      if os.path.lexists(old):
        os.rename(old, output_dir)
      elif emptied:
        os.mkdir(output_dir)
    raise
  shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _staged(output_dir: str) -> Iterator[str]:
  """A new staging folder beside `output_dir` (beside the folder a link
  points at) for the block to fill, renamed into place when it ends
  (`_move_into_place`) and removed if it fails: a SIGTERM too, even one
  that comes as the folder is made.

  Raises:
    DiskError: the machine refuses a write (a full disk, a read-only file
      system): one line naming `output_dir`; nothing was changed there.
  """
  target = os.path.realpath(output_dir)
  parent = os.path.dirname(target)
  staging = os.path.join(parent, f".{os.path.basename(target)}"
                         f".staging-{uuid.uuid4().hex[:8]}")
  try:
    with _disk_errors(output_dir, parent):
      os.makedirs(staging)  # inside the try: removed if a signal follows
      yield staging
      _move_into_place(staging, target)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


@contextlib.contextmanager
def _disk_errors(output_dir: str, parent: str) -> Iterator[None]:
  """An OSError inside (a full disk, a read-only file system) as the one
  line of a `DiskError` naming `output_dir` and the folder `parent`."""
  try:
    yield
  except OSError as e:
    target = os.path.realpath(output_dir)
    kept = ("; the earlier export there is as it was"
            if os.path.isdir(target) and os.listdir(target) else "")
    raise DiskError(
        f"{validation.setting('output_dir')}={output_dir}: cannot write the "
        f"export in {parent}: {os_reason(e)}; nothing was written{kept}."
    ) from None


class _ExportLock(eval_output.OutputLock):
  """`.<name>.lock` beside the output folder: one export writes it at a
  time."""

  def busy(self, holder: dict, same_host: bool) -> UserError:
    where = "" if same_host else f" on host {holder.get('host')}"
    return ExportError(
        f"Another export (process {holder.get('pid')}{where}, started "
        f"{holder.get('started')}) is writing {self.workdir} (lock "
        f"{self.path}): wait for it, or give another "
        f"{validation.setting('output_dir')}.")


@contextlib.contextmanager
def _locked(output_dir: str) -> Iterator[None]:
  """Holds `output_dir`'s export lock (beside the folder a link points
  at); a parent folder made for it and left empty is removed again.

  Raises:
    ExportError: another export holds it.
    DiskError: the lock cannot be written (a full disk, a read-only file
      system), naming `output_dir`.
  """
  target = os.path.realpath(output_dir)
  parent = os.path.dirname(target)
  created = not os.path.exists(parent)
  lock = _ExportLock(target)
  try:
    with _disk_errors(output_dir, parent):
      os.makedirs(parent, exist_ok=True)
      try:
        lock.acquire()
      except WorkdirError as e:  # the lock file cannot be written
        if not isinstance(e.__context__, OSError):
          raise
        raise e.__context__ from None
  except BaseException:
    if created and os.path.isdir(parent) and not os.listdir(parent):
      os.rmdir(parent)
    raise
  try:
    yield
  finally:
    lock.release()


def _import_ctranslate2():
  """The optional `ctranslate2` module, or one line saying how to get it."""
  try:
    import ctranslate2  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ExportError(
        f"{validation.setting('export_format', 'format')}=ctranslate2 needs "
        "the optional ctranslate2 package, which "
        "is not installed: pip install ctranslate2 (the project's export "
        "requirements).") from None
  return ctranslate2


def _write_folder(spec, vocabulary: bytes | None, manifest: dict[str, Any],
                  output_dir: str) -> None:
  """The model (`spec.save(folder)`), spm.model (unless `vocabulary` is
  None) and the manifest, written into a staging folder beside
  `output_dir` and renamed into place (`_staged`)."""
  with _staged(output_dir) as staging:
    spec.save(staging)
    if vocabulary is not None:
      with open(os.path.join(staging, VOCABULARY_FILE), "wb") as f:
        f.write(vocabulary)
    manifest = dict(manifest, files=sorted(os.listdir(staging) +
                                           [MANIFEST_FILE]))
    with open(os.path.join(staging, MANIFEST_FILE), "w",
              encoding="utf-8") as f:
      json.dump(manifest, f, indent=2)
      f.write("\n")


def write_export(spec, manifest: dict[str, Any], output_dir: str,
                 vocabulary: bytes | None = None) -> None:
  """Writes an export (`spec.save(folder)` writes its files, `vocabulary`
  the spm.model if given, then the manifest) under `output_dir`'s lock,
  the folder checked again, staged beside it and renamed into place.

  Raises:
    ExportError: another export holds the lock, or the folder is not ours.
  """
  with _locked(output_dir):
    _check_output_dir(output_dir)  # again: what is there now
    _write_folder(spec, vocabulary, manifest, output_dir)


# ----------------------------------------------------------------- export


class Checkpoint(NamedTuple):
  """A workdir's checkpoint as an export reads it (`read_checkpoint`)."""
  config: Any  # the workdir's config.json
  tokenizer: Any  # its `Tokenizer` or `SeparateTokenizer`
  model_config: TransformerConfig
  params: dict[str, Any]
  step: int  # the checkpoint's step (the last one averaged)
  steps: list[int]  # the steps read (more than one: their mean)
  pieces: list[str]  # the vocabulary's pieces in id order


def read_checkpoint(workdir: str, output_dir: str, step: int | None,
                    average_last: int | None,
                    check: Callable[[TransformerConfig, Any], None]
                    ) -> Checkpoint:
  """What an export writes out, each format's (CTranslate2 here, Hugging
  Face in `mha.huggingface.export`): checks `output_dir` (a folder that is
  not an export is refused), reads the workdir's config and vocabulary,
  checks them (`check(model_config, tokenizer)` raises the format's
  `ExportError`), then reads checkpoint `step` (None: the latest) or the
  mean of the last `average_last` up to it, and checks that it fits.

  Raises:
    ExportError: the output folder is not ours, or `check`'s refusal.
    UserError: the workdir or its checkpoints cannot be read (as eval.py);
      a damaged step's advice names the export's `step` setting.
  """
  _check_output_dir(output_dir)
  config, tokenizer = trained.load_workdir(workdir)
  model_config = TransformerConfig.from_config(config)
  check(model_config, tokenizer)
  with validation.choosing_step("export", "step"):  # a damaged step's advice
    params, checkpoint_step, steps = trained.load_params(
        workdir, step, average_last)
  trained.check_fit(config, params, workdir, checkpoint_step)
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  return Checkpoint(config, tokenizer, model_config, params, checkpoint_step,
                    steps, pieces)


def check_flags(*, export_format: str = "ctranslate2",
                quantization: str | None = None, step: int | None = None,
                average_last: int | None = None) -> None:
  """Checks the flags that need no workdir, each by its rule in the one
  table of rules (`mha.validation.FLAGS`).

  Raises:
    ExportError: naming the first flag out of range.
  """
  for keyword, name, value in (
      ("export_format", "format", export_format),
      ("quantization", "quantization", quantization), ("step", "step", step),
      ("average_last", "average_last", average_last)):
    if value is not None:
      validation.check_flag(name, value, ExportError, keyword)


def export(workdir: str, output_dir: str, *,
           export_format: str = "ctranslate2",
           quantization: str | None = None, step: int | None = None,
           average_last: int | None = None) -> dict[str, Any]:
  """Writes a workdir's checkpoint as a CTranslate2 model folder.

  The folder is written beside `output_dir` and renamed into place when
  complete: a failed export leaves `output_dir` as it was.

  Args:
    workdir: the training workdir (local or gs://); only read.
    output_dir: a new or empty local folder, or one holding an earlier
      export of this module (replaced); a symbolic link is followed (the
      folder it points at is written, the link kept). Not inside a
      workdir's checkpoints/.
    export_format: `ctranslate2`, the one format here (`huggingface`:
      `mha.huggingface.export.export_model`).
    quantization: `int8` (CTranslate2's 8-bit weights, per output row) or
      None / `float32`.
    step: the checkpoint; None = the latest.
    average_last: export the mean of the last N checkpoints up to `step`.

  Returns:
    The manifest written as `mha_export.json`.

  Raises:
    ExportError: a bad flag, a model variant CTranslate2 cannot represent,
      or an output folder that is not ours.
    DiskError: the output folder cannot be written (a full disk, a
      read-only file system); nothing there changed.
    UserError: the workdir or its checkpoints cannot be read (as eval.py).
  """
  check_flags(export_format=export_format, quantization=quantization,
              step=step, average_last=average_last)
  if export_format != "ctranslate2":
    raise ExportError(
        f"{validation.setting('export_format', 'format')}={export_format} "
        "is written by mha.huggingface.export.export_model, not here.")
  ctranslate2 = _import_ctranslate2()

  def check(model_config, tokenizer):
    if isinstance(tokenizer, tokenizer_lib.SeparateTokenizer):
      raise ExportError(
          f"{workdir} has separate source and target vocabularies "
          f"({tokenizer.path}): the CTranslate2 export writes one shared "
          "spm.model, which cannot encode both.")
    check_exportable(model_config)

  read = read_checkpoint(workdir, output_dir, step, average_last, check)
  spec = build_spec(read.model_config, read.params, read.pieces)
  spec.validate()
  spec.optimize(quantization=quantization or "float32")
  manifest = {
      "format": export_format, "ctranslate2_version": ctranslate2.__version__,
      "workdir": os.fspath(workdir), "checkpoint_step": read.step,
      "averaged_steps": read.steps, "quantization": quantization or "float32",
      # The workdir's search settings, but the products' dtype (a setting
      # of this code's search, not of CTranslate2's: its compute type).
      **{k: v for k, v in SearchSettings.of_config(read.config).as_dict(
      ).items() if k != "matmul_dtype"},
      "max_len": read.model_config.max_len}
  write_export(spec, manifest, output_dir,
               files.read_bytes(read.tokenizer.path))
  logging.info("Exported step(s) %s of %s to %s (CTranslate2, %s).",
               read.steps, workdir, output_dir, manifest["quantization"])
  return manifest
