"""Test set-up: several fake CPU devices so that `pmap` code runs for real.

The flag must be set before jax is imported anywhere, hence at conftest import.
"""
import atexit
import hashlib
import importlib.metadata
import os
import pathlib
import shutil
import tempfile

# XLA:CPU flags of the tests that only some jaxlib versions know (XLA aborts
# at start-up on a flag in XLA_FLAGS it does not know): each with the first
# jaxlib version that lacks it. The one place that tells them apart.
FLAGS_REMOVED_IN = {"--xla_cpu_use_fusion_emitters=false": (0, 12)}


def jaxlib_version() -> tuple[int, int]:
  """The installed jaxlib's (major, minor), read without importing it."""
  major, minor = importlib.metadata.version("jaxlib").split(".")[:2]
  return int(major), int(minor)


def xla_flags(num_devices: int,
              jaxlib: tuple[int, int] | None = None) -> str:
  """XLA_FLAGS of the tests, in this process and their subprocesses:
  `num_devices` fake CPU devices, and XLA:CPU compiling for compile time:
  its LLVM back end at optimisation level 0 and its older (elemental)
  fusion code generator, the LLVM module compiled whole instead of split
  into parts for parallel compilation, and the default (not the
  concurrency-optimised) HLO scheduler. The suite's programs are tiny and
  each runs a few times, so compiling them costs more than running them.
  The last two cut the CPU time of a compile by ~20% (the suite's two
  workers keep both cores busy: the split's parallel compilation gained
  no time); like the first two, they change the last bits of some results
  (deterministically), which the suite's tolerances hold.
  Every process of the suite uses the same flags (the quickstart test,
  which runs the README's commands as a user does, uses none).
  A flag that `jaxlib` ((major, minor); default: the installed one) no
  longer knows is left out (FLAGS_REMOVED_IN): jaxlib 0.12 has only the
  new fusion emitters."""
  jaxlib = jaxlib or jaxlib_version()
  flags = [f"--xla_force_host_platform_device_count={num_devices}",
           "--xla_backend_optimization_level=0",
           "--xla_cpu_use_fusion_emitters=false",
           "--xla_cpu_parallel_codegen_split_count=1",
           "--xla_cpu_enable_concurrency_optimized_scheduler=false"]
  return " ".join(flag for flag in flags
                  if jaxlib < FLAGS_REMOVED_IN.get(flag, (1_000,)))


os.environ.setdefault("XLA_FLAGS", xla_flags(4))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The commands restart themselves once with huge pages on CPU hosts
# (mha/runtime/host_memory.py); the subprocess tests that wrap them (runpy with
# patches) would lose their patches in the restart. test_host_memory.py
# removes this to test the restart.
os.environ.setdefault("MHA_HUGE_PAGES", "0")
# Many tests compile the same tiny train step, in this process and in the
# subprocesses they start (which inherit the environment): a persistent
# compilation cache for this session saves most of those compiles.
# The process that makes it (pytest's, or xdist's controller: its workers
# inherit the variable) removes it at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
      prefix="mha_jax_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"],
                  ignore_errors=True)
# Every compile is kept, also the small ones: the suite's subprocesses and
# its two workers compile the same tiny programs again and again, and most
# take less than JAX's default threshold.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest  # noqa: E402

from configs import multi30k as multi30k_config  # noqa: E402
# The Cloud Storage emulator's fixtures, one emulator per session (worker).
from gcs_emulator import emulator  # noqa: E402,F401  pylint: disable=unused-import
from gcs_emulator import gcs_dir  # noqa: E402,F401  pylint: disable=unused-import

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def multi30k_dir() -> pathlib.Path | None:
  """configs/multi30k.py's folder ($MHA_MULTI30K_DIR, else
  ../shared/data/multi30k), if it holds the corpus."""
  path = pathlib.Path(multi30k_config.default_data_dir())
  return path if (path / "train.de.gz").exists() else None



# The tiny training config of the trainer tests: the synthetic pair and a
# 512-piece vocabulary keep sentences short (about 10 pieces), so three
# bucket shapes (lengths 8, 16, 24) hold them: few compiles. Bucketed as
# configs/base.py (the paper's §5.1), not packed as the quickstart is, so
# that the trainer tests run the default batching (packed, the suite passes
# too and takes ~4% less time).
TINY_OVERRIDES = dict(vocab_size=512, max_source_length=24,
                      max_target_length=24, max_tokens=768, max_len=64,
                      eval_bleu_sentences=0, pack_examples=False)


