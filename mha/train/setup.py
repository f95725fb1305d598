"""Set-up of a training run: its inputs checked and loaded once, the
workdir's lock, the models, and where the run starts.

`check_inputs` reads every input before anything is written (config.json,
the vocabulary, the latest checkpoint's step, a warm start's vocabulary and
parameters, the data splits) and returns what it loaded (`Inputs`); the
set-up under the workdir's lock (`set_up`, `resume_or_start`) builds on that
instead of reading the files again.
"""
import contextlib
import dataclasses
from typing import Any, Iterator

from absl import logging
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from mha.store import checkpoints
from mha.train import config_check
from mha import data
from mha.train import devices
from mha.runtime import files
from mha.store import metrics as metrics_lib
from mha.model import optim
from mha.train import evals as train_evals
from mha.train import warm_start
from mha.store import workdir as workdir_lib
from mha.data import sources
from mha.errors import WorkdirError
from mha.train.step import State
from mha.train.step import init_state
from mha.model.transformer import Transformer
from mha.model.transformer import TransformerConfig
from mha.model.transformer import create_model


@dataclasses.dataclass
class WarmStart:
  """`config.init_from` as loaded: its vocabulary (the bytes of its
  spm.model), its parameters on the host, and the step they are of."""
  vocabulary: bytes
  params: Any
  step: int


@dataclasses.dataclass
class Inputs:
  """What `check_inputs` loaded, for the set-up to build on.

  Attributes:
    saved_config: the workdir's config.json, None for a new workdir.
    model_config: the model's config, built from the run's config.
    tokenizer: the workdir's vocabulary, None if it has none yet.
    latest: the workdir's latest checkpoint step, None if it has none.
    warm: a new run's warm start (`config.init_from`), else None.
  """
  saved_config: dict | None
  model_config: TransformerConfig
  tokenizer: data.Tokenizer | None
  latest: int | None
  warm: WarmStart | None = None


def check_inputs(config: ml_collections.ConfigDict,
                 workdir: workdir_lib.Workdir) -> Inputs:
  """Every check of a run's input that needs no write, run before any write.

  The config's fields (`config_check.validate`, with the real minimum of
  `max_tokens` for this run's devices), the workdir (a folder, or a path
  that can become one; its config.json readable and of the same model; its
  spm.model readable and of config.vocab_size pieces), a new run's warm
  start (its vocabulary and parameters), and every split the config names
  (train, eval and test), opened but not read. A workdir whose run is
  finished reads no data, so its splits are not opened.

  Returns:
    What was read, for the set-up (nothing is read twice).

  Raises:
    UserError: a ConfigError, WorkdirError or DataError naming the field,
      file or split at fault.
  """
  model_config = config_check.validate(config, jax.device_count())
  saved = workdir.check_usable()
  workdir_lib.check_saved_config(config, saved, workdir.path)
  tokenizer = (workdir.load_tokenizer(config)  # reads it: writes nothing
               if files.exists(workdir.vocabulary_path) else None)
  latest = (checkpoints.latest_step(workdir.path)
            if files.isdir(workdir.checkpoints_path) else None)
  inputs = Inputs(saved, model_config, tokenizer, latest)
  if latest is not None:
    # A damaged latest step is refused here, before config.json or the
    # event files are touched, naming the newest intact step.
    checkpoints.check_step(workdir.path, latest, "train")
    if latest >= config.num_train_steps:
      return inputs
  elif config.init_from:
    inputs.warm = _load_warm_start(config, workdir, inputs.model_config)
  sources.open_config_splits(config)
  return inputs


def _load_warm_start(config: ml_collections.ConfigDict,
                     workdir: workdir_lib.Workdir,
                     model_config: TransformerConfig) -> WarmStart:
  """`config.init_from`'s vocabulary and parameters, in the form of the
  parameters of `model_config` (`warm_start.load`)."""
  vocabulary = warm_start.vocabulary(config.init_from, workdir.path)
  model = create_model(model_config)
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), ids, ids)
  params, step = warm_start.load(config.init_from, shapes["params"])
  return WarmStart(vocabulary, params, step)


