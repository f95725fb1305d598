"""Training loop: `train_and_evaluate(config, workdir)`.

The train step is `pmap`ped over the local devices of every process; each
device holds a slice of the global batch, and gradients are summed over all
devices and divided by the global number of target tokens, so the update
does not depend on how the batch is split. A run resumes exactly from the
workdir's latest checkpoint: the step, parameters, optimizer state and RNG are
restored, and the input pipeline restarts at the saved position.
Checkpoints are saved asynchronously (`_Saver`): training goes on while Orbax
writes a step, and waits for that write at the next save and at the end.
Evaluation and save times, the config as TensorBoard hparams
(`write_hparams`) and an optional `jax.profiler` trace (`config.
profile_steps`, `_Profiler`) are written into the workdir.
"""
import contextlib
import dataclasses
import errno
import functools
import signal
import time
from typing import Any, Callable, Iterator

from absl import logging
import flax
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import optax

from mha import checkpoints
from mha import config_check
from mha import data
from mha import errors
from mha import event_files
from mha import files
from mha import host_memory
from mha import losses
from mha import metrics as metrics_lib
from mha import optim
from mha import scoring
from mha import translate
from mha import warm_start
from mha import workdir as workdir_lib
from mha.data import sources
from mha.errors import TrainingDiverged
from mha.errors import UserError
from mha.errors import WorkdirError
from mha.transformer import Transformer
from mha.transformer import TransformerConfig

AXIS = "batch"
# The errnos of a write the machine refuses: the run stops with one line.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
               errno.EPERM)

State = dict[str, Any]  # {'step', 'params', 'opt_state', 'rng'}


def init_state(config: ml_collections.ConfigDict, model: Transformer,
               tx: optax.GradientTransformation) -> State:
  """Step 0: initial parameters, optimizer state and the run's RNG key."""
  rng = jax.random.key(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)
  ids = jnp.ones((1, 8), jnp.int32)

  @jax.jit
  def _init():
    params = model.init(init_rng, ids, ids)["params"]
    return {"step": jnp.array(0, jnp.int32), "params": params,
            "opt_state": tx.init(params),
            "rng": jax.random.key_data(dropout_rng)}

  return _init()


def _loss_sums(model: Transformer, config: ml_collections.ConfigDict,
               params, batch: dict[str, jax.Array],
               dropout_rng: jax.Array | None, chunked: bool = False):
  """Sums over this device's target tokens: (smoothed loss, metrics).

  `chunked`: the pre-softmax projection and the loss a chunk of positions
  at a time (`losses.projected_token_sums`: the training step's memory
  holds no `[B, T, V]` logits); else from the whole logits (evaluation).
  """
  rngs = {"dropout": dropout_rng} if dropout_rng is not None else {}
  args = (batch["inputs"], batch["targets"],
          batch.get("inputs_position"), batch.get("targets_position"),
          batch.get("inputs_segmentation"), batch.get("targets_segmentation"))
  if chunked:
    hidden, (kernel, bias) = model.apply({"params": params}, *args, rngs=rngs,
                                         method=_hidden_and_output_weights)
    sums = losses.projected_token_sums(hidden, kernel, batch["targets"],
                                       config.label_smoothing, bias)
  else:
    logits = model.apply({"params": params}, *args, rngs=rngs)
    sums = losses.token_sums(logits, batch["targets"], config.label_smoothing)
  sums["source_tokens"] = jnp.sum(batch["inputs"] > 0).astype(jnp.float32)
  return sums["loss"], sums


def _hidden_and_output_weights(module: Transformer, inputs, targets,
                               inputs_positions, targets_positions,
                               inputs_segmentation, targets_segmentation):
  """(decoder output `[B, T, M]`, (kernel, bias) of the pre-softmax map)."""
  encoded = module.encode(inputs, inputs_positions, inputs_segmentation)
  hidden = module.decode_hidden(encoded, inputs, targets, targets_positions,
                                inputs_segmentation, targets_segmentation)
  return hidden, module.output_weights()


def _dropout_rng(state: State, micro_step) -> jax.Array:
  """fold_in(rng, step), then the micro-batch and the global device index;
  the masks are drawn by XLA's RngBitGenerator (an `rbg` key seeded from
  that threefry key), cheaper than threefry for millions of bits."""
  rng = jax.random.wrap_key_data(state["rng"])
  rng = jax.random.fold_in(rng, state["step"])
  rng = jax.random.fold_in(rng, micro_step)
  rng = jax.random.fold_in(rng, lax.axis_index(AXIS))
  return jax.random.wrap_key_data(jax.random.bits(rng, (4,), jnp.uint32),
                                  impl="rbg")


