"""Warm start (config.init_from): parameters of another workdir's checkpoint."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import TINY_WORKDIR_LOOP
from conftest import tiny_config
from mha.store import checkpoints
from mha.train import step as train_step
from mha.train import warm_start
from mha.errors import ConfigError
from mha.model.transformer import TransformerConfig


def _params(seed, hidden=8):
  rng = np.random.default_rng(seed)
  return {"dense": {"kernel": rng.normal(size=(4, hidden)).astype(np.float32),
                    "bias": rng.normal(size=(hidden,)).astype(np.float32)},
          "norm": {"scale": rng.normal(size=(hidden,)).astype(np.float32)}}


@pytest.fixture(scope="module")
def source_workdir(tmp_path_factory):
  """A workdir with checkpoints at steps 2 and 4 of different parameters."""
  workdir = tmp_path_factory.mktemp("source")
  manager = checkpoints.make_manager(workdir, keep=5)
  for step in (2, 4):
    state = {"step": np.int32(step), "params": _params(step),
             "opt_state": {"mu": _params(step + 100)},
             "rng": np.zeros((2,), np.uint32)}
    checkpoints.save(manager, step, state, {"step": step})
  manager.wait_until_finished()
  manager.close()
  return workdir


def test_parse():
  assert warm_start.parse("/runs/a") == ("/runs/a", None)
  assert warm_start.parse("/runs/a:1200") == ("/runs/a", 1200)
  assert warm_start.parse("gs://b/run:7") == ("gs://b/run", 7)


def test_loads_only_the_parameters_of_the_step_asked(source_workdir):
  target = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.bfloat16),
                        _params(0))
  latest, step = warm_start.load(str(source_workdir), target)
  assert step == 4
  earlier, step = warm_start.load(f"{source_workdir}:2", target)
  assert step == 2
  for loaded, seed in ((latest, 4), (earlier, 2)):
    expected = _params(seed)
    for path in (("dense", "kernel"), ("dense", "bias"), ("norm", "scale")):
      value = loaded[path[0]][path[1]]
      assert value.dtype == jnp.bfloat16  # the new model's dtype
      np.testing.assert_array_equal(
          value, expected[path[0]][path[1]].astype(jnp.bfloat16))


def test_refuses_naming_the_first_mismatch(source_workdir):
  spec = str(source_workdir)
  with pytest.raises(ConfigError, match=(
      r"init_from=.*parameter dense/bias has shape \(8,\) in the checkpoint "
      r"but \(16,\) in the model")):
    warm_start.load(spec, _params(0, hidden=16))
  extra = dict(_params(0), out={"kernel": np.zeros((8, 3), np.float32)})
  with pytest.raises(ConfigError, match="model's parameter out/kernel"):
    warm_start.load(spec, extra)
  fewer = {"dense": _params(0)["dense"]}
  with pytest.raises(ConfigError, match="checkpoint's parameter norm/scale "
                                        "is not in the model"):
    warm_start.load(spec, fewer)
  with pytest.raises(ConfigError, match="init_from=.*:3'.*step 3"):
    warm_start.load(f"{spec}:3", _params(0))


def test_the_vocabulary_is_the_sources_and_another_one_is_refused(
    tiny_workdir, tmp_path):
  source, new = tmp_path / "source", tmp_path / "new"
  source.mkdir()
  new.mkdir()
  vocabulary = (tiny_workdir / "spm.model").read_bytes()
  (source / "spm.model").write_bytes(vocabulary)
  assert warm_start.vocabulary(f"{source}:4", str(new)) == {
      "spm.model": vocabulary}
  # Already copied (a set-up that stopped after the copy): the same bytes.
  (new / "spm.model").write_bytes(vocabulary)
  assert warm_start.vocabulary(str(source), str(new)) == {
      "spm.model": vocabulary}
  # Ids mean nothing with another vocabulary: a new workdir that holds
  # another one is refused.
  (new / "spm.model").write_bytes(b"another vocabulary")
  with pytest.raises(ConfigError, match=r"new/spm.model differs from "
                                        r".*source/spm.model"):
    warm_start.vocabulary(str(source), str(new))
  # The source's own file damaged: named as init_from's, not as the new
  # workdir's (whose advice would be to delete it and train it again).
  (source / "spm.model").write_bytes(vocabulary[:100])
  with pytest.raises(ConfigError, match=(
      rf"config.init_from='{source}': {source}/spm.model is not a "
      r"SentencePiece model \(damaged or another file\); warm start needs")):
    warm_start.vocabulary(str(source), str(new))


def _tiny_config(**changes):
  """The config of conftest's tiny_workdir, for a run of one step."""
  return tiny_config(**{**TINY_WORKDIR_LOOP, "num_train_steps": 1,
                        "checkpoint_every_steps": 1, **changes})