def check_same_vocabulary(tokenizer) -> None:
  """Every process must hold the same SentencePiece model.

  On a fresh workdir process 0 trains `<workdir>/spm.model` and the other
  processes load it once written (`mha.data.multihost`); a workdir that is
  not shared (each host its own disk) gets one trained per host, the same
  only if every host has the same library versions and training data.
  Different vocabularies would give different ids for the same text, and
  the data-parallel gradients would mix them silently; the hashes are
  compared instead.

  Raises:
    WorkdirError: naming the processes whose vocabulary differs from
      process 0's.
  """
  if jax.process_count() == 1:
    return
  digest = np.frombuffer(bytes.fromhex(tokenizer.sha256), np.uint8)
  digests = np.asarray(multihost_utils.process_allgather(digest))
  differ = [i for i, d in enumerate(digests) if not np.array_equal(d,
                                                                   digests[0])]
  if differ:
    raise WorkdirError(
        f"Processes {differ} hold a different SentencePiece model than "
        f"process 0 ({tokenizer.path}, sha256 {digests[0].tobytes().hex()}). "
        "Give every host the same training data and library versions, or "
        "copy process 0's spm.model into the workdir before starting.")


@contextlib.contextmanager
def workdir_lock(workdir: workdir_lib.Workdir) -> Iterator[None]:
  """Process 0 holds the workdir's lock; the other processes start (and
  write) only once it does, and stop if it could not take it."""
  message = None
  with contextlib.ExitStack() as stack:
    if jax.process_index() == 0:
      try:
        stack.enter_context(workdir.lock())
      except WorkdirError as e:
        message = str(e)
    if jax.process_count() > 1:
      taken = multihost_utils.broadcast_one_to_all(np.int32(message is None))
      if not int(taken) and message is None:
        message = (f"Process 0 could not take {workdir.lock_path}; its "
                   "message names the run that holds it.")
      if message is None:
        files.makedirs(workdir.path)
    if message is not None:
      raise WorkdirError(message)
    yield


@dataclasses.dataclass
class Run:
  """What the set-up builds for a run.

  Attributes:
    tokenizer: the run's vocabulary (read, trained, or a warm start's).
    model: the training model (with dropout).
    tx: the optimizer.
    evaluations: the in-training evaluations the config asks for
      (`train_evals.from_config`), handed to the loop.
    state: the step-0 state, on the host (None once training starts).
    latest: the latest checkpoint's step under the lock, None if none.
    warm: a new run's warm start (None once loaded into the state).
    changed: data-order fields that differ from the workdir's config.json.
  """
  tokenizer: data.Tokenizer
  model: Transformer
  tx: optax.GradientTransformation
  evaluations: list
  state: State | None
  latest: int | None
  warm: WarmStart | None
  changed: list[str]


def set_up(config: ml_collections.ConfigDict, folder: workdir_lib.Workdir,
           inputs: Inputs) -> Run:
  """Set-up: vocabulary, config.json, models, optimizer and step-0 state,
  from what the checks loaded (`inputs`)."""
  saved = inputs.saved_config
  if saved is None and files.exists(folder.config_path):
    # Written since the checks, by a run that held the lock meanwhile.
    saved = workdir_lib.read_saved_config(folder.path)
    workdir_lib.check_saved_config(config, saved, folder.path)
  latest = checkpoints.latest_step(folder.path)
  # The warm start moves from `inputs` to the run, which lets it go once
  # its parameters are in the state.
  warm, inputs.warm = (inputs.warm if latest is None else None), None
  tokenizer = _vocabulary(config, folder, inputs.tokenizer, warm)
  check_same_vocabulary(tokenizer)
  # A finished run given another config trains nothing: its config.json
  # stays the one its checkpoints were trained with.
  if jax.process_index() == 0 and (latest is None or
                                   latest < config.num_train_steps):
    folder.write_config(config if latest is None else
                        _as_resumed(config, saved, latest))
  model = create_model(inputs.model_config)
  eval_model = create_model(inputs.model_config, deterministic=True)
  tx = optim.create_optimizer(config)
  return Run(tokenizer, model, tx,
             train_evals.from_config(config, tokenizer, eval_model),
             init_state(config, model, tx), latest, warm,
             workdir_lib.changed_data_fields(config, saved))