def make_grad_step(model: Transformer, config: ml_collections.ConfigDict):
  """(state, batch, micro_step) -> (gradient of the loss sum, metric sums)."""

  def grad_step(state, batch, micro_step):
    grad_fn = jax.grad(functools.partial(_loss_sums, model, config,
                                         chunked=True), has_aux=True)
    return grad_fn(state["params"], batch, _dropout_rng(state, micro_step))

  return grad_step


def make_apply_step(tx: optax.GradientTransformation,
                    config: ml_collections.ConfigDict):
  """(state, grad sums, metric sums, stop flag) -> (new state, metrics).

  Sums over all devices of all processes, divides by the global token count
  (a token-weighted mean, independent of the device split), applies Adam.
  """
  schedule = optim.config_schedule(config)  # the optimizer's, to log it

  def apply_step(state, grads, sums, stop):
    grads, sums = lax.psum((grads, sums), AXIS)
    tokens = jnp.maximum(sums["tokens"], 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / tokens, grads)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = {
        "loss": sums["loss"] / tokens,
        "nll": sums["nll"] / tokens,
        "accuracy": sums["correct"] / tokens,
        "target_tokens": sums["tokens"],
        "tokens": sums["tokens"] + sums["source_tokens"],
        "learning_rate": schedule(state["step"]),
        "grad_norm": optax.global_norm(grads),
        "stop": lax.psum(stop, AXIS),
    }
    new_state = dict(state, step=state["step"] + 1, params=params,
                     opt_state=opt_state)
    return new_state, metrics

  return apply_step


def make_train_step(model: Transformer, tx: optax.GradientTransformation,
                    config: ml_collections.ConfigDict):
  """One fused update on one batch: (state, batch, stop) -> (state, metrics)."""
  grad_step = make_grad_step(model, config)
  apply_step = make_apply_step(tx, config)

  def train_step(state, batch, stop):
    grads, sums = grad_step(state, batch, 0)
    return apply_step(state, grads, sums, stop)

  return train_step


def make_eval_step(model: Transformer, config: ml_collections.ConfigDict):
  """(params, batch) -> metric sums over all devices."""

  def eval_step(params, batch):
    _, sums = _loss_sums(model, config, params, batch, None)
    return lax.psum(sums, AXIS)

  return eval_step


def shard(batch: dict[str, np.ndarray], num_devices: int):
  """[B, L] -> [devices, B / devices, L] for pmap."""
  def split(x):
    if x.shape[0] % num_devices:
      raise ValueError(f"Batch of {x.shape[0]} rows does not split over "
                       f"{num_devices} local devices.")
    return x.reshape((num_devices, -1) + x.shape[1:])
  return jax.tree_util.tree_map(split, batch)


def replicate(tree, devices):
  """Copies of `tree` on `devices`, laid out as the pmapped step's outputs
  (same mesh axis name), so the first and later calls share one compile."""
  return flax.jax_utils.replicate(tree, devices, axis_name=AXIS)


def unreplicate(tree):
  """Host copy of the first local device's value of each replicated leaf.

  (flax.jax_utils.unreplicate keeps the device axis when there is one device.)
  """
  def first(x):
    if hasattr(x, "addressable_shards"):
      return np.asarray(x.addressable_shards[0].data)[0]
    return np.asarray(x)[0]
  return jax.tree_util.tree_map(first, tree)


# A replicated tree's first row on one device, as new buffers (the train
# step may donate the state's own buffers after the save returns).
_first_rows = jax.jit(lambda leaves: [x[0] for x in leaves])


