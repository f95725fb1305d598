"""Checkpoints: round trips, pruning, restoring params, averaging, errors."""
import re
import threading

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mha.store import averaging
from mha.store import checkpoints
from mha.errors import CheckpointError


class Tiny(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8, name='hidden')(x)
    x = nn.LayerNorm(name='norm')(x)
    return nn.Dense(3, name='out', param_dtype=jnp.bfloat16)(x)


_OPTIMIZER = optax.adam(1e-2, b1=0.9, b2=0.98, eps=1e-9)


@jax.jit
def _update(params, opt_state, grads):
  change, opt_state = _OPTIMIZER.update(grads, opt_state, params)
  return optax.apply_updates(params, change), opt_state


def make_state(seed: int, updates: int = 2):
  """A training-state-like tree: flax params, adam state, step, rng."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(Tiny().init, jax.random.PRNGKey(0),
                          jnp.ones((2, 5)))['params']
  params = jax.tree.map(
      lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype), shapes)
  opt_state = _OPTIMIZER.init(params)
  for _ in range(updates):
    grads = jax.tree.map(
        lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    params, opt_state = _update(params, opt_state, grads)
  return {
      'params': params,
      'opt_state': opt_state,
      'step': jnp.array(updates, jnp.int32),
      'rng': jax.random.PRNGKey(seed + 100),
  }


def assert_trees_equal(a, b):
  leaves_a, treedef_a = jax.tree.flatten(a)
  leaves_b, treedef_b = jax.tree.flatten(b)
  assert treedef_a == treedef_b
  for x, y in zip(leaves_a, leaves_b):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_save_restore_round_trip_is_bit_exact(tmp_path):
  state = make_state(0)
  meta = {'epoch': 3, 'examples_seen': 12345, 'dataset': 'multi30k'}
  manager = checkpoints.make_manager(tmp_path, keep=3)
  assert checkpoints.save(manager, 7, state, meta)
  # Finalised when save returns: visible to a fresh reader straight away.
  assert checkpoints.all_steps(tmp_path) == [7]
  assert [p.name for p in (tmp_path / 'checkpoints').iterdir()] == ['7']

  target = jax.tree.map(jnp.zeros_like, make_state(1))
  restored, restored_meta = checkpoints.restore(manager, 7, target)
  assert_trees_equal(restored, state)
  assert isinstance(restored['opt_state'][0], optax.ScaleByAdamState)
  assert restored_meta == meta
  manager.close()

  # A new manager (a restarted run) with an abstract target and step=None.
  manager = checkpoints.make_manager(tmp_path, keep=3)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          state)
  restored, _ = checkpoints.restore(manager, None, abstract)
  assert_trees_equal(restored, state)
  manager.close()


def test_keeps_the_last_n(tmp_path):
  manager = checkpoints.make_manager(tmp_path, keep=2)
  state = make_state(0)
  for step in (10, 20, 30, 40):
    checkpoints.save(manager, step, state, {'step': step})
  manager.close()
  assert checkpoints.all_steps(tmp_path) == [30, 40]
  assert checkpoints.latest_step(tmp_path) == 40
  assert checkpoints.latest_step(tmp_path / 'elsewhere') is None
  assert checkpoints.all_steps(tmp_path / 'elsewhere') == []


def test_a_save_off_the_schedule_is_kept_only_while_it_is_the_latest(
    tmp_path):
  """A stop's save (step 37, its meta `scheduled: False`) is kept for the
  run to resume from, displaces none of the last `keep` scheduled steps
  (the ones averaged), and goes at the next save of the resumed run (a new
  manager, which reads it from the meta file). A step without the key
  (25: saved by older code, or a shorter run's last step) is scheduled."""
  state = make_state(0)
  manager = checkpoints.make_manager(tmp_path, keep=2)
  for step in (10, 20, 25, 30):
    checkpoints.save(manager, step, state, {'step': step})
  checkpoints.save(manager, 37, state, {'step': 37, 'scheduled': False})
  manager.close()
  assert checkpoints.all_steps(tmp_path) == [25, 30, 37]
  manager = checkpoints.make_manager(tmp_path, keep=2)
  checkpoints.save(manager, 40, state, {'step': 40, 'scheduled': True})
  assert checkpoints.all_steps(tmp_path) == [30, 40]
  checkpoints.save(manager, 43, state, {'step': 43, 'scheduled': False})
  checkpoints.save(manager, 50, state, {'step': 50, 'scheduled': True})
  manager.close()
  assert checkpoints.all_steps(tmp_path) == [40, 50]
  assert checkpoints.read_meta(tmp_path, 50)['scheduled'] is True


@pytest.fixture(scope='module')
def three_checkpoints(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('run')
  manager = checkpoints.make_manager(workdir, keep=5)
  states = {}
  for i, step in enumerate((100, 200, 300)):
    states[step] = make_state(i)
    checkpoints.save(manager, step, states[step], {'step': step})
  manager.close()
  return workdir, states


def test_restore_params_latest_and_given_step(three_checkpoints):
  workdir, states = three_checkpoints
  params, step = checkpoints.restore_params(workdir)
  assert step == 300
  assert_trees_equal(params, states[300]['params'])
  params, step = checkpoints.restore_params(workdir, step=100)
  assert step == 100
  assert_trees_equal(params, states[100]['params'])
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(params))


def numpy_mean(trees):
  """Reference: mean in float32 of each leaf, cast back to its dtype."""
  return jax.tree.map(
      lambda *xs: np.mean(np.stack([np.asarray(x, np.float32) for x in xs]),
                          axis=0).astype(np.asarray(xs[0]).dtype), *trees)


def assert_trees_close(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype
    tol = 1e-2 if x.dtype == jnp.bfloat16 else 1e-6
    np.testing.assert_allclose(np.asarray(x, np.float32),
                               np.asarray(y, np.float32), rtol=tol, atol=tol)


def test_average_checkpoints_is_the_mean_of_the_params(three_checkpoints):
  workdir, states = three_checkpoints
  params, used = averaging.average_checkpoints(workdir, num_last=2)
  assert used == [200, 300]
  assert_trees_close(params,
                     numpy_mean([states[200]['params'],
                                 states[300]['params']]))

  params, used = averaging.average_checkpoints(workdir, steps=[300, 100])
  assert used == [100, 300]
  assert_trees_close(params,
                     numpy_mean([states[100]['params'],
                                 states[300]['params']]))

  params, used = averaging.average_checkpoints(workdir)
  assert used == [100, 200, 300]
  assert_trees_close(params, numpy_mean([s['params'] for s in
                                         states.values()]))

  one, used = averaging.average_checkpoints(workdir, num_last=1)
  assert used == [300]
  assert_trees_equal(one, states[300]['params'])


def test_resolve_steps_chooses_the_last_n_up_to_a_step(three_checkpoints,
                                                      tmp_path):
  workdir, _ = three_checkpoints
  assert checkpoints.resolve_steps(workdir) == [300]
  assert checkpoints.resolve_steps(workdir, num_last=2) == [200, 300]
  assert checkpoints.resolve_steps(workdir, 200) == [200]
  assert checkpoints.resolve_steps(workdir, 200, num_last=2) == [100, 200]
  with pytest.raises(checkpoints.TooFewCheckpoints,
                     match=re.escape('holds 1 checkpoint(s) up to step 100: '
                                     '[100], fewer than the 2 to average')
                     ) as error:
    checkpoints.resolve_steps(workdir, 100, num_last=2)
  assert (error.value.step, error.value.steps, error.value.needed) == (
      100, [100], 2)
  with pytest.raises(checkpoints.CheckpointNotFound,
                     match=re.escape('available steps: [100, 200, 300]')):
    checkpoints.resolve_steps(workdir, 250)
  with pytest.raises(checkpoints.CheckpointNotFound, match='No checkpoint in'):
    checkpoints.resolve_steps(tmp_path / 'empty')
  with pytest.raises(ValueError, match='num_last must be >= 1, got 0'):
    checkpoints.resolve_steps(workdir, num_last=0)


def test_average_params_in_float32_cast_back():
  trees = [{'w': np.full((3,), v, np.float32),
            'b': np.full((2,), v, jnp.bfloat16),
            'count': np.array(4, np.int32)} for v in (1.0, 2.0, 4.0)]
  mean = averaging.average_params(iter(trees))
  np.testing.assert_array_equal(mean['w'], np.full((3,), 7 / 3, np.float32))
  assert mean['b'].dtype == jnp.bfloat16
  np.testing.assert_array_equal(mean['b'].astype(np.float32),
                                np.full((2,), 7 / 3, jnp.bfloat16)
                                .astype(np.float32))
  assert mean['count'] == 4 and mean['count'].dtype == np.int32
  # bfloat16 accumulation would round 1 + 2**-8 * k; float32 does not.
  small = [{'b': np.array([1.0 if i == 0 else 2**-8], jnp.bfloat16)}
           for i in range(256)]
  mean = averaging.average_params(small)['b'].astype(np.float32)
  np.testing.assert_allclose(mean, (1 + 255 * 2**-8) / 256, rtol=1e-2)


def test_average_params_errors():
  with pytest.raises(ValueError, match='at least one'):
    averaging.average_params([])
  with pytest.raises(ValueError, match='structure'):
    averaging.average_params([{'a': np.ones(2)}, {'b': np.ones(2)}])
  with pytest.raises(ValueError, match='shape'):
    averaging.average_params([{'a': np.ones(2)}, {'a': np.ones(3)}])
  with pytest.raises(ValueError, match='cannot be averaged'):
    averaging.average_params([{'a': np.array(1)}, {'a': np.array(2)}])


def test_errors_name_the_folder_and_the_steps(tmp_path, three_checkpoints):
  empty = tmp_path / 'empty_run'
  folder = re.escape(str(empty / 'checkpoints'))
  # A CheckpointError (a UserError: one line from eval.py and train.py) that
  # is also a FileNotFoundError.
  with pytest.raises(checkpoints.CheckpointNotFound,
                     match=f'No checkpoint in {folder}'):
    checkpoints.restore_params(empty)
  with pytest.raises(CheckpointError, match=f'No checkpoint in {folder}'):
    averaging.average_checkpoints(empty, num_last=1)

  workdir, states = three_checkpoints
  available = re.escape('available steps: [100, 200, 300]')
  with pytest.raises(FileNotFoundError, match=f'step 150 .*{available}'):
    checkpoints.restore_params(workdir, step=150)
  with pytest.raises(FileNotFoundError, match=f'step 150 .*{available}'):
    averaging.average_checkpoints(workdir, steps=[100, 150])
  with pytest.raises(checkpoints.TooFewCheckpoints,
                     match=r'holds 3 checkpoint\(s\) up to step 300: '
                     r'\[100, 200, 300\], fewer than the 5 to average'):
    averaging.average_checkpoints(workdir, num_last=5)
  with pytest.raises(ValueError, match='not both'):
    averaging.average_checkpoints(workdir, num_last=1, steps=[100])
  with pytest.raises(ValueError, match='keep must be >= 1'):
    checkpoints.make_manager(tmp_path, keep=0)

  manager = checkpoints.make_manager(workdir, keep=5)
  with pytest.raises(FileNotFoundError, match=f'step 7 .*{available}'):
    checkpoints.restore(manager, 7, states[100])
  manager.close()


def test_relative_workdir(tmp_path, monkeypatch):
  # Orbax needs absolute paths; users pass relative workdirs.
  monkeypatch.chdir(tmp_path)
  manager = checkpoints.make_manager("run", keep=2)
  state = {"params": {"w": np.arange(3, dtype=np.float32)}}
  checkpoints.save(manager, 1, state, {"step": 1})
  assert checkpoints.all_steps("run") == [1]
  params, step = checkpoints.restore_params("run")
  np.testing.assert_array_equal(params["w"], state["params"]["w"])
  assert step == 1


def test_save_without_wait_returns_while_the_step_is_written(tmp_path,
                                                             monkeypatch):
  # Orbax's last act of a save (renaming the step's temporary folder) is
  # held until the test releases it: save(wait=False) must return before,
  # with the step not yet visible, and the next save must wait for it.
  from orbax.checkpoint._src.path import atomicity
  release = threading.Event()
  finalize = atomicity.AtomicRenameTemporaryPath.finalize

  async def held(self):
    assert release.wait(60), 'the test never released the write'
    return await finalize(self)

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, 'finalize', held)
  state = jax.device_put(make_state(0))
  manager = checkpoints.make_manager(tmp_path, keep=3)
  assert checkpoints.save(manager, 1, state, {'step': 1}, wait=False)
  assert checkpoints.all_steps(tmp_path) == []  # still being written
  # The arrays may be deleted once save returns (the train step donates
  # them): Orbax holds its own host copy.
  for x in jax.tree.leaves(state):
    x.delete()
  release.set()
  manager.wait_until_finished()
  assert checkpoints.all_steps(tmp_path) == [1]
  restored, meta = checkpoints.restore(manager, 1, make_state(5))
  assert_trees_equal(restored, make_state(0))
  assert meta == {'step': 1}
  manager.close()
