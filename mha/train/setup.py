"""Set-up of a training run, top to bottom: its inputs checked and loaded
once, the workdir's lock, then everything the loop needs.

`check_inputs` reads every input before anything is written (config.json,
the vocabulary, the latest checkpoint's step, a warm start's vocabulary and
parameters, the data splits) and returns what it loaded (`Inputs`); a
finished run stops there (`finished`: the one "nothing to train" check).
Under the workdir's lock (`workdir_lock`), `set_up` builds on what the
checks loaded instead of reading the files again, in this order: the
vocabulary, config.json, the models, optimizer and in-training evaluations,
the checkpoint manager and metrics writer, where the run starts (the latest
checkpoint, or step 0, warm or not), the training batches from there, and
the loop's actions (`train_actions`); it hands them to the loop as one
`Loop`. A set-up that fails on bad input or is stopped (SIGTERM, Ctrl-C)
leaves the workdir as it was.
"""
import contextlib
import dataclasses
import os
from typing import Any, Iterator

from absl import logging
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np

from mha import data
from mha import errors
from mha.data import sources
from mha.data import tokenizer as tokenizer_lib
from mha.errors import WorkdirError
from mha.model import optim
from mha.model.transformer import TransformerConfig
from mha.model.transformer import create_model
from mha.runtime import files
from mha.runtime import sigterm
from mha.store import checkpoints
from mha.store import metrics as metrics_lib
from mha.store import workdir as workdir_lib
from mha.train import config_check
from mha.train import devices
from mha.train import evals as train_evals
from mha.train import warm_start
from mha.train.actions import MetricsWindow
from mha.train.actions import Profiler
from mha.train.actions import Saver
from mha.train.actions import write_hparams
from mha.train.step import CompiledUpdate
from mha.train.step import State
from mha.train.step import init_state


@dataclasses.dataclass
class WarmStart:
  """`config.init_from` as loaded: its vocabulary ({file name: bytes}:
  its spm.model, or its separate vocabulary's files), its parameters on the
  host, and the step they are of."""
  vocabulary: dict[str, bytes]
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
    finished: the latest checkpoint is at num_train_steps or past it
      (`finished`): there is nothing to train.
    warm: a new run's warm start (`config.init_from`), else None.
  """
  saved_config: dict | None
  model_config: TransformerConfig
  tokenizer: data.Tokenizer | None
  latest: int | None
  finished: bool = False
  warm: WarmStart | None = None


def finished(config: ml_collections.ConfigDict, workdir: str,
             step: int | None) -> bool:
  """Whether a run that starts at `step` (None: no checkpoint yet) has
  nothing to train, `step` >= `config.num_train_steps`; logged if so."""
  if step is None or step < config.num_train_steps:
    return False
  logging.info("%s is at step %d >= num_train_steps=%d: nothing to train.",
               workdir, step, config.num_train_steps)
  return True


def check_inputs(config: ml_collections.ConfigDict,
                 workdir: workdir_lib.Workdir) -> Inputs:
  """Every check of a run's input that needs no write, run before any write.

  The config's fields (`config_check.validate`, with the real minimum of
  `max_tokens` for this run's devices), the workdir (a folder, or a path
  that can become one; its config.json readable and of the same model; its
  spm.model readable and of config.vocab_size pieces), a new run's warm
  start (its vocabulary and parameters), and every split the config names
  (train, eval and test), opened but not read. A workdir whose run is
  finished (`Inputs.finished`) reads no data, so its splits are not opened.

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
               if workdir.has_vocabulary() else None)
  latest = (checkpoints.latest_step(workdir.path)
            if files.isdir(workdir.checkpoints_path) else None)
  inputs = Inputs(saved, model_config, tokenizer, latest)
  if latest is not None:
    # A damaged latest step is refused here, before config.json or the
    # event files are touched, naming the newest intact step.
    checkpoints.check_step(workdir.path, latest, "train")
    inputs.finished = finished(config, workdir.path, latest)
    if inputs.finished:
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
class Loop:
  """What the set-up hands the training loop.

  Attributes:
    state: the state at `step`, replicated over the local devices.
    step: the first update's step (0, or the restored checkpoint's).
    batches: the training batches from the start's data position, sharded
      (none for a run with nothing to train).
    update: the `pmap`ped update.
    window: the metrics of the updates since the last logged step.
    saver: the asynchronous saves of `manager`'s checkpoints.
    evaluations: the in-training evaluations the config asks for
      (`train_evals.from_config`).
    profiler: the `config.profile_steps` trace.
    writer: the run's metrics.jsonl and event file.
    manager: the Orbax checkpoint manager, closed at the end of the run.
    before: the workdir as it was before the set-up (process 0; None on the
      others), put back if the run fails before it saves anything.
  """
  state: State
  step: int
  batches: Iterator[dict[str, np.ndarray]]
  update: CompiledUpdate
  window: MetricsWindow
  saver: Saver
  evaluations: list
  profiler: Profiler
  writer: metrics_lib.MetricsWriter
  manager: Any
  before: workdir_lib.Snapshot | None


