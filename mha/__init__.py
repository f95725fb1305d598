"""mha: the Transformer of "Attention Is All You Need" in JAX/Flax.

`mha.load(workdir)` gives a `Translator` of a trained model (mha/translator.py).
The package's folders, each listed in its `__init__`: `data/`, `model/`,
`search/`, `scoring/`, `store/`, `train/`, `evaluation/`, `runtime/` and
`cli/`; at the top only this face, `errors`, `validation`, `translator`
and `export`.
The public names below are imported on first use (PEP 562), so that the
commands' start-up (`mha.cli.startup`) costs nothing before their restart
with huge pages (`mha.runtime.host_memory`) and JAX is loaded once.

Importing mha sets `EPATH_USE_TF=false` unless it is set already: etils.epath
(through which Orbax and JAX's compilation cache reach gs:// paths) would
otherwise switch to TensorFlow's file system for every gs:// path whenever
TensorFlow is installed. With it, gs:// goes through fsspec's gcsfs, with or
without TensorFlow installed: the path tests/test_gcs.py runs against a
Cloud Storage emulator. epath reads the variable at its first gs:// path.
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys

from mha.runtime import versions as _versions

# An unsupported Python, JAX or flax: one line, before anything imports them.
_versions.check()

os.environ.setdefault("EPATH_USE_TF", "false")

# Modules that lived at the top of the package before the folders by
# concern (2026-11): `import mha.attention` and `from mha import decoding`
# still work and give the module at its new home (the same module object,
# so a patch of one is a patch of the other).
MOVED = {
    "attention": "mha.model.attention", "dropout": "mha.model.dropout",
    "positional": "mha.model.positional",
    "transformer": "mha.model.transformer", "losses": "mha.model.losses",
    "optim": "mha.model.optim", "flops": "mha.model.flops",
    "token_ids": "mha.data.token_ids",
    "decoding": "mha.search.decoding", "batch_search": "mha.search.batches",
    "translate": "mha.search.texts", "search_settings": "mha.search.settings",
    "search_cache": "mha.search.trace_cache",
    "trainer": "mha.train.trainer", "train_step": "mha.train.step",
    "train_setup": "mha.train.setup", "train_actions": "mha.train.actions",
    "train_evals": "mha.train.evals", "devices": "mha.train.devices",
    "warm_start": "mha.train.warm_start",
    "config_check": "mha.train.config_check",
    "evaluator": "mha.evaluation.evaluator",
    "eval_output": "mha.evaluation.output",
    "follow": "mha.evaluation.follow",
    "attention_maps": "mha.evaluation.attention_maps",
    "paper_bleu": "mha.scoring.paper_bleu",
    "workdir": "mha.store.workdir", "checkpoints": "mha.store.checkpoints",
    "metrics": "mha.store.metrics", "event_files": "mha.store.event_files",
    "files": "mha.runtime.files", "sigterm": "mha.runtime.sigterm",
    "distributed": "mha.runtime.distributed",
    "cpu_devices": "mha.runtime.cpu_devices",
    "host_memory": "mha.runtime.host_memory",
    "library_logs": "mha.runtime.library_logs",
    "tensorflow_loader": "mha.runtime.tensorflow_loader",
    "compilation_cache": "mha.runtime.compilation_cache",
    "compile_time": "mha.runtime.compile_time",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """`mha.<old name>` imported as the module at its new home."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    package, _, name = fullname.rpartition(".")
    if package != __name__ or name not in MOVED:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    module = importlib.import_module(MOVED[spec.name.rpartition(".")[2]])
    spec.loader_state = module.__spec__  # the import system overwrites it
    return module

  def exec_module(self, module):
    # Its own spec back, so that it stays the module of its new home.
    module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
  sys.meta_path.append(_MovedModules())

_EXPORTS = {
    "additive_attention": "mha.model.attention",
    "dot_product_attention": "mha.model.attention",
    "masked_softmax": "mha.model.attention",
    "MultiHeadAttention": "mha.model.attention",
    "scaled_dot_product_attention": "mha.model.attention",
    "accuracy": "mha.model.losses",
    "cross_entropy_with_label_smoothing": "mha.model.losses",
    "negative_log_likelihood": "mha.model.losses",
    "create_optimizer": "mha.model.optim",
    "noam_schedule": "mha.model.optim",
    "AddPositionEncoding": "mha.model.positional",
    "sinusoidal_encoding": "mha.model.positional",
    "create_model": "mha.model.transformer",
    "Transformer": "mha.model.transformer",
    "TransformerConfig": "mha.model.transformer",
    "SearchSettings": "mha.search.settings",
    "use_cpu_cores": "mha.runtime.cpu_devices",
    "load": "mha.translator",
    "Translator": "mha.translator",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in MOVED:  # `mha.decoding` after `import mha`
    return importlib.import_module(f"{__name__}.{name}")
  if name not in _EXPORTS:
    raise AttributeError(f"module 'mha' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value  # later lookups skip this function
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_EXPORTS))