def _as_resumed(config: ml_collections.ConfigDict, saved: dict | None,
                latest: int) -> ml_collections.ConfigDict:
  """`config` as config.json records a resumed run: with the `init_from`
  the run started from (a resume ignores the one given)."""
  started_from = (saved or {}).get("init_from")
  if config.init_from == started_from:
    return config
  if config.init_from:
    logging.warning(
        "config.init_from=%r is ignored: the run resumes from its own "
        "checkpoint %d (a warm start begins a new workdir).",
        config.init_from, latest)
  config = config.copy_and_resolve_references()
  config.init_from = started_from
  return config


def _vocabulary(config: ml_collections.ConfigDict,
                folder: workdir_lib.Workdir, loaded: data.Tokenizer | None,
                warm: WarmStart | None) -> data.Tokenizer:
  """The run's vocabulary: a warm start's (copied into the workdir), the
  workdir's as the checks loaded it, or `data.get_tokenizer`'s (trained
  if absent). Several processes all go through `get_tokenizer`, whose
  process-0-first step none may wait at alone."""
  if warm is not None:
    if jax.process_index() == 0 and not files.exists(folder.vocabulary_path):
      files.write_bytes_atomic(folder.vocabulary_path, warm.vocabulary)
    return data.Tokenizer(warm.vocabulary, path=folder.vocabulary_path)
  if loaded is not None and jax.process_count() == 1:
    return loaded
  return data.get_tokenizer(config, folder.path)


@dataclasses.dataclass
class Start:
  """Where the run starts.

  Attributes:
    state: the state at `step`, on the host (None once replicated).
    step: the first update's step (0, or the restored checkpoint's).
    data_position: micro-batches read before `step`.
  """
  state: State | None
  step: int
  data_position: int


def resume_or_start(config: ml_collections.ConfigDict,
                    folder: workdir_lib.Workdir, run: Run,
                    manager, writer: metrics_lib.MetricsWriter) -> Start:
  """Resume-or-start: the latest checkpoint, or step 0 (warm or not).

  metrics.jsonl loses the lines of steps after the start: they are redone.
  """
  workdir, step = folder.path, run.latest
  if step is not None:
    state, meta = checkpoints.restore(manager, step,
                                      jax.device_get(run.state))
    logging.info("Resumed from %s at step %d.", workdir, step)
    if run.changed:
      logging.warning(
          "Resuming %s with other data settings (%s): training goes on from "
          "the checkpoint's position in the data, but the batches differ "
          "from those of an uninterrupted run, so the result is not "
          "bit-identical.", workdir, "; ".join(run.changed))
  else:
    state, step, meta = run.state, 0, {}
    logging.info("Starting a new run in %s.", workdir)
    if run.warm is not None:
      state = dict(state, params=run.warm.params)
      logging.info("Warm start: parameters of %s (step %d).",
                   config.init_from, run.warm.step)
      run.warm = None  # its parameters live on in the state only
  # A run killed before its checkpoint logged steps it will redo.
  writer.truncate_after(step)
  # Micro-batches read before `step`: the checkpoint's own count, so a
  # resume with another grad_accum_steps neither replays nor skips data.
  position = int(meta.get("data_position", step * config.grad_accum_steps))
  if step >= config.num_train_steps:
    logging.info("%s is at step %d >= num_train_steps=%d: nothing to train.",
                 workdir, step, config.num_train_steps)
  return Start(state, step, position)


def train_batches(config: ml_collections.ConfigDict, tokenizer,
                  start: Start) -> Iterator[dict[str, np.ndarray]]:
  """The training batches from the start's data position, sharded."""
  if start.step >= config.num_train_steps:
    return iter(())  # already finished: do not read or plan the split
  num_devices = jax.local_device_count()
  batches = data.train_batches(config, tokenizer,
                               start_step=start.data_position)
  return (devices.shard(b, num_devices) for b in batches)