def checkpoint_arrays(tree):
  """The replicated `tree` as jax arrays for Orbax, without a host copy
  made here.

  Each leaf of a `pmap`ped tree is `[local devices, ...]`. Each becomes a
  global array of the leaf's shape, replicated over the first local device
  of every process and copied there from that device's row: Orbax copies it
  to the host while it saves, once per process, and in multi-process runs
  each process writes a part of each value.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  first = jax.local_devices()[0]
  rows = _first_rows([next(s.data for s in x.addressable_shards
                           if s.device == first) for x in leaves])
  firsts = {}
  for device in jax.devices():
    firsts.setdefault(device.process_index, device)
  mesh = jax.sharding.Mesh(np.asarray([firsts[p] for p in sorted(firsts)]),
                           ("process",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  arrays = [jax.make_array_from_single_device_arrays(x.shape[1:], replicated,
                                                     [row])
            for x, row in zip(leaves, rows)]
  return jax.tree_util.tree_unflatten(treedef, arrays)


@dataclasses.dataclass
class _Updater:
  """The compiled update functions for `grad_accum_steps` micro-batches."""
  model: Transformer
  tx: optax.GradientTransformation
  config: ml_collections.ConfigDict
  devices: list | None = None  # None: every device of every process

  def __post_init__(self):
    # Explicit `devices` restrict the collectives to them: only for tests on
    # a subset of one process's devices. Multi-process runs need None.
    pmap = functools.partial(jax.pmap, axis_name=AXIS, devices=self.devices)
    self._num_local = len(self.devices or jax.local_devices())
    if self.config.grad_accum_steps == 1:
      self._train_step = pmap(make_train_step(self.model, self.tx, self.config),
                              donate_argnums=(0,))
    else:
      self._grad_step = pmap(make_grad_step(self.model, self.config))
      self._apply_step = pmap(make_apply_step(self.tx, self.config),
                              donate_argnums=(0,))
      self._add = jax.pmap(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b),
                           devices=self.devices, donate_argnums=(0,))

  def __call__(self, state, micro_batches: list, stop: np.ndarray):
    if self.config.grad_accum_steps == 1:
      return self._train_step(state, micro_batches[0], stop)
    total = None
    for i, batch in enumerate(micro_batches):
      micro = np.full((self._num_local,), i, np.int32)
      result = self._grad_step(state, batch, micro)
      total = result if total is None else self._add(total, result)
    grads, sums = total
    return self._apply_step(state, grads, sums, stop)


class _StopSignal:
  """Records SIGTERM (preemption) and SIGINT (Ctrl-C) so that the loop can
  save and stop at the next step boundary.

  Attributes:
    received: a signal asked the run to stop.
    interrupted: that signal was the user's Ctrl-C (the run then raises
      `Interrupted` once saved); a second Ctrl-C stops at once, without
      saving (KeyboardInterrupt).
  """

  def __init__(self):
    self.received = False
    self.interrupted = False
    self._previous = {}

  def __enter__(self):
    for signum in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # not the main thread: no signal handling
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT:
      if self.interrupted:
        raise KeyboardInterrupt
      self.interrupted = True
      logging.warning("Ctrl-C: saving a checkpoint at the next step "
                      "boundary (Ctrl-C again stops without saving).")
    else:
      logging.warning("SIGTERM: saving a checkpoint at the next step "
                      "boundary.")
    self.received = True

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}


class DevLoss:
  """Dev-split loss evaluation, the one place it is written.

  Token-weighted label-smoothed loss, per-token NLL, perplexity and accuracy
  over every batch of `config.eval_split`, without dropout. The trainer
  calls it at its evaluation steps; `scripts/table3.py` calls it on a
  checkpoint's parameters (`evaluate_params`).
  """

  def __init__(self, config: ml_collections.ConfigDict, tokenizer,
               model: Transformer | None = None):
    """Compiles nothing yet; the split is read at the first call.

    Args:
      config: the run's config (model, data and `eval_split`).
      tokenizer: the run's vocabulary.
      model: the deterministic model; None builds it from `config`.
    """
    self._config = config
    self._tokenizer = tokenizer
    model = model or Transformer(
        TransformerConfig.from_config(config, deterministic=True))
    self._eval_step = jax.pmap(make_eval_step(model, config), axis_name=AXIS)
    self._batches = None

  def __call__(self, params) -> dict[str, float]:
    """The metrics for `params` replicated over the local devices."""
    if self._batches is None:
      self._batches = data.eval_batches(self._config, self._tokenizer,
                                        self._config.eval_split)
    num_devices = jax.local_device_count()
    totals: dict[str, float] = {}
    for batch in self._batches:
      sums = unreplicate(self._eval_step(params, shard(batch, num_devices)))
      for k, v in sums.items():
        totals[k] = totals.get(k, 0.0) + float(v)
    tokens = max(totals.get("tokens", 0.0), 1.0)
    return {"eval_loss": totals["loss"] / tokens,
            "eval_nll": totals["nll"] / tokens,
            "eval_perplexity": float(np.exp(totals["nll"] / tokens)),
            "eval_accuracy": totals["correct"] / tokens}

  def evaluate_params(self, params) -> dict[str, float]:
    """The metrics for host `params` (e.g. a restored checkpoint's)."""
    return self(replicate(params, jax.local_devices()))


def evaluate_bleu(model_config: TransformerConfig, params, tokenizer,
                  sources: list[str], references: list[str],
                  config: ml_collections.ConfigDict) -> dict[str, float]:
  """BLEU of the config's beam search on `sources` (`mha.translate`).

  Cheap to call repeatedly on the same sentences: nothing is read from disk
  and the compiled searches are reused. `eval_decode_sentences_per_sec`
  counts the translation only, not the scoring.
  """
  start = time.perf_counter()  # the search runs on every local device
  hypotheses = translate.translate_texts(
      model_config, params, tokenizer, sources, beam_size=config.beam_size,
      alpha=config.alpha, max_decode_extra=config.max_decode_extra)
  seconds = time.perf_counter() - start
  scores = scoring.score(hypotheses, references)
  return {"eval_bleu": scores["bleu"], "eval_chrf": scores["chrf"],
          "eval_decode_sentences_per_sec": len(sources) / max(seconds, 1e-9)}


def _check_finite(step: int, metrics: dict[str, float]) -> None:
  if not np.isfinite(metrics["loss"]):
    raise TrainingDiverged(
        f"Training loss is {metrics['loss']} at step {step}; stopping. The "
        "checkpoints saved before this step are intact.")


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
    ValueError: naming the processes whose vocabulary differs from process
      0's.
  """
  if jax.process_count() == 1:
    return
  digest = np.frombuffer(bytes.fromhex(tokenizer.sha256), np.uint8)
  digests = np.asarray(multihost_utils.process_allgather(digest))
  differ = [i for i, d in enumerate(digests) if not np.array_equal(d,
                                                                   digests[0])]
  if differ:
    raise ValueError(
        f"Processes {differ} hold a different SentencePiece model than "
        f"process 0 ({tokenizer.path}, sha256 {digests[0].tobytes().hex()}). "
        "Give every host the same training data and library versions, or "
        "copy process 0's spm.model into the workdir before starting.")


def check_inputs(config: ml_collections.ConfigDict,
                 workdir: workdir_lib.Workdir) -> None:
  """Every check of a run's input that needs no write, run before any write.

  The config's fields (`config_check.validate`, with the real minimum of
  `max_tokens` for this run's devices), the workdir (a folder, or a path
  that can become one; its config.json readable and of the same model; its
  spm.model readable and of config.vocab_size pieces), and every split the
  config names (train, eval and test), opened but not read. A workdir whose
  run is finished reads no data, so its splits are not opened.

  Raises:
    UserError: a ConfigError, WorkdirError or DataError naming the field,
      file or split at fault.
  """
  config_check.validate(config, jax.device_count())
  workdir.check_usable()
  workdir.check_config(config)
  if files.exists(workdir.vocabulary_path):
    workdir.load_tokenizer(config)  # reads it: writes nothing
  latest = (checkpoints.latest_step(workdir.path)
            if files.isdir(workdir.checkpoints_path) else None)
  if latest is not None:
    # A damaged latest step is refused here, before config.json or the
    # event files are touched, naming the newest intact step.
    checkpoints.check_step(workdir.path, latest, "train")
    if latest >= config.num_train_steps:
      return
  elif config.init_from:
    warm_start.vocabulary(config.init_from, workdir.path)
    model = Transformer(TransformerConfig.from_config(config))
    ids = jnp.ones((1, 8), jnp.int32)
    shapes = jax.eval_shape(model.init, jax.random.key(0), ids, ids)
    warm_start.load(config.init_from, shapes["params"])
  for field in ("train_split", "eval_split", "test_split"):
    try:
      sources.open_split(config, config[field])
    except data.DataError as e:
      raise data.DataError(f"config.{field}={config[field]!r}: {e}") from None


@contextlib.contextmanager
def _workdir_lock(workdir: workdir_lib.Workdir) -> Iterator[None]:
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


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, float]:
  """Trains `config` in `workdir`, resuming from its latest checkpoint.

  Every input is checked first (`check_inputs`); only then is the workdir
  created, locked (`<workdir>/lock`, one run per workdir) and written. A
  SIGTERM (preemption) makes the run save a checkpoint at the next step
  boundary and return; a Ctrl-C (SIGINT) too, and then it raises
  `Interrupted` (a second Ctrl-C raises it at once, without saving). A
  non-finite loss raises TrainingDiverged naming the step; checkpoints
  saved before it are left as they are. A write the machine refuses (a
  full disk, a read-only folder) raises a DiskError naming the file or
  checkpoint and the last good checkpoint, with Orbax's threads ended.

  Returns:
    The metrics of the last logged step and evaluation, and `step`.

  Raises:
    UserError: bad input (nothing written), another run holding the
      workdir, a diverged run, a refused write (DiskError), a Ctrl-C
      (Interrupted).
  """
  folder = workdir_lib.Workdir(workdir)
  check_inputs(config, folder)
  try:
    with _workdir_lock(folder), _disk_errors(folder):
      return _train(config, folder)
  except KeyboardInterrupt:
    # A Ctrl-C outside the loop (set-up, compilation) or a second one in it.
    last = checkpoints.latest_step_or_none(
        checkpoints.checkpoint_dir(folder.path))
    raise errors.Interrupted(
        "Interrupted (Ctrl-C) without saving: " +
        (f"the last checkpoint is step {last}; run train.py again to resume "
         "from it." if last is not None else "no checkpoint was written.")
    ) from None


@dataclasses.dataclass
class _Run:
  """What the set-up builds for a run.

  Attributes:
    tokenizer: the run's vocabulary (read, trained, or a warm start's).
    model: the training model (with dropout).
    eval_model: the same model without dropout.
    tx: the optimizer.
    state: the step-0 state, on the host (None once training starts).
    warm: a new run that starts from `config.init_from`'s parameters.
    changed: data-order fields that differ from the workdir's config.json.
  """
  tokenizer: data.Tokenizer
  model: Transformer
  eval_model: Transformer
  tx: optax.GradientTransformation
  state: State | None
  warm: bool
  changed: list[str]


def _set_up(config: ml_collections.ConfigDict,
            folder: workdir_lib.Workdir) -> _Run:
  """Set-up: vocabulary, config.json, models, optimizer and step-0 state."""
  is_primary = jax.process_index() == 0
  folder.check_config(config)  # again: another run may have written it
  changed = folder.changed_data_fields(config)
  warm = (bool(config.init_from) and
          checkpoints.latest_step(folder.path) is None)
  if warm:  # the vocabulary of the run it starts from (checked before)
    proto = warm_start.vocabulary(config.init_from, folder.path)
    if is_primary and not files.exists(folder.vocabulary_path):
      files.write_bytes_atomic(folder.vocabulary_path, proto)
    tokenizer = data.Tokenizer(proto, path=folder.vocabulary_path)
  else:
    tokenizer = data.get_tokenizer(config, folder.path)
  check_same_vocabulary(tokenizer)
  if is_primary:
    folder.write_config(config)
  model = Transformer(TransformerConfig.from_config(config))
  eval_model = Transformer(TransformerConfig.from_config(config,
                                                         deterministic=True))
  tx = optim.create_optimizer(config)
  return _Run(tokenizer, model, eval_model, tx,
              init_state(config, model, tx), warm, changed)


@dataclasses.dataclass
class _Start:
  """Where the run starts.

  Attributes:
    state: the state at `step`, on the host (None once replicated).
    step: the first update's step (0, or the restored checkpoint's).
    data_position: micro-batches read before `step`.
  """
  state: State | None
  step: int
  data_position: int


def _resume_or_start(config: ml_collections.ConfigDict,
                     folder: workdir_lib.Workdir, run: _Run,
                     manager, writer: metrics_lib.MetricsWriter) -> _Start:
  """Resume-or-start: the latest checkpoint, or step 0 (warm or not).

  metrics.jsonl loses the lines of steps after the start: they are redone.
  """
  workdir = folder.path
  step = checkpoints.latest_step(workdir)
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
    if run.warm:
      params, from_step = warm_start.load(config.init_from, state["params"])
      state = dict(state, params=params)
      logging.info("Warm start: parameters of %s (step %d).",
                   config.init_from, from_step)
  # A run killed before its checkpoint logged steps it will redo.
  writer.truncate_after(step)
  # Micro-batches read before `step`: the checkpoint's own count, so a
  # resume with another grad_accum_steps neither replays nor skips data.
  position = int(meta.get("data_position", step * config.grad_accum_steps))
  if step >= config.num_train_steps:
    logging.info("%s is at step %d >= num_train_steps=%d: nothing to train.",
                 workdir, step, config.num_train_steps)
  return _Start(state, step, position)


def _train_batches(config: ml_collections.ConfigDict, tokenizer,
                   start: _Start) -> Iterator[dict[str, np.ndarray]]:
  """The training batches from the start's data position, sharded."""
  if start.step >= config.num_train_steps:
    return iter(())  # already finished: do not read or plan the split
  num_devices = jax.local_device_count()
  batches = data.train_batches(config, tokenizer,
                               start_step=start.data_position)
  return (shard(b, num_devices) for b in batches)


