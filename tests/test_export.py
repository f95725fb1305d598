"""Export to CTranslate2 (mha/export.py, mha/cli/export.py), checked against
the real `ctranslate2` package: its teacher-forced log-probabilities equal
mha's to 1e-4 per token, its greedy outputs are mha's, its int8 model
translates, and the variants it cannot represent are refused.

The greedy comparison needs a model whose outputs are not trivial: the
conftest `tiny_workdir` (6 training steps) answers EOS first, so its
parameters are trained further, here, to copy the synthetic pair's source
sentences (a jitted Adam loop of a few hundred tiny steps): its greedy
outputs then end with EOS at various lengths or run to their length limit,
and both stopping rules are compared.
"""
import functools
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import sentencepiece as spm

from conftest import file_hashes
from conftest import REPO_ROOT
from conftest import tiny_config
# gcsfs to the emulator (the fixture of the gs:// training test).
from test_gcs import gcsfs_on_emulator  # noqa: F401  pylint: disable=unused-import
from mha.store import checkpoints
from mha.store import trained
from mha import export
from mha.runtime import files
from mha.search import texts as translate
from mha import validation
from mha.store import workdir as workdir_lib
from mha.data import sources
from mha.model.transformer import Transformer
from mha.model.transformer import TransformerConfig

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="ctranslate2 is not installed (the optional export "
    "dependency: pip install ctranslate2)")

EOS = 1
COPY_STEP = 100  # the checkpoint step of the copy-trained parameters
NUM_TEST = 24  # test sentences compared


# ----------------------------------------------------------------- helpers


def write_workdir(path, config, params, spm_model, step: int = 1):
  """A workdir as training leaves it: config.json, spm.model, a checkpoint
  `step` whose state holds `params`."""
  files.makedirs(str(path))  # local or gs://
  workdir_lib.write_config(config, str(path))
  with open(spm_model, "rb") as f:
    files.write_bytes_atomic(os.path.join(str(path), "spm.model"), f.read())
  manager = checkpoints.make_manager(str(path), keep=5)
  checkpoints.save(manager, step, {"params": params}, {"step": step})
  manager.close()
  return path


def random_params(model_config: TransformerConfig, seed: int,
                  input_scale: float = 1.0):
  """Parameters with every leaf random (layer norms not 1 and 0, biases not
  0), so that a mapping that swaps two leaves of one shape shows.
  `input_scale` multiplies the token and learned position tables: small,
  the first layer norm's inputs have a variance near its ε."""
  model = Transformer(model_config)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          np.ones((1, 4), np.int32),
                          np.ones((1, 4), np.int32))["params"]
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    name = getattr(path[-1], "key", "")
    x = rng.normal(size=shape.shape)
    if name == "scale":
      x = 1.0 + 0.2 * x
    elif name == "bias":
      x = 0.2 * x
    elif name == "embedding":
      x = x * shape.shape[-1] ** -0.5 * input_scale
    else:
      x = x / np.sqrt(shape.shape[0])
    return x.astype(np.float32)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


def first_test_pairs(config, n: int = NUM_TEST):
  """The first `n` (source, reference) pairs of the test split."""
  split = sources.open_split(config, config.test_split)
  pairs = []
  for chunk_sources, chunk_targets in split.read(n):
    pairs += list(zip(chunk_sources, chunk_targets))
    if len(pairs) >= n:
      break
  return pairs[:n]


@functools.lru_cache
def _forward(model_config: TransformerConfig):
  """The jitted teacher-forced forward pass, one per model config."""
  return jax.jit(Transformer(model_config).apply)


def _padded(rows: list[list[int]], length: int) -> np.ndarray:
  out = np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def mha_log_probs(model_config, params, source_ids, target_ids):
  """Teacher-forced log P(y_t | y_<t, x) of each target token (lists of
  ids with EOS), from the model's full forward pass (not its decoder
  cache), in one padded batch."""
  targets = _padded(target_ids, 32)
  logits = _forward(model_config.replace(deterministic=True))(
      {"params": params}, _padded(source_ids, 32), targets)
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  return [row[:len(t)] for row, t in zip(picked, target_ids)]


