"""Export a trained workdir as a Hugging Face MarianMT model folder.

    from mha.huggingface import export
    export.export_model("/tmp/run", "/tmp/run_hf")

    from transformers import pipeline
    translate = pipeline("translation", model="/tmp/run_hf")
    print(translate("Ein Hund läuft.")[0]["translation_text"])

or `mha-export --workdir=/tmp/run --format=huggingface
--output_dir=/tmp/run_hf`. The folder is what `MarianMTModel` and
`MarianTokenizer.from_pretrained` read: `config.json`,
`generation_config.json`, `model.safetensors` (written by the
`safetensors` package's numpy API: no torch needed), `source.spm` and
`target.spm` (both the workdir's shared spm.model, or its separate
source.spm and target.spm), `vocab.json` (each piece's id: the
SentencePiece ids themselves, or the separate vocabulary's id table, in
mha's ids: an imported OPUS-MT model comes back with pad, EOS and unk at
0, 1, 2 and its tensors' vocabulary rows permuted alike),
`tokenizer_config.json`,
a `README.md` model card, and `mha_export.json` (the manifest of
`mha.export`, whose output-folder rules and staging this export shares).
The parameters map onto Marian's layers as `mha.huggingface.marian` says.

Special ids: pad = 0 and the decoder's start token = 0 (mha's decoder
starts from token 0), EOS = 1 appended to the source by the tokenizer (as
`mha.search.texts` does), unk = 2, no forced EOS at the length limit (mha
cuts an output there). The generation config holds the workdir's search:
its beam size, `length_penalty` = its α (transformers divides a
hypothesis' log-probability by length^α, not by GNMT's ((5+length)/6)^α:
beam outputs may differ, greedy ones do not; docs/evaluation.md), and
`max_length` = the model's `max_len` + 1 (the start token counts).
"""
import json
import os
from typing import Any

from absl import logging
import numpy as np

from mha import export as export_lib
from mha import validation
from mha.errors import ExportError
from mha.huggingface import marian
from mha.model.transformer import TransformerConfig
from mha.runtime import files
from mha.search.settings import SearchSettings
from mha.store import workdir as workdir_lib
from mha.data.token_ids import EOS_ID
from mha.data.token_ids import PAD_ID
from mha.data.token_ids import UNK_ID
from mha.data.tokenizer import SeparateTokenizer
from mha.data.tokenizer import Tokenizer

FORMAT = "huggingface"
WEIGHTS_FILE = "model.safetensors"
MODEL_CARD = "README.md"


def config_json(model_config: TransformerConfig) -> dict[str, Any]:
  """`config.json`: transformers' `MarianConfig` of the model."""
  cfg = model_config
  share = cfg.share_embeddings
  return {
      "architectures": ["MarianMTModel"], "model_type": "marian",
      "vocab_size": cfg.vocab_size, "decoder_vocab_size": cfg.vocab_size,
      "d_model": cfg.d_model, "encoder_layers": cfg.num_encoder_layers,
      "decoder_layers": cfg.num_decoder_layers,
      "encoder_attention_heads": cfg.num_heads,
      "decoder_attention_heads": cfg.num_heads,
      "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
      "max_position_embeddings": cfg.max_len,
      "activation_function": cfg.ffn_activation, "dropout": cfg.dropout_rate,
      "attention_dropout": cfg.attention_dropout_rate,
      "activation_dropout": 0.0, "encoder_layerdrop": 0.0,
      "decoder_layerdrop": 0.0, "scale_embedding": True,
      "share_encoder_decoder_embeddings": share,
      "tie_word_embeddings": share, "is_encoder_decoder": True,
      "pad_token_id": PAD_ID, "eos_token_id": EOS_ID,
      "decoder_start_token_id": PAD_ID, "bos_token_id": None,
      "forced_eos_token_id": None, "use_cache": True, "dtype": "float32"}