@dataclasses.dataclass
class _Saver:
  """Saving: a checkpoint with the data position it has reached.

  Asynchronous: training goes on while Orbax writes the step's files in the
  background; the next save waits for that write first, and so does the end
  of the run (`finish`). A save the machine refuses (a full disk, a
  read-only folder) raises `checkpoints.CheckpointSaveError` naming the
  step and the last good checkpoint, once Orbax's threads are ended.
  """
  manager: Any
  start: _Start
  grad_accum_steps: int
  pending: int | None = None  # the step being written in the background

  def __call__(self, step: int, state: State) -> float:
    """Starts saving the replicated `state` of `step`.

    Returns:
      The seconds training paused: waiting for the previous save's write,
      then Orbax's copy of the arrays to the host.
    """
    begin = time.perf_counter()
    self._wait()
    waited = time.perf_counter() - begin
    accum = self.grad_accum_steps
    position = self.start.data_position + (step - self.start.step) * accum
    self.pending = step
    with self._failures():
      checkpoints.save(self.manager, step, checkpoint_arrays(state),
                       {"step": step, "data_position": position,
                        "grad_accum_steps": accum}, force=True, wait=False)
    paused = time.perf_counter() - begin
    logging.info("Saving checkpoint %d in the background: training paused "
                 "%.2f s (%.2f s of it for the previous save's write).",
                 step, paused, waited)
    return paused

  def finish(self) -> None:
    """Waits for the last save's write (before the run returns or raises)."""
    begin = time.perf_counter()
    self._wait()
    logging.info("Checkpoints written (%.2f s waited at the end).",
                 time.perf_counter() - begin)

  def _wait(self) -> None:
    with self._failures():
      self.manager.wait_until_finished()
    self.pending = None

  @contextlib.contextmanager
  def _failures(self) -> Iterator[None]:
    """A failed save of `pending` as a CheckpointSaveError (or, if not the
    machine's, as it was), with Orbax's waiting threads ended either way."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      step, self.pending = self.pending, None
      if step is None:
        raise
      error = checkpoints.save_failure(self.manager, step, e)
      if error is None:
        raise
      raise error from None


class MetricsWindow:
  """The updates since the last logged step.

  Each update's metrics are fetched (a non-finite loss raises
  TrainingDiverged), and at every `log_every_steps`-th step (and the last)
  their means, the perplexity and the token and step rates are written.

  Attributes:
    last: the last written summary and evaluation metrics.
    stop: some process asked to stop (SIGTERM) in an update fetched so far.
  """

  def __init__(self, config: ml_collections.ConfigDict,
               writer: metrics_lib.MetricsWriter,
               progress: metrics_lib.Progress):
    self.last: dict[str, float] = {}
    self.stop = False
    self._config = config
    self._writer = writer
    self._progress = progress
    self._window: list[dict[str, float]] = []
    self._start = time.perf_counter()

  def add(self, step: int, device_metrics) -> None:
    """Fetches the metrics of the update that made `step`."""
    m = {k: float(v) for k, v in unreplicate(device_metrics).items()}
    _check_finite(step, m)
    self.stop = self.stop or m.pop("stop") > 0
    self._window.append(m)
    if (step % self._config.log_every_steps == 0 or
        step == self._config.num_train_steps):
      self._log(step)

  def _log(self, step: int) -> None:
    window = self._window
    elapsed = max(time.perf_counter() - self._start, 1e-9)
    summary = {k: float(np.mean([w[k] for w in window]))
               for k in ("loss", "nll", "accuracy", "learning_rate",
                         "grad_norm")}
    summary["tokens_per_sec"] = sum(w["tokens"] for w in window) / elapsed
    # Real (non-padding) tokens per update and side, what the paper's
    # "25000 source and 25000 target tokens" per batch count.
    summary["target_tokens_per_update"] = float(np.mean(
        [w["target_tokens"] for w in window]))
    summary["source_tokens_per_update"] = float(np.mean(
        [w["tokens"] - w["target_tokens"] for w in window]))
    summary["steps_per_sec"] = len(window) / elapsed
    summary["perplexity"] = float(np.exp(summary["nll"]))
    self.write(step, summary)
    self._progress.report(step, summary["loss"])
    self._window, self._start = [], time.perf_counter()

  def write(self, step: int, metrics: dict[str, float]) -> None:
    """Writes `metrics` (a summary or an evaluation) and keeps them."""
    self._writer.write(step, metrics)
    self.last.update(metrics)


class InTrainingEval:
  """Periodic evaluation, handed to the loop: dev loss, then BLEU.

  The BLEU of the config's beam search on the first
  `config.eval_bleu_sentences` pairs of `config.eval_split` (none if 0).
  """

  def __init__(self, config: ml_collections.ConfigDict, tokenizer,
               eval_model: Transformer):
    self._config = config
    self._tokenizer = tokenizer
    self._model_config = eval_model.config
    self._dev_loss = DevLoss(config, tokenizer, eval_model)
    self._bleu_pairs = None  # (sources, references), read at first use

  def __call__(self, state: State) -> dict[str, float]:
    """The metrics of the replicated `state`'s parameters."""
    config = self._config
    metrics = self._dev_loss(state["params"])
    if config.eval_bleu_sentences > 0:
      if self._bleu_pairs is None:
        sources, references = data.load_text_pairs(config, config.eval_split)
        self._bleu_pairs = (sources[:config.eval_bleu_sentences],
                            references[:config.eval_bleu_sentences])
      metrics.update(evaluate_bleu(
          self._model_config, unreplicate(state["params"]), self._tokenizer,
          *self._bleu_pairs, config))
    return metrics