def tiny_config(**changes):
  """configs/quickstart.py:tiny with TINY_OVERRIDES, then `changes`."""
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  config = quickstart.get_config("tiny")
  config.update(TINY_OVERRIDES)
  config.update(changes)
  return config


# The loop of the tiny_workdir fixture (checkpoints 2, 4, 6): with
# tiny_config, the config of a run that goes on from it or starts from it.
TINY_WORKDIR_LOOP = dict(num_train_steps=6, checkpoint_every_steps=2,
                         eval_every_steps=100, keep_checkpoints=5,
                         max_decode_extra=8, eval_split="validation[:16]")


@pytest.fixture
def multi30k():
  path = multi30k_dir()
  if path is None:
    pytest.skip("Multi30k not found: set MHA_MULTI30K_DIR or place it at "
                "../shared/data/multi30k")
  return path


def built_once(tmp_path_factory, name: str, build) -> pathlib.Path:
  """`build(path)` run once for the whole session, also under xdist.

  Without xdist: `build` makes tmp/<name>N/run. Under xdist, the first
  worker to ask builds it into the session's folder shared by the workers
  (under a lock: the others wait for it), and each worker gets a copy of
  its own in its own tmp: what a worker writes (an evaluation's eval/)
  stays its own, as when each worker built it. A failed build shares
  nothing: the next worker to ask builds again (and fails alike).
  """
  path = tmp_path_factory.mktemp(name) / "run"
  if os.environ.get("PYTEST_XDIST_WORKER") is None:
    build(path)
    return path
  import fcntl  # pylint: disable=import-outside-toplevel
  shared = tmp_path_factory.getbasetemp().parent / f"shared_{name}"
  with open(f"{shared}.lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
    if not shared.exists():
      building = pathlib.Path(tempfile.mkdtemp(
          prefix=f".{shared.name}.", dir=shared.parent))
      build(building / "run")
      (building / "run").rename(shared)
      building.rmdir()
  shutil.copytree(shared, path)
  return path


@pytest.fixture(scope="session")
def tiny_workdir(tmp_path_factory) -> pathlib.Path:
  """A workdir trained for 6 steps (checkpoints 2, 4, 6) of the tiny config.

  Shared by the evaluation tests: a test that writes anything but eval/
  into it, or changes files there, works on a copy (shutil.copytree).
  Trained once per session: under xdist, each worker has its own copy
  (built_once).
  """
  from mha.train import trainer  # pylint: disable=import-outside-toplevel
  return built_once(tmp_path_factory, "tiny_workdir", lambda path: (
      trainer.train_and_evaluate(tiny_config(**TINY_WORKDIR_LOOP),
                                 str(path))))


def random_tiny_transformer(vocab_size: int, max_len: int, seed: int):
  """(model config, parameters) of configs/base.py:tiny with one encoder
  and one decoder layer, unshared embeddings, deterministic, and
  paper_reference's random parameters (nothing to compile): the decoding
  tests' model."""
  # pylint: disable=import-outside-toplevel  (jax after the flags above)
  import jax
  import numpy as np
  from configs import base
  import paper_reference
  from mha.model import transformer
  model_config = transformer.TransformerConfig.from_config(
      base.get_config("tiny"), deterministic=True, num_encoder_layers=1,
      num_decoder_layers=1, vocab_size=vocab_size, max_len=max_len,
      share_embeddings=False)
  dummy = np.ones((1, 4), np.int32)
  shapes = jax.eval_shape(transformer.Transformer(model_config).init,
                          jax.random.PRNGKey(0), dummy, dummy)["params"]
  return model_config, paper_reference.random_params(shapes, seed=seed)


def file_hashes(path: pathlib.Path) -> dict[str, str | None]:
  """sha256 of every file under `path` (folders: None), by relative path:
  equal before and after = nothing under `path` was added, removed or
  changed."""
  return {str(p.relative_to(path)):
          hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
          for p in sorted(path.rglob("*"))}


@pytest.fixture
def copy(tiny_workdir, tmp_path) -> pathlib.Path:
  """A private copy of tiny_workdir without its eval/ (tmp_path/'run'): the
  tests that write into a trained workdir, or damage it, work on this."""
  path = tmp_path / "run"
  shutil.copytree(tiny_workdir, path, ignore=shutil.ignore_patterns("eval"))
  return path


@pytest.fixture
def train_batches_starts(monkeypatch) -> list[int]:
  """The `start_step` of each call of `mha.data.train_batches` in the test,
  in order (the calls recorded, then made as before)."""
  from mha import data  # pylint: disable=import-outside-toplevel
  starts = []
  train_batches = data.train_batches

  def recording(config, tokenizer, **kwargs):
    starts.append(kwargs["start_step"])
    return train_batches(config, tokenizer, **kwargs)

  monkeypatch.setattr(data, "train_batches", recording)
  return starts


def _command_main(monkeypatch, module_name: str, name: str):
  """`module_name`'s main, with its flags parsed in this process and reset
  after: `run('--workdir=...', ...)` returns its exit status (bad input:
  the one-line message on stderr, exit status 1)."""
  import importlib  # pylint: disable=import-outside-toplevel
  import logging  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel
  module = importlib.import_module(module_name)
  monkeypatch.setattr(sys, "argv", [name])  # messages' command name
  # Parsing absl's flags sets the absl logger's level (--verbosity): put it
  # back, or later tests' caplog would miss the library's INFO lines.
  level = logging.getLogger("absl").level

  def run(*args):
    flags.FLAGS.unparse_flags()
    flags.FLAGS([name, *args])
    try:
      return module.main([name])
    except SystemExit as e:
      return e.code

  yield run
  flags.FLAGS.unparse_flags()
  logging.getLogger("absl").setLevel(level)
  # The commands' main hides the libraries' INFO lines: show them again.
  from mha.runtime import library_logs  # pylint: disable=import-outside-toplevel
  library_logs.configure(verbose=True)


@pytest.fixture
def eval_py(monkeypatch):
  """eval.py's main in this process (`_command_main`)."""
  yield from _command_main(monkeypatch, "mha.cli.eval", "eval.py")


@pytest.fixture
def translate_main(monkeypatch):
  """mha-translate's main in this process (`_command_main`)."""
  yield from _command_main(monkeypatch, "mha.cli.translate", "mha-translate")


# The tests marked `slow` (each half a minute to two minutes of subprocesses)
# go first: xdist hands tests to its workers in collection order, and one
# started last would run alone at the end of the suite. CI runs them;
# `pytest -m "not slow"` leaves them out for a quick local run.
def pytest_collection_modifyitems(config, items):
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def random_workdir(tiny_workdir, tmp_path_factory) -> pathlib.Path:
  """tiny_workdir's config and vocabulary with random parameters as its one
  checkpoint (step 1): a model whose translations are long and varied (the
  6-step model of tiny_workdir emits EOS first: empty translations).

  Random values as tests/paper_reference.py draws them (nothing to
  compile). Read-only for the tests, as tiny_workdir.
  """
  # pylint: disable=import-outside-toplevel
  import shutil
  import jax
  import numpy as np
  import paper_reference
  from mha.store import checkpoints
  from mha.store import workdir as workdir_lib
  from mha.model.transformer import Transformer, TransformerConfig
  # pylint: enable=import-outside-toplevel
  path = tmp_path_factory.mktemp("random_workdir") / "run"
  path.mkdir()
  for name in ("config.json", "spm.model"):
    shutil.copy(tiny_workdir / name, path / name)
  config = workdir_lib.Workdir(str(path)).load_config()
  model = Transformer(TransformerConfig.from_config(config,
                                                    deterministic=True))
  dummy = np.ones((1, 4), np.int32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy,
                          dummy)["params"]
  manager = checkpoints.make_manager(str(path), keep=1)
  checkpoints.save(manager, 1, {"params": paper_reference.random_params(
      shapes, seed=0)}, {"step": 1})
  manager.close()
  return path


@pytest.fixture
def tfds_dir_for_the_session(tmp_path_factory, monkeypatch):
  """MHA_TFDS_DIR in the session's temporary folder: local and synthetic
  data prepared once for the tests that use it."""
  monkeypatch.setenv("MHA_TFDS_DIR", str(tmp_path_factory.getbasetemp()
                                         / "tfds"))


def synthetic_config(**changes):
  """configs/base.py:tiny on the synthetic pair, vocabulary 100, then
  `changes`."""
  from configs import base  # pylint: disable=import-outside-toplevel
  config = base.get_config("tiny")
  config.update(dict(dataset_name="synthetic", source_lang="src",
                     target_lang="tgt", vocab_size=100))
  config.update(changes)
  return config
