"""mha: the Transformer of "Attention Is All You Need" in JAX/Flax.

`mha.load(workdir)` gives a `Translator` of a trained model (mha/translator.py).
The public names below are imported on first use (PEP 562), so that the
commands' start-up (`mha.cli.startup`) costs nothing before their restart
with huge pages (`mha.host_memory`) and JAX is loaded once.

Importing mha sets `EPATH_USE_TF=false` unless it is set already: etils.epath
(through which Orbax and JAX's compilation cache reach gs:// paths) would
otherwise switch to TensorFlow's file system for every gs:// path whenever
TensorFlow is installed. With it, gs:// goes through fsspec's gcsfs, with or
without TensorFlow installed: the path tests/test_gcs.py runs against a
Cloud Storage emulator. epath reads the variable at its first gs:// path.
"""
import importlib
import os

os.environ.setdefault("EPATH_USE_TF", "false")

_EXPORTS = {
    "additive_attention": "mha.attention",
    "dot_product_attention": "mha.attention",
    "masked_softmax": "mha.attention",
    "MultiHeadAttention": "mha.attention",
    "scaled_dot_product_attention": "mha.attention",
    "accuracy": "mha.losses",
    "cross_entropy_with_label_smoothing": "mha.losses",
    "negative_log_likelihood": "mha.losses",
    "create_optimizer": "mha.optim",
    "noam_schedule": "mha.optim",
    "AddPositionEncoding": "mha.positional",
    "sinusoidal_encoding": "mha.positional",
    "create_model": "mha.transformer",
    "Transformer": "mha.transformer",
    "TransformerConfig": "mha.transformer",
    "SearchSettings": "mha.search_settings",
    "use_cpu_cores": "mha.cpu_devices",
    "load": "mha.translator",
    "Translator": "mha.translator",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'mha' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value  # later lookups skip this function
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_EXPORTS))