def generation_config_json(model_config: TransformerConfig,
                           settings: SearchSettings) -> dict[str, Any]:
  """`generation_config.json`: the workdir's search, as near as
  transformers' `generate` comes (the module docstring)."""
  return {
      "decoder_start_token_id": PAD_ID, "pad_token_id": PAD_ID,
      "eos_token_id": EOS_ID, "bos_token_id": None,
      "forced_eos_token_id": None, "num_beams": settings.beam_size,
      "length_penalty": settings.alpha,
      # "never": a beam ends when no live hypothesis can beat the finished
      # ones (mha's exact rule); True: once num_beams have ended.
      "early_stopping": "never" if settings.beam_stop == "exact" else True,
      "no_repeat_ngram_size": settings.no_repeat_ngram_size,
      "max_length": model_config.max_len + 1}


def tokenizer_files(model_config: TransformerConfig, pieces: list[str],
                    spm_model: bytes | None,
                    separate: dict[str, bytes] | None = None
                    ) -> dict[str, bytes]:
  """source.spm, target.spm, vocab.json and tokenizer_config.json: both
  models the shared `spm_model` and vocab.json its ids, or the files of a
  separate vocabulary (`SeparateTokenizer.files`, whose vocab.json has
  mha's ids). `separate_vocabs` stays false: Marian's one id table."""
  tokenizer_config = {
      "tokenizer_class": "MarianTokenizer", "separate_vocabs": False,
      "unk_token": pieces[UNK_ID], "eos_token": pieces[EOS_ID],
      "pad_token": pieces[PAD_ID], "model_max_length": model_config.max_len,
      "source_lang": None, "target_lang": None}
  if separate is not None:
    return {**separate,
            "tokenizer_config.json": _json_bytes(tokenizer_config)}
  vocab = {piece: i for i, piece in enumerate(pieces)}
  return {"source.spm": spm_model, "target.spm": spm_model,
          "vocab.json": _json_bytes(vocab),
          "tokenizer_config.json": _json_bytes(tokenizer_config)}


def _json_bytes(value: Any) -> bytes:
  return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


def _eval_results(workdir: str, steps: list[int]) -> list[dict[str, Any]]:
  """The metrics.json of the workdir's evaluations of exactly `steps`
  (local or gs://; an unreadable one is left out)."""
  eval_root = workdir_lib.Workdir(workdir).eval_root
  found = []
  for name in files.listdir(eval_root) if files.isdir(eval_root) else []:
    try:
      metrics = json.loads(files.read_bytes(
          os.path.join(eval_root, name, "metrics.json")))
    except (OSError, ValueError):
      continue
    if (isinstance(metrics, dict) and "bleu" in metrics
        and list(metrics.get("averaged_steps") or []) == steps):
      found.append(metrics)
  return found


def model_card(config: Any, manifest: dict[str, Any],
               results: list[dict[str, Any]]) -> str:
  """README.md: the data, the steps, BLEU of the workdir's evaluations of
  these parameters, the command that wrote the folder."""
  steps = manifest["averaged_steps"]
  which = (f"checkpoint {steps[0]}" if len(steps) == 1 else
           f"the mean of the {len(steps)} checkpoints {steps}")
  languages = [config.get("source_lang"), config.get("target_lang")]
  lines = [
      "---", "library_name: transformers", "pipeline_tag: translation",
      "tags: [translation, marian, mha]",
      *(["language: [" + ", ".join(languages) + "]"]
        if all(languages) else []), "---", "",
      "# A Transformer trained with mha, as a MarianMT model", "",
      f"- Data: `{config.get('dataset_name')}` "
      f"({config.get('source_lang')} → {config.get('target_lang')}), "
      f"split `{config.get('train_split')}`.",
      f"- Parameters: {which} of the run `{manifest['workdir']}`.", ""]
  if results:
    lines += ["| split | beam | α | BLEU |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.get('split')} | {r.get('beam_size')} | "
              f"{r.get('alpha')} | {float(r['bleu']):.2f} |" for r in results]
    lines += ["", "BLEU of mha's own search (eval.py, sacreBLEU); "
              "transformers' beam search scores lengths differently.", ""]
  else:
    lines += ["No evaluation of these parameters in the workdir.", ""]
  lines += ["Written by:", "", "```", manifest["command"], "```", "",
            "```python", "from transformers import pipeline",
            "translate = pipeline(\"translation\", model=\"<this folder>\")",
            "translate(\"...\")[0][\"translation_text\"]", "```", ""]
  return "\n".join(lines)