def _count_reads(monkeypatch, module, name, calls: list) -> None:
  """Appends the first argument of every call of `module.name` to `calls`."""
  function = getattr(module, name)

  def counting(*args, **kwargs):
    calls.append(str(args[0]))
    return function(*args, **kwargs)

  monkeypatch.setattr(module, name, counting)


def test_train_starts_from_another_workdirs_parameters(tiny_workdir, tmp_path,
                                                       monkeypatch):
  from mha.train import trainer
  from mha.store import workdir as workdir_lib
  from mha.data import tokenizer
  source, _ = checkpoints.restore_params(str(tiny_workdir), 4)
  new = tmp_path / "warm"
  # Each input is loaded once: the checks load it, the set-up uses that.
  restored, files_read, configs_read, models = [], [], [], []
  _count_reads(monkeypatch, checkpoints, "restore_params", restored)
  _count_reads(monkeypatch, TransformerConfig, "from_config", models)
  _count_reads(monkeypatch, warm_start.files, "read_bytes", files_read)
  _count_reads(monkeypatch, workdir_lib, "_read_json", configs_read)
  # The parameters the first update starts from, read before it runs (it
  # donates the state's buffers): the first device's copy of each.
  update = train_step.CompiledUpdate.__call__
  started = []

  def recording(self, state, micro_batches, stop):
    if not started:
      started.append(jax.tree.map(lambda x: np.asarray(x[0]),
                                  state["params"]))
    return update(self, state, micro_batches, stop)

  monkeypatch.setattr(train_step.CompiledUpdate, "__call__", recording)
  # The tiny_workdir run's own settings (its learning rate too): the
  # update's compiled program is that run's, from the compilation cache.
  trainer.train_and_evaluate(_tiny_config(init_from=f"{tiny_workdir}:4"),
                             str(new))
  assert restored == [str(tiny_workdir)]
  assert files_read.count(str(tiny_workdir / "spm.model")) == 1
  assert configs_read == []  # a new workdir: no config.json to read
  assert len(models) == 1  # the model config: built by the checks, once
  monkeypatch.undo()
  (started,) = started
  assert checkpoints.latest_step(str(new)) == 1
  jax.tree.map(np.testing.assert_array_equal, started, source)
  latest, _ = checkpoints.restore_params(str(tiny_workdir), 6)
  assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(started),
                                                   jax.tree.leaves(latest)))
  name = tokenizer.MODEL_FILENAME
  assert (new / name).read_bytes() == (tiny_workdir / name).read_bytes()
  # Resuming ignores init_from (even one that no longer exists).
  _count_reads(monkeypatch, workdir_lib, "_read_json", configs_read)
  trainer.train_and_evaluate(
      _tiny_config(init_from=str(tmp_path / "gone"), num_train_steps=2),
      str(new))
  assert checkpoints.latest_step(str(new)) == 2
  assert configs_read == [str(new / "config.json")]  # read once
  # config.json records where the run started from, not the ignored path.
  saved = json.loads((new / "config.json").read_text())
  assert (saved["init_from"], saved["num_train_steps"]) == (
      f"{tiny_workdir}:4", 2)


def test_a_mismatched_warm_start_writes_nothing(tiny_workdir, tmp_path):
  from mha.train import trainer
  new = tmp_path / "other_shape"
  with pytest.raises(ConfigError, match=r"init_from=.*shape"):
    trainer.train_and_evaluate(
        _tiny_config(init_from=str(tiny_workdir), d_ff=48), str(new))
  assert not new.exists()
  with pytest.raises(ConfigError, match=r"init_from=.*spm.model cannot be"):
    trainer.train_and_evaluate(
        _tiny_config(init_from=str(tmp_path / "none")), str(new))
  assert not new.exists()