def assert_scores_equal(output_dir, model_config, params, tokenizer, pairs,
                        atol=1e-4):
  """CTranslate2's score_batch equals mha's teacher-forced log-probabilities
  (each target token and the final EOS) to `atol`."""
  translator = ctranslate2.Translator(str(output_dir), intra_threads=1)
  source_ids = [tokenizer.encode(s) for s, _ in pairs]
  target_ids = [tokenizer.encode(t) for _, t in pairs]
  pieces = lambda ids: [tokenizer.id_to_piece(i) for i in ids]
  results = translator.score_batch([pieces(s) for s in source_ids],
                                   [pieces(t) for t in target_ids])
  ours = mha_log_probs(model_config, params, [s + [EOS] for s in source_ids],
                       [t + [EOS] for t in target_ids])
  for result, expected in zip(results, ours):
    np.testing.assert_allclose(result.log_probs, expected, rtol=0, atol=atol)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def copy_workdir(tiny_workdir, tmp_path_factory):
  """tiny_workdir's model trained on to copy the source sentences of the
  synthetic training split, saved as checkpoint COPY_STEP of a new
  workdir."""
  config, tokenizer = trained.load_workdir(str(tiny_workdir))
  params, _, _ = trained.load_params(str(tiny_workdir))
  model = Transformer(TransformerConfig.from_config(config,
                                                    deterministic=True))
  split = sources.open_split(config, config.train_split)
  texts = list(next(split.read(512))[0])
  ids = [i + [EOS] for i in tokenizer.encode_batch(texts) if len(i) < 16]
  data = np.zeros((len(ids), 16), np.int32)
  for row, sentence in enumerate(ids):
    data[row, :len(sentence)] = sentence
  optimizer = optax.adam(3e-3)

  def loss_fn(p, x):
    log_probs = jax.nn.log_softmax(model.apply({"params": p}, x, x))
    nll = -jnp.take_along_axis(log_probs, x[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * (x > 0)) / jnp.sum(x > 0)

  @jax.jit
  def train_step(p, state, x):
    grads = jax.grad(loss_fn)(p, x)
    updates, state = optimizer.update(grads, state, p)
    return optax.apply_updates(p, updates), state

  state = optimizer.init(params)
  rng = np.random.default_rng(0)
  for _ in range(200):
    params, state = train_step(params, state,
                               data[rng.integers(0, len(data), 64)])
  path = tmp_path_factory.mktemp("export") / "copy_run"
  return write_workdir(path, config, jax.device_get(params),
                       tiny_workdir / "spm.model", step=COPY_STEP)


@pytest.fixture(scope="module")
def copy_model(copy_workdir):
  """(config, model config, params, tokenizer) of copy_workdir."""
  config, tokenizer = trained.load_workdir(str(copy_workdir))
  params, step, _ = trained.load_params(str(copy_workdir))
  assert step == COPY_STEP
  return (config, TransformerConfig.from_config(config, deterministic=True),
          params, tokenizer)


@pytest.fixture(scope="module")
def copy_export(copy_workdir, tmp_path_factory):
  output_dir = tmp_path_factory.mktemp("ct2") / "float32"
  export.export(str(copy_workdir), str(output_dir))
  return output_dir


# ---------------------------------------------------- equality with mha


def test_teacher_forced_scores_equal_mha(copy_model, copy_export):
  config, model_config, params, tokenizer = copy_model
  assert_scores_equal(copy_export, model_config, params, tokenizer,
                      first_test_pairs(config))


def _mha_hypothesis(output: np.ndarray, limit: int) -> list[int]:
  """The generated ids: up to and including EOS, else the first `limit`."""
  output = [int(i) for i in output]
  return output[:output.index(EOS) + 1] if EOS in output else output[:limit]


def ct2_greedy(translator, sources: list[list[str]], extra: int
               ) -> list[list[str]]:
  """CTranslate2's greedy outputs (end token included) of source pieces
  with mha's limit: CTranslate2's max_decoding_length is per call, so one
  call per limit (source pieces + EOS + `extra`), and min_decoding_length=0
  (its default, 1, forbids an immediate EOS)."""
  by_limit = {}
  for i, pieces in enumerate(sources):
    by_limit.setdefault(len(pieces) + 1 + extra, []).append(i)
  outputs = [None] * len(sources)
  for limit, rows in by_limit.items():
    results = translator.translate_batch(
        [sources[i] for i in rows], beam_size=1, max_decoding_length=limit,
        min_decoding_length=0, return_end_token=True)
    for i, result in zip(rows, results):
      outputs[i] = result.hypotheses[0]
  return outputs


def test_greedy_outputs_identical_to_mha(copy_model, copy_export):
  config, model_config, params, tokenizer = copy_model
  extra = config.max_decode_extra
  sources = [s for s, _ in first_test_pairs(config)]
  pairs = translate.translate_ids(model_config, params, tokenizer, sources,
                                  beam_size=1, alpha=0.0,
                                  max_decode_extra=extra)
  ours = [[tokenizer.id_to_piece(i)
           for i in _mha_hypothesis(out, len(src) + extra)]
          for src, out in pairs]
  # Only the export folder, as a user has it: its spm.model and the model.
  sp = spm.SentencePieceProcessor(model_file=str(copy_export / "spm.model"))
  translator = ctranslate2.Translator(str(copy_export), intra_threads=1)
  theirs = ct2_greedy(translator, [sp.encode(s, out_type=str)
                                   for s in sources], extra)
  assert theirs == ours
  assert [sp.decode([p for p in o if p != "</s>"]) for o in theirs] == [
      translate.detokenize(tokenizer, out) for _, out in pairs]
  # Not trivial: outputs of several lengths, some ended by EOS, some by the
  # length limit.
  ended = [o for o in ours if o[-1] == "</s>" and len(o) > 2]
  assert 2 <= len(ended) < len(ours)
  assert len({len(o) for o in ours}) >= 4


def test_int8_export_loads_and_translates(copy_workdir, copy_model,
                                          copy_export, tmp_path):
  config, model_config, params, tokenizer = copy_model
  manifest = export.export(str(copy_workdir), str(tmp_path / "int8"),
                           quantization="int8")
  assert manifest["quantization"] == "int8"
  # 8-bit weights: the model file is well under half the float32 one.
  size = lambda d: os.path.getsize(os.path.join(d, "model.bin"))
  assert size(tmp_path / "int8") < 0.4 * size(copy_export)
  pairs = first_test_pairs(config, 8)
  translator = ctranslate2.Translator(str(tmp_path / "int8"),
                                      compute_type="int8")
  results = translator.translate_batch(
      [[tokenizer.id_to_piece(i) for i in tokenizer.encode(s)]
       for s, _ in pairs], beam_size=4, max_decoding_length=32)
  assert all(r.hypotheses[0] for r in results)
  # Rounded weights and activations, the same model: scores near float32's
  # (a wrong scale or layout would be off by whole units; the rounding moves
  # the log-probability of a token the model finds unlikely, near -10, by
  # a few tenths, depending on the trained weights).
  assert_scores_equal(tmp_path / "int8", model_config, params, tokenizer,
                      pairs, atol=0.5)


# -------------------------------------------------- variants, random models

# name: (config changes, input_scale of random_params).
VARIANTS = {
    # Inputs of variance ~1e-5 into the first pre-LN norm: its ε (1e-6, not
    # CTranslate2's default) shows in the scores.
    "pre_ln_separate_learned": (dict(layer_norm="pre",
                                     share_embeddings=False,
                                     position_encoding="learned"), 3e-3),
    "two_heads_d_k_24_layers_1_2": (dict(num_heads=2, d_k=24, d_v=24,
                                         num_encoder_layers=1,
                                         num_decoder_layers=2), 1.0),
    "dot_eight_heads": (dict(attention_type="dot", num_heads=8), 1.0),
    # OPUS-MT's options: swish, the attention and output biases (random,
    # not 0), ε 1e-5.
    "marian": (dict(ffn_activation="swish", attention_bias=True,
                    output_bias=True, layer_norm_epsilon=1e-5), 1.0),
    # The exact gelu (not CTranslate2's GELUTanh) and an ε large enough to
    # show in every norm, the final pre-LN ones too.
    "gelu_pre_ln_epsilon": (dict(ffn_activation="gelu", layer_norm="pre",
                                 layer_norm_epsilon=0.25,
                                 attention_bias=True), 1.0),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_scores_equal_mha(name, tiny_workdir, tmp_path):
  changes, input_scale = VARIANTS[name]
  config = tiny_config(**changes)
  model_config = TransformerConfig.from_config(config, deterministic=True)
  params = random_params(model_config, seed=len(name),
                         input_scale=input_scale)
  workdir = write_workdir(tmp_path / "run", config, params,
                          tiny_workdir / "spm.model")
  export.export(str(workdir), str(tmp_path / "ct2"))
  _, tokenizer = trained.load_workdir(str(workdir))
  assert_scores_equal(tmp_path / "ct2", model_config, params, tokenizer,
                      first_test_pairs(config, 8))


def test_export_from_a_bucket(gcsfs_on_emulator, gcs_dir, tiny_workdir,
                              tmp_path):
  # A TPU VM's workdir on gs:// (the Cloud Storage emulator): read through
  # the file layer and Orbax, written to a local folder.
  del gcsfs_on_emulator
  config = tiny_config()
  model_config = TransformerConfig.from_config(config, deterministic=True)
  params = random_params(model_config, seed=7)
  write_workdir(gcs_dir, config, params, tiny_workdir / "spm.model")
  manifest = export.export(gcs_dir, str(tmp_path / "ct2"))
  assert manifest["workdir"] == gcs_dir
  assert (tmp_path / "ct2" / "spm.model").read_bytes() == (
      tiny_workdir / "spm.model").read_bytes()
  _, tokenizer = trained.load_workdir(gcs_dir)
  assert_scores_equal(tmp_path / "ct2", model_config, params, tokenizer,
                      first_test_pairs(config, 8))


def test_average_of_last_checkpoints(tiny_workdir, tmp_path):
  manifest = export.export(str(tiny_workdir), str(tmp_path / "ct2"),
                           step=4, average_last=2)
  assert manifest["averaged_steps"] == [2, 4]
  assert manifest["checkpoint_step"] == 4
  config, tokenizer = trained.load_workdir(str(tiny_workdir))
  averaged, _, _ = trained.load_params(str(tiny_workdir), 4, 2)
  latest, _, _ = trained.load_params(str(tiny_workdir))
  model_config = TransformerConfig.from_config(config, deterministic=True)
  pairs = first_test_pairs(config, 8)
  assert_scores_equal(tmp_path / "ct2", model_config, averaged, tokenizer,
                      pairs)
  with pytest.raises(AssertionError):  # not the latest checkpoint's scores
    assert_scores_equal(tmp_path / "ct2", model_config, latest, tokenizer,
                        pairs)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("changes, message", [
    (dict(attention_type="additive"), "config.attention_type='additive'"),
    (dict(attention_type="location"), "config.attention_type='location'"),
    (dict(d_k=8, d_v=16), "config.d_k=8 and config.d_v=16 differ"),
])
def test_unrepresentable_variants_refused(changes, message, tiny_workdir,
                                          tmp_path):
  workdir = tmp_path / "run"  # config and vocabulary: refused before params
  workdir.mkdir()
  workdir_lib.write_config(tiny_config(**changes), str(workdir))
  shutil.copy(tiny_workdir / "spm.model", workdir / "spm.model")
  with pytest.raises(export.ExportError, match=message.replace("(", r"\(")):
    export.export(str(workdir), str(tmp_path / "ct2"))
  assert not (tmp_path / "ct2").exists()
  assert sorted(os.listdir(tmp_path)) == ["run"]


def test_output_folder_rules(tiny_workdir, tmp_path):
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  with pytest.raises(export.ExportError, match="not an export"):
    export.export(str(tiny_workdir), str(foreign))
  assert os.listdir(foreign) == ["notes.txt"]
  (tmp_path / "file").write_text("x")
  with pytest.raises(export.ExportError, match="is a file"):
    export.export(str(tiny_workdir), str(tmp_path / "file"))
  with pytest.raises(export.ExportError, match="local folder"):
    export.export(str(tiny_workdir), "gs://bucket/ct2")
  # An empty folder is used; an earlier export of ours is replaced whole.
  (tmp_path / "out").mkdir()
  export.export(str(tiny_workdir), str(tmp_path / "out"), step=2)
  export.export(str(tiny_workdir), str(tmp_path / "out"))
  manifest = json.loads((tmp_path / "out" / export.MANIFEST_FILE).read_text())
  assert manifest["checkpoint_step"] == 6
  # The workdir's search settings, the stopping rule included.
  config, _ = trained.load_workdir(str(tiny_workdir))
  assert [manifest[k] for k in ("beam_size", "alpha", "max_decode_extra",
                                "beam_stop")] == [
      config.beam_size, config.alpha, config.max_decode_extra,
      config.beam_stop]
  assert "matmul_dtype" not in manifest  # CTranslate2 has its compute type
  assert sorted(os.listdir(tmp_path)) == ["file", "foreign", "out"]
  assert sorted(os.listdir(tmp_path / "out")) == [
      "config.json", export.MANIFEST_FILE, "model.bin",
      "shared_vocabulary.json", "spm.model"]
  assert (tmp_path / "out" / "spm.model").read_bytes() == (
      tiny_workdir / "spm.model").read_bytes()
  assert manifest["files"] == sorted(os.listdir(tmp_path / "out"))
  # A file put into an export since: replacing the export would delete it.
  (tmp_path / "out" / "NOTES.txt").write_text("keep")
  with pytest.raises(export.ExportError, match=(
      r"is an earlier export that also holds files it did not write "
      r"\(NOTES.txt\)")):
    export.export(str(tiny_workdir), str(tmp_path / "out"), step=2)
  kept = json.loads((tmp_path / "out" / export.MANIFEST_FILE).read_text())
  assert kept["checkpoint_step"] == 6
  assert (tmp_path / "out" / "NOTES.txt").read_text() == "keep"
  # One export writes a folder at a time: another one is refused.
  (tmp_path / "out" / "NOTES.txt").unlink()
  before = file_hashes(tmp_path / "out")
  lock = export._ExportLock(str(tmp_path / "out"))  # pylint: disable=protected-access
  lock.acquire()
  try:
    with pytest.raises(export.ExportError, match=(
        rf"Another export \(process {os.getpid()}, started .*\) is writing "
        rf"{tmp_path / 'out'} \(lock {tmp_path / '.out.lock'}\)")):
      export.export(str(tiny_workdir), str(tmp_path / "out"), step=2)
  finally:
    lock.release()
  assert file_hashes(tmp_path / "out") == before
  assert not (tmp_path / ".out.lock").exists()


def test_a_sigterm_during_the_export_leaves_nothing(tiny_workdir, tmp_path,
                                                     monkeypatch, capsys):
  """mha-export's main, in this process, signalled just before its staging
  folder would be renamed into place: one line, status 143, and neither
  the staging folder, the lock nor the export is left; the process's
  SIGTERM handler is the one it had."""
  import logging  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel
  from mha.runtime import library_logs  # pylint: disable=import-outside-toplevel
  from mha.cli import export as cli_export  # pylint: disable=import-outside-toplevel
  move = export._move_into_place  # pylint: disable=protected-access

  def signalled_first(staging, output_dir):
    os.kill(os.getpid(), signal.SIGTERM)
    move(staging, output_dir)

  monkeypatch.setattr(export, "_move_into_place", signalled_first)
  monkeypatch.setattr(sys, "argv", ["mha-export"])
  handler, level = signal.getsignal(signal.SIGTERM), logging.getLogger(
      "absl").level
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["mha-export", f"--workdir={tiny_workdir}",
               f"--output_dir={tmp_path / 'ct2'}"])
  try:
    with pytest.raises(SystemExit) as stopped:
      cli_export.main(["mha-export"])
  finally:
    flags.FLAGS.unparse_flags()
    logging.getLogger("absl").setLevel(level)
    library_logs.configure(verbose=True)  # main hid their INFO lines
  assert stopped.value.code == 143
  assert capsys.readouterr().err.strip().split("\n")[-1] == (
      "mha-export: Stopped by SIGTERM.")
  assert os.listdir(tmp_path) == []
  assert signal.getsignal(signal.SIGTERM) == handler


@pytest.mark.parametrize("kwargs, message", [
    (dict(export_format="onnx"), "^export_format must be one of"),
    (dict(quantization="int4"), "^quantization must be one of"),
    (dict(step=-1), "^step must be >= 0, got -1"),
    (dict(step="7"), "^step must be an integer >= 0, got '7'"),
    (dict(average_last=0), "^average_last must be >= 1, got 0"),
])
def test_bad_flags_refused(kwargs, message, tiny_workdir, tmp_path):
  """Named by the keyword argument (mha-export: by its flag)."""
  with pytest.raises(export.ExportError, match=message):
    export.export(str(tiny_workdir), str(tmp_path / "ct2"), **kwargs)
  with pytest.raises(export.ExportError, match=message.replace(
      "^", "^--").replace("export_format", "format")):
    with validation.as_flags():
      export.export(str(tiny_workdir), str(tmp_path / "ct2"), **kwargs)
  assert not (tmp_path / "ct2").exists()


# ----------------------------------------------------------------- command


def test_command(tiny_workdir, tmp_path):
  command = [sys.executable, "-m", "mha.cli.export",
             f"--workdir={tiny_workdir}", "--format=ctranslate2"]
  env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
  done = subprocess.run(
      command + [f"--output_dir={tmp_path / 'ct2'}", "--quantization=int8",
                 "--step=4"], env=env, capture_output=True, text=True,
      timeout=300, check=False)
  assert done.returncode == 0, done.stderr
  manifest = json.loads((tmp_path / "ct2" / export.MANIFEST_FILE).read_text())
  assert (manifest["quantization"], manifest["averaged_steps"]) == ("int8",
                                                                    [4])
  assert ctranslate2.Translator(str(tmp_path / "ct2")).translate_batch(
      [["▁a"]], max_decoding_length=4)
  # A refusal: one line naming the flag, exit status 1, nothing written.
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("keep")
  done = subprocess.run(command + [f"--output_dir={tmp_path / 'mine'}"],
                        env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 1
  errors = [line for line in done.stderr.splitlines()
            if line.startswith("mha-export:")]
  assert len(errors) == 1 and "--output_dir=" in errors[0], done.stderr
  assert "Traceback" not in done.stderr
  assert os.listdir(tmp_path / "mine") == ["notes.txt"]
  # Without --output_dir: one line too.
  done = subprocess.run(command, env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 1
  assert [line for line in done.stderr.splitlines()
          if not line.startswith("I")] == [
              "mha-export: --output_dir is required: the folder to write the "
              "exported model into."], done.stderr


def test_missing_package_is_one_line(tiny_workdir, tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails
  with pytest.raises(export.ExportError, match="pip install ctranslate2"):
    export.export(str(tiny_workdir), str(tmp_path / "ct2"))
  assert not (tmp_path / "ct2").exists()