def set_up(config: ml_collections.ConfigDict, folder: workdir_lib.Workdir,
           inputs: Inputs) -> Loop:
  """The run's set-up under the workdir's lock (`_build`), from what the
  checks loaded (`inputs`), guarded: bad input found there (a vocabulary
  that cannot be trained, no example within the length limits, a
  checkpoint of other shapes), a SIGTERM or a Ctrl-C leaves the workdir as
  it was.

  Raises:
    UserError: the bad input; `Terminated` for a SIGTERM.
    KeyboardInterrupt: a Ctrl-C.
  """
  before = folder.snapshot() if jax.process_index() == 0 else None
  try:
    # Everything up to the loop, whose StopSignal then takes the signals
    # (a SIGTERM between the two would end the process: a few bytecodes).
    with sigterm.raised():
      return _build(config, folder, inputs, before)
  except (errors.UserError, KeyboardInterrupt, errors.SigTerm) as e:
    if before is not None:
      before.restore()
    if isinstance(e, errors.SigTerm):
      raise errors.Terminated(
          "Stopped by SIGTERM during the set-up, before any step: the "
          "workdir is left as it was.") from None
    raise


def _build(config: ml_collections.ConfigDict, folder: workdir_lib.Workdir,
           inputs: Inputs, before: workdir_lib.Snapshot | None) -> Loop:
  """`set_up`'s steps, in order."""
  saved = inputs.saved_config
  if saved is None and files.exists(folder.config_path):
    # Written since the checks, by a run that held the lock meanwhile.
    saved = workdir_lib.read_saved_config(folder.path)
    workdir_lib.check_saved_config(config, saved, folder.path)
  latest = checkpoints.latest_step(folder.path)
  step = 0 if latest is None else latest  # the first update's
  # Nothing to train: num_train_steps=0, or a run that held the lock
  # meanwhile finished this one.
  done = finished(config, folder.path, step)
  # The warm start moves from `inputs` to the set-up, which lets it go
  # when it returns (its parameters live on in the state only); a resume
  # ignores it.
  warm, inputs.warm = (inputs.warm if latest is None else None), None
  tokenizer = _vocabulary(config, folder, inputs.tokenizer, warm)
  check_same_vocabulary(tokenizer)
  # A finished run given another config trains nothing: its config.json
  # stays the one its checkpoints were trained with.
  if jax.process_index() == 0 and (latest is None or not done):
    folder.write_config(config if latest is None else
                        _as_resumed(config, saved, latest))
  model = create_model(inputs.model_config)
  eval_model = create_model(inputs.model_config, deterministic=True)
  tx = optim.create_optimizer(config)
  evaluations = train_evals.from_config(config, tokenizer, eval_model)
  manager = checkpoints.make_manager(folder.path, config.keep_checkpoints)
  writer = metrics_lib.MetricsWriter(folder.path, jax.process_index() == 0)
  state, position = _start(config, folder.path, manager, latest,
                           init_state(config, model, tx), warm,
                           workdir_lib.changed_data_fields(config, saved))
  # A run killed before its checkpoint logged steps it will redo.
  writer.truncate_after(step)
  batches = iter(()) if done else train_batches(config, tokenizer, position)
  window = MetricsWindow(config, writer, metrics_lib.Progress(
      step, config.num_train_steps))
  saver = Saver(manager, step, position, config.grad_accum_steps)
  write_hparams(config, writer)
  return Loop(state, step, batches, CompiledUpdate(model, tx, config),
              window, saver, evaluations, Profiler(config, folder), writer,
              manager, before)


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
    for name, content in warm.vocabulary.items():
      path = os.path.join(folder.path, name)
      if jax.process_index() == 0 and not files.exists(path):
        files.write_bytes_atomic(path, content)
    return tokenizer_lib.from_files(warm.vocabulary, folder.path)
  if loaded is not None and jax.process_count() == 1:
    return loaded
  return data.get_tokenizer(config, folder.path)


def _start(config: ml_collections.ConfigDict, workdir: str, manager,
           latest: int | None, state: State, warm: WarmStart | None,
           changed: list[str]) -> tuple[State, int]:
  """Where the run starts: checkpoint `latest`, or step 0 from `state`
  (with a warm start's parameters). Only the state replicated over the
  local devices lives on: `state` and the restored one (each one more copy
  of the parameters and Adam's moments) are let go on return.

  Args:
    changed: data-order fields that differ from the workdir's config.json
      (`workdir_lib.changed_data_fields`), named in a warning on resume.

  Returns:
    (the replicated state, micro-batches read before the start).
  """
  if latest is None:
    logging.info("Starting a new run in %s.", workdir)
    if warm is not None:
      state = dict(state, params=warm.params)
      logging.info("Warm start: parameters of %s (step %d).",
                   config.init_from, warm.step)
    return devices.pmap_replicate(state, jax.local_devices()), 0
  state, meta = checkpoints.restore(manager, latest, jax.device_get(state))
  logging.info("Resumed from %s at step %d.", workdir, latest)
  if changed:
    logging.warning(
        "Resuming %s with other data settings (%s): training goes on from "
        "the checkpoint's position in the data, but the batches differ "
        "from those of an uninterrupted run, so the result is not "
        "bit-identical.", workdir, "; ".join(changed))
  # Micro-batches read before the checkpoint: its own count, so a resume
  # with another grad_accum_steps neither replays nor skips data.
  position = int(meta.get("data_position", latest * config.grad_accum_steps))
  return devices.pmap_replicate(state, jax.local_devices()), position


def train_batches(config: ml_collections.ConfigDict, tokenizer,
                  data_position: int) -> Iterator[dict[str, np.ndarray]]:
  """The training batches after the first `data_position` micro-batches,
  sharded over the local devices."""
  num_devices = jax.local_device_count()
  batches = data.train_batches(config, tokenizer, start_step=data_position)
  return (devices.shard(b, num_devices) for b in batches)
