"""The pure training and evaluation steps, what `bench/train_step.py` times.

`make_train_step` gives `(state, batch, stop) -> (state, metrics)`, to be
`pmap`ped over the local devices of every process (axis `devices.AXIS`):
each device holds a slice of the global batch, and gradients are summed over
all devices and divided by the global number of target tokens, so the update
does not depend on how the batch is split. `CompiledUpdate` is the trainer's
update: the step `pmap`ped with the state donated, or, for
`config.grad_accum_steps` > 1, the gradients of each micro-batch summed
before one `make_apply_step`.
"""
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
import ml_collections
import numpy as np
import optax

from mha.model import losses
from mha.model import optim
from mha.train.devices import AXIS
from mha.model.transformer import Transformer

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
    hidden, (kernel, bias) = model.apply(
        {"params": params}, *args, rngs=rngs,
        method=Transformer.hidden_and_output_weights)
    sums = losses.projected_token_sums(hidden, kernel, batch["targets"],
                                       config.label_smoothing, bias)
  else:
    logits = model.apply({"params": params}, *args, rngs=rngs)
    sums = losses.token_sums(logits, batch["targets"], config.label_smoothing)
  sums["source_tokens"] = jnp.sum(batch["inputs"] > 0).astype(jnp.float32)
  return sums["loss"], sums


def _dropout_rng(state: State, micro_step) -> jax.Array:
  """fold_in(rng, step), then the micro-batch and the global device index:
  each update, micro-batch and device draws masks of its own
  (`mha.model.dropout`: a few words of this key seed each layer's mask hash)."""
  rng = jax.random.wrap_key_data(state["rng"])
  rng = jax.random.fold_in(rng, state["step"])
  rng = jax.random.fold_in(rng, micro_step)
  return jax.random.fold_in(rng, lax.axis_index(AXIS))


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


@dataclasses.dataclass
class CompiledUpdate:
  """The trainer's update, `pmap`ped: (replicated state, the step's
  `grad_accum_steps` sharded micro-batches, stop flags) -> (state, metrics).

  One micro-batch: `make_train_step`, fused. Several: the gradients and
  metric sums of each (`make_grad_step`) are added on the devices, then one
  `make_apply_step`. The state's buffers are donated either way.
  """
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