def _command(workdir: str, output_dir: str, step: int | None,
             average_last: int | None) -> str:
  words = ["mha-export", f"--workdir={workdir}", f"--format={FORMAT}",
           f"--output_dir={output_dir}"]
  words += [f"--step={step}"] * (step is not None)
  words += [f"--average_last={average_last}"] * (average_last is not None)
  return " ".join(words)


def _import_safetensors():
  """`safetensors.numpy`, or one line saying how to get it."""
  # pylint: disable=g-import-not-at-top  (optional)
  try:
    from safetensors import numpy as st_numpy
  except ImportError:
    raise ExportError(
        f"{validation.setting('export_format', 'format')}={FORMAT} needs "
        "the optional safetensors package, which is not installed: pip "
        "install 'mha[hf]' (or pip install safetensors).") from None
  return st_numpy


def _vocabulary_files(model_config: TransformerConfig,
                      tokenizer: Tokenizer | SeparateTokenizer,
                      pieces: list[str]) -> dict[str, bytes]:
  """`tokenizer_files` of the workdir's vocabulary, shared or separate."""
  if isinstance(tokenizer, SeparateTokenizer):
    return tokenizer_files(model_config, pieces, None, tokenizer.files)
  return tokenizer_files(model_config, pieces,
                         files.read_bytes(tokenizer.path))


class _Folder:
  """The files of the export, written by `mha.export`'s staging as a
  CTranslate2 spec is (`save(folder)`)."""

  def __init__(self, contents: dict[str, bytes],
               weights: dict[str, np.ndarray], st_numpy):
    self.contents, self.weights, self.st_numpy = contents, weights, st_numpy

  def save(self, folder: str) -> None:
    self.st_numpy.save_file(self.weights, os.path.join(folder, WEIGHTS_FILE),
                            metadata={"format": "pt"})
    for name, content in self.contents.items():
      with open(os.path.join(folder, name), "wb") as f:
        f.write(content)


def export_model(workdir: str, output_dir: str, *, step: int | None = None,
                 average_last: int | None = None,
                 quantization: str | None = None) -> dict[str, Any]:
  """Writes a workdir's checkpoint as a Hugging Face MarianMT folder.

  The folder is written beside `output_dir` and renamed into place when
  complete: a failed export leaves `output_dir` as it was.

  Args:
    workdir: the training workdir (local or gs://); only read.
    output_dir: a new or empty local folder, or one holding an earlier
      export (replaced).
    step: the checkpoint; None = the latest.
    average_last: export the mean of the last N checkpoints up to `step`.
    quantization: None or `float32` (the weights are float32).

  Returns:
    The manifest written as `mha_export.json`.

  Raises:
    ExportError: a bad flag, a model variant Marian cannot represent, or
      an output folder that is not ours (before anything is written).
    UserError: the workdir or its checkpoints cannot be read (as eval.py).
  """
  export_lib.check_flags(export_format=FORMAT, step=step,
                         average_last=average_last)
  if quantization not in (None, "float32"):
    raise ExportError(
        f"{validation.setting('quantization')}={quantization}: the "
        f"{FORMAT} export writes float32 weights only.")
  st_numpy = _import_safetensors()
  read = export_lib.read_checkpoint(
      workdir, output_dir, step, average_last,
      lambda model_config, _: marian.check_representable(model_config))
  model_config = read.model_config
  manifest = {
      "format": FORMAT, "workdir": os.fspath(workdir),
      "checkpoint_step": read.step, "averaged_steps": read.steps,
      "quantization": "float32", "max_len": model_config.max_len,
      "command": _command(os.fspath(workdir), os.fspath(output_dir), step,
                          average_last)}
  contents = {
      "config.json": _json_bytes(config_json(model_config)),
      "generation_config.json": _json_bytes(generation_config_json(
          model_config, SearchSettings.of_config(read.config))),
      **_vocabulary_files(model_config, read.tokenizer, read.pieces),
      MODEL_CARD: model_card(read.config, manifest,
                             _eval_results(workdir, read.steps)).encode()}
  weights = marian.params_to_marian(model_config, read.params)
  export_lib.write_export(_Folder(contents, weights, st_numpy), manifest,
                          output_dir)
  logging.info("Exported step(s) %s of %s to %s (Hugging Face Marian).",
               read.steps, workdir, output_dir)
  return manifest