def write_hparams(config: ml_collections.ConfigDict, workdir: str) -> None:
  """The resolved config as TensorBoard hparams (its HParams tab), in an
  event file of the workdir; process 0 only. Nested fields are flattened
  ('a.b'); values that are not numbers, strings or booleans (tuples, None)
  are written as their text."""
  if jax.process_index() != 0:
    return
  hparams = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
             for k, v in _flat(config.to_dict()).items()}
  writer = event_files.EventFileWriter(workdir)
  try:
    writer.write_hparams(hparams)
  finally:
    writer.close()


def _flat(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


class _Profiler:
  """`config.profile_steps = (first, count)`: a `jax.profiler` trace of the
  `count` updates from the one that makes step `first`, on process 0, into
  `Workdir.profile_path` (`<workdir>/plugins/profile/<time>/`: TensorBoard's
  Profile tab reads it beside the scalars). Off when empty, when the count is 0, or when the run
  starts past `first`.
  """

  def __init__(self, config: ml_collections.ConfigDict,
               folder: workdir_lib.Workdir):
    first, count = tuple(config.get("profile_steps") or ()) or (0, 0)
    on = count > 0 and jax.process_index() == 0
    self._first, self._last = (first, first + count - 1) if on else (0, -1)
    self._folder = folder
    self._tracing = False

  def before_update(self, step: int) -> None:
    """Called before the update that makes `step` is dispatched."""
    if step == self._first:
      logging.info("Profiling steps %d to %d into %s.", self._first,
                   self._last, self._folder.profile_path)
      # The workdir is the trace's logdir: jax writes plugins/profile/ in it.
      jax.profiler.start_trace(self._folder.path)
      self._tracing = True

  def after_update(self, step: int, state: State) -> None:
    """Called once the update that made `step` is dispatched."""
    if self._tracing and step >= self._last:
      jax.block_until_ready(state)
      self.close()

  def close(self) -> None:
    """Ends the trace if it runs (also when the loop stops early)."""
    if self._tracing:
      self._tracing = False
      jax.profiler.stop_trace()
      logging.info("Profile written into %s.", self._folder.profile_path)


def _is_due(step: int, every: int, config: ml_collections.ConfigDict) -> bool:
  return step % every == 0 or step == config.num_train_steps


def _loop(config: ml_collections.ConfigDict, state: State, step: int,
          batches: Iterator, update: _Updater, window: MetricsWindow,
          save: _Saver, evaluate: Callable[[State], dict[str, float]],
          profiler: _Profiler, stop_signal: _StopSignal) -> int:
  """Updates from `step` to num_train_steps; returns the last step.

  Preemption: a SIGTERM (or Ctrl-C) on any process sets the stop flag of
  the next update; once fetched, the run saves that step and returns.

  After the first update and after each evaluation (the compilations) the
  heaps' free pages go back to the kernel (`host_memory.release_free_heap`),
  so that they do not add to every later step's peak resident memory.
  """
  num_devices = jax.local_device_count()
  pending = None  # (step, device metrics) of the update in flight
  compiled = False
  with stop_signal as sigterm, contextlib.closing(profiler):
    while step < config.num_train_steps:
      micro = [next(batches) for _ in range(config.grad_accum_steps)]
      stop = np.full((num_devices,), int(sigterm.received), np.int32)
      profiler.before_update(step + 1)
      state, device_metrics = update(state, micro, stop)
      if not compiled:
        host_memory.release_free_heap()
        compiled = True
      if pending is not None:
        window.add(*pending)  # overlaps with the update just dispatched
      step += 1
      profiler.after_update(step, state)
      pending = (step, device_metrics)
      need_save = _is_due(step, config.checkpoint_every_steps, config)
      need_eval = _is_due(step, config.eval_every_steps, config)
      if need_save or need_eval or window.stop:
        window.add(*pending)
        pending = None
      if need_save or window.stop:
        window.write(step, {"save_seconds": save(step, state)})
      if need_eval:
        begin = time.perf_counter()
        metrics = evaluate(state)
        metrics["eval_seconds"] = time.perf_counter() - begin
        host_memory.release_free_heap()
        window.write(step, metrics)
      if window.stop:
        logging.warning("%s: saved step %d; exiting.", "Interrupted" if
                        sigterm.interrupted else "Preempted", step)
        break
  return step


def _train(config: ml_collections.ConfigDict,
           folder: workdir_lib.Workdir) -> dict[str, float]:
  """The run itself, under the workdir's lock: the steps above in order.

  Bad data found during the set-up (a vocabulary that cannot be trained, no
  example within the length limits) leaves the workdir as it was.
  """
  restored = (folder.restored_on((UserError,)) if jax.process_index() == 0
              else contextlib.nullcontext())
  with restored:
    run = _set_up(config, folder)
    manager = checkpoints.make_manager(folder.path, config.keep_checkpoints)
    writer = metrics_lib.MetricsWriter(folder.path, jax.process_index() == 0)
    start = _resume_or_start(config, folder, run, manager, writer)
    batches = _train_batches(config, run.tokenizer, start)
  state = replicate(start.state, jax.local_devices())
  # Only the replicated copy lives on for the run: the set-up's step-0
  # state and the start's (each one more copy of the parameters and Adam's
  # moments, 90 MB for configs/multi30k.py) are let go.
  run = dataclasses.replace(run, state=None)
  start = dataclasses.replace(start, state=None)
  update = _Updater(run.model, run.tx, config)
  evaluate = InTrainingEval(config, run.tokenizer, run.eval_model)
  window = MetricsWindow(config, writer, metrics_lib.Progress(
      start.step, config.num_train_steps))
  saver = _Saver(manager, start, config.grad_accum_steps)
  stop_signal = _StopSignal()
  with checkpoints.quiet_save_errors():
    try:
      write_hparams(config, folder.path)
      step = _loop(config, state, start.step, batches, update, window, saver,
                   evaluate, _Profiler(config, folder), stop_signal)
    finally:
      # Also when the loop raises (a diverged run): the checkpoint being
      # written is completed before the workdir's lock is released.
      try:
        saver.finish()
      finally:
        manager.close()
  writer.flush()
  if stop_signal.interrupted:
    raise errors.Interrupted(
        f"Interrupted (Ctrl-C): saved checkpoint {step} in "
        f"{checkpoints.checkpoint_dir(folder.path)}; run train.py again to "
        "resume from it.")
  return dict(window.last, step=step)


@contextlib.contextmanager
def _disk_errors(folder: workdir_lib.Workdir) -> Iterator[None]:
  """A file of the run that the machine refuses to write (metrics.jsonl or
  an event file on a full disk, a read-only folder) as a DiskError naming
  the file and the checkpoint to resume from; other OSErrors as they are."""
  try:
    yield
  except OSError as e:
    code = errors.os_errno(e)
    if code not in DISK_ERRNOS:
      raise
    last = checkpoints.latest_step_or_none(
        checkpoints.checkpoint_dir(folder.path))
    where = e.filename or folder.path
    raise errors.DiskError(
        f"{where} could not be written: {errors.os_reason(e)}. Training "
        f"stopped; {checkpoints.resume_advice(folder.path, last, code)}."
    ) from None
