"""One batch through the Transformer's search, on this process's devices.

`mha.search.decoding`'s searches are model-agnostic: this module gives them
the Transformer's step function and decode cache (`mha.search.model_cache`),
jits each search once per (config, search settings), keeps the traced
searches of `translate_batch` and `refill_batches` on disk
(`mha.search.trace_cache`; sampling and scoring are only jitted), and runs
them over the batch's sentences split evenly over the devices
(`jax.shard_map`):

* `translate_batch`: greedy or beam search, the best output of each
  sentence or its n best hypotheses with their scores;
* `refill_batches`: several batches as one search whose slots, as their
  sentences end, take the next batches' sentences (`refill.greedy_refill`,
  `refill.beam_refill`), with the outputs of each batch's own search;
* `sample_batch`: ancestral samples (`mha.search.decoding.sample`), a key per
  sentence;
* `score_batch`: the model's log-probability of given targets
  (`mha.search.decoding.forced_log_probs`).

The search stops a sentence as soon as its best hypothesis, the one
returned, can no longer be beaten (`num_best=1`), and once only half of a
batch's sentences (or a quarter, ...) are left it goes on with those alone
(`shrink_sizes`, down to `MIN_SEARCH_ROWS` rows): the outputs are those of
the full search of the whole batch. It runs in two stages: outputs up to
the padded input length + `FIRST_STAGE_EXTRA`, then, only if some sentence
is not done, up to its limit.

Devices: each batch's sentences are split evenly over the devices given
(`search_devices`: all of them if they divide the rows, else the default
device), each device searching its own sentences. The translations are the
same on any number of devices.

`mha.search.texts` cuts texts into batches and calls these; it is the module
the rest of the code translates through.
"""
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mha import validation
from mha.search import decoding
from mha.search import refill
from mha.search import settings as settings_lib
from mha.search import trace_cache as search_cache
from mha.search.model_cache import (CACHE_ROWS, _grow_cache_fn, _init_cache,
                                    _model_fns, _refill_cache, _refill_queue,
                                    _search_model, _start_rows_fn, _step_fn,
                                    cache_rows)
from mha.search.settings import SearchSettings
from mha.search.stages import all_stage_lengths
from mha.data import token_ids
from mha.model.transformer import TransformerConfig
from mha.model.transformer import create_model

# The fewest rows (sentences x beam) the search shrinks a batch to as its
# sentences finish (`shrink_sizes`): XLA:CPU's matrix products gave a row
# the same bits at 64 rows and more as at 256, but not at 32 or fewer (on
# the CPU of bench/README.md's decoding figures), and outputs must not
# depend on which sentences share a batch.
MIN_SEARCH_ROWS = 64
_AXIS = "sentences"  # the mesh axis the sharded search splits rows over
# The first stage of the search: outputs up to the padded input length + 3
# (in a trained model nearly all searches end there; `mha.search.stages`).
# Every step's row copies and attention cost grow with the stage's length,
# and a search that goes on pays for the growth: on the trained Multi30k
# model + 3 was faster than + 10 for greedy and beam search alike, with the
# same outputs, and + 0 slowed greedy search down (bench/README.md, issue
# 33).
FIRST_STAGE_EXTRA = 3


@functools.lru_cache(maxsize=32)
def _refill_fn(model_config: TransformerConfig, settings: SearchSettings,
               eos_id: int) -> Callable[..., Any]:
  """The jitted search of `inputs`, arrays `[k, slots, s]` (k batches of one
  source length each), with `slots` sentences searched at a time, a slot
  whose sentence is done taking the next one (`refill.greedy_refill`,
  `refill.beam_refill`): `[sentences, max_decode_len]` outputs, the best
  of each batch's own search (`_translate_fn`, `num_best=0`).

  `devices=()`: on the default device. Two or more devices: each batch's
  sentences (the `slots` axis, a multiple of the number of devices) are
  split evenly over them (`_on_devices`), and each device runs its own
  search of its share of every batch, its slots taking its next
  sentences; `max_lengths` and the outputs in the devices' order
  (`_device_major`). `settings`: their `search_key`."""
  model = _search_model(model_config, settings)
  beam_size, step_hook = settings.beam_size, settings.step_hook(eos_id)

  def local_search(params: Any, inputs: tuple[jax.Array, ...],
                   max_lengths: jax.Array, max_decode_len: int,
                   stage_lengths: tuple[int, ...]) -> Any:
    num_slots = inputs[0].shape[1]
    lengths = all_stage_lengths(stage_lengths, max_decode_len)
    queue, ids, shapes = _refill_queue(model, params, inputs, lengths[0],
                                       beam_size)
    cache = _refill_cache(shapes, queue, ids, num_slots, beam_size,
                          model_config.d_model)
    init_cache = functools.partial(_init_cache, model, params,
                                   cache["encoded"], ids[:num_slots],
                                   num_slots * beam_size)
    common = dict(stage_lengths=tuple(lengths[:-1]),
                  grow_cache=_grow_cache_fn(init_cache, shapes))
    start_rows = _start_rows_fn(queue, ids)
    if beam_size == 1:
      return refill.greedy_refill(
          _step_fn(model, params), cache, start_rows, num_slots,
          max_decode_len, eos_id, max_lengths, step_hook=step_hook,
          **common)[0]
    return refill.beam_refill(
        _step_fn(model, params), cache, start_rows, num_slots, beam_size,
        settings.alpha, max_decode_len, eos_id, max_lengths,
        cache_rows(cache), stop=settings.beam_stop, step_hook=step_hook,
        **common)[0]

  @functools.partial(jax.jit, static_argnames=(
      "max_decode_len", "stage_lengths", "devices"))
  def search(params: Any, inputs: tuple[jax.Array, ...],
             max_lengths: jax.Array, *, max_decode_len: int,
             stage_lengths: tuple[int, ...],
             devices: tuple[jax.Device, ...] = ()) -> Any:
    local = functools.partial(local_search, max_decode_len=max_decode_len,
                              stage_lengths=stage_lengths)
    return _on_devices(local, devices, [params], [inputs, max_lengths],
                       split_axes=[1, 0])

  return search_cache.cached(search, ("refill", model_config, settings,
                                      eos_id))


def shrink_sizes(batch_size: int, beam_size: int) -> tuple[int, ...]:
  """The search's `shrink_sizes` for a batch: halvings of the sentences
  while their rows stay at least `MIN_SEARCH_ROWS`."""
  sizes = []
  n = batch_size // 2
  while n * beam_size >= MIN_SEARCH_ROWS:
    sizes.append(n)
    n //= 2
  return tuple(sizes)


@functools.lru_cache(maxsize=8)
def _mesh(devices: tuple[jax.Device, ...]) -> jax.sharding.Mesh:
  """The one-axis mesh (`_AXIS`) of `devices`, built once per tuple: the
  sharded search, the rows put on the devices and the replicated
  parameters all use this one."""
  return jax.sharding.Mesh(np.asarray(devices), (_AXIS,))


def _split_spec(axis: int) -> jax.sharding.PartitionSpec:
  """The partition of an array whose `axis` is split over the mesh."""
  return jax.sharding.PartitionSpec(*(None,) * axis, _AXIS)


def _on_devices(local: Callable[..., Any], devices: tuple[jax.Device, ...],
                shared: Sequence[Any], rows: Sequence[Any],
                split_axes: Sequence[int] | None = None) -> Any:
  """`local(*shared, *rows)`, its sentences split over `devices`.

  Fewer than two devices: on the default device. Otherwise the `rows`
  arguments (arrays or tuples of arrays whose axis of sentences,
  `split_axes[i]`, default the leading one, is a multiple of the number of
  devices) are split evenly over them (`jax.shard_map`), the `shared` ones
  (the parameters, scalars) replicated; each device computes its own
  sentences, as one device would, and every output has a leading axis of
  sentences.
  """
  if len(devices) < 2:
    return local(*shared, *rows)
  split_axes = split_axes or [0] * len(rows)
  # check_vma=False: no collective; the loop's constant-initialised state
  # becomes per-device, which the type check would want spelled out.
  return jax.shard_map(
      local, mesh=_mesh(devices),
      in_specs=(jax.sharding.PartitionSpec(),) * len(shared)
      + tuple(_split_spec(axis) for axis in split_axes),
      out_specs=_split_spec(0), check_vma=False)(*shared, *rows)


@functools.lru_cache(maxsize=32)
def _translate_fn(model_config: TransformerConfig, settings: SearchSettings,
                  eos_id: int) -> Callable[..., Any]:
  """The jitted search for one model config and `settings` (their
  `search_key`); recompiles per input shape, per tuple of devices and per
  `num_best`.

  `devices=()`: the search on the default device. Two or more devices: the
  sentences (rows of `inputs` and `max_lengths`, a multiple of the number
  of devices) are split evenly over them (`_on_devices`).

  `num_best=0`: the best output of each sentence, `[batch, len]`. `n >= 1`:
  the n best, `(tokens [batch, n, len], scores [batch, n], log_probs
  [batch, n])`.
  """
  model = _search_model(model_config, settings)
  beam_size = settings.beam_size

  def local_search(params: Any, inputs: jax.Array, max_lengths: jax.Array,
                   max_decode_len: int, stage_lengths: tuple[int, ...],
                   num_best: int) -> Any:
    batch_size = inputs.shape[0]
    lengths = all_stage_lengths(stage_lengths, max_decode_len)
    tokens_to_logits, cache, grow_cache = _model_fns(
        model, params, inputs, beam_size, lengths[0])
    # num_best=n: a sentence is done once its n best finished hypotheses,
    # those returned, can no longer be beaten (the other slots, unread,
    # need not be complete); they are the full search's n best.
    tokens, scores, log_probs = decoding.beam_search(
        tokens_to_logits, cache, batch_size, beam_size, settings.alpha,
        max_decode_len, eos_id, max_lengths,
        stage_lengths=tuple(lengths[:-1]), grow_cache=grow_cache,
        cache_rows=cache_rows(cache), num_best=max(num_best, 1),
        shrink_sizes=shrink_sizes(batch_size, beam_size),
        with_log_probs=True, stop=settings.beam_stop,
        step_hook=settings.step_hook(eos_id))
    if not num_best:
      return tokens[:, 0]  # [batch, max_decode_len]
    return (tokens[:, :num_best], scores[:, :num_best],
            log_probs[:, :num_best])

  @functools.partial(jax.jit, static_argnames=(
      "max_decode_len", "stage_lengths", "devices", "num_best"))
  def search(params: Any, inputs: jax.Array, max_lengths: jax.Array, *,
             max_decode_len: int, stage_lengths: tuple[int, ...],
             devices: tuple[jax.Device, ...] = (), num_best: int = 0) -> Any:
    local = functools.partial(local_search, max_decode_len=max_decode_len,
                              stage_lengths=stage_lengths, num_best=num_best)
    return _on_devices(local, devices, [params], [inputs, max_lengths])

  return search_cache.cached(search, ("translate", model_config, settings,
                                      eos_id))


@functools.lru_cache(maxsize=32)
def _sample_fn(model_config: TransformerConfig, eos_id: int, greedy: bool,
               top_k: int) -> Callable[..., Any]:
  """The jitted sampler (`mha.search.decoding.sample`) for one model config: one
  compilation for every temperature > 0 (`greedy`: temperature 0).

  Sentence i's key is `fold_in(key(seed), i)` with i its entry of
  `sentence_ids` (its position in the caller's list): its sample depends on
  the seed and i alone, whatever the batch and the devices. Returns
  `(tokens [batch, len], log_probs [batch])`.
  """
  model = create_model(model_config, decode=True, deterministic=True)

  def local_sample(params, seed, temperature, inputs, max_lengths,
                   sentence_ids, max_decode_len, stage_lengths):
    lengths = all_stage_lengths(stage_lengths, max_decode_len)
    tokens_to_logits, cache, grow_cache = _model_fns(model, params, inputs,
                                                     1, lengths[0])
    keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.key(seed),
                                                   sentence_ids)
    return decoding.sample(
        tokens_to_logits, cache, inputs.shape[0], max_decode_len, eos_id,
        keys, 0.0 if greedy else temperature, top_k, max_lengths,
        stage_lengths=tuple(lengths[:-1]), grow_cache=grow_cache,
        cache_rows=cache_rows(cache))

  @functools.partial(jax.jit, static_argnames=(
      "max_decode_len", "stage_lengths", "devices"))
  def sample(params, seed, temperature, inputs, max_lengths, sentence_ids,
             *, max_decode_len, stage_lengths, devices=()):
    local = functools.partial(local_sample, max_decode_len=max_decode_len,
                              stage_lengths=stage_lengths)
    return _on_devices(local, devices, [params, seed, temperature],
                       [inputs, max_lengths, sentence_ids])

  return sample


@functools.lru_cache(maxsize=32)
def _score_fn(model_config: TransformerConfig) -> Callable[..., Any]:
  """The jitted forced decoding (`mha.search.decoding.forced_log_probs`): the
  search's step function fed the targets; `[batch, T]` log-probabilities."""
  model = create_model(model_config, decode=True, deterministic=True)

  def local_score(params, inputs, targets):
    tokens_to_logits, cache, _ = _model_fns(model, params, inputs, 1,
                                            targets.shape[1])
    return decoding.forced_log_probs(tokens_to_logits, cache, targets,
                                     cache_rows(cache))

  @functools.partial(jax.jit, static_argnames=("devices",))
  def score(params, inputs, targets, *, devices=()):
    return _on_devices(local_score, devices, [params], [inputs, targets])

  return score


def search_devices(rows: int, devices: Sequence[jax.Device] | None = None
                   ) -> tuple[jax.Device, ...]:
  """The devices a batch of `rows` rows is split over: all of `devices`
  (default: `jax.local_devices()`) if they divide the rows evenly, else none
  (the default device)."""
  devices = tuple(jax.local_devices() if devices is None else devices)
  return devices if _splits(rows, len(devices)) else ()


def _splits(rows: int, num_devices: int) -> bool:
  """Whether a batch of `rows` rows is split over `num_devices` devices."""
  return num_devices > 1 and rows % num_devices == 0


def device_rows(rows: int, beam_size: int, num_devices: int) -> int:
  """The search rows (sentences x beam) each device takes of a batch of
  `rows` sentences among `num_devices` (`search_devices`: split evenly
  over them, else all on the default device)."""
  return rows // (num_devices if _splits(rows, num_devices) else 1) * beam_size


def _put_rows(rows: list[np.ndarray], devices: tuple[jax.Device, ...],
              axis: int = 0) -> list[jax.Array]:
  """NumPy arrays on the default device (no devices), or each device's
  rows (along `axis`) put there, all now. From NumPy, not from a jax array
  on one device: resharding that compiles a slicing program for each new
  shape (jax's `_multi_slice`), slicing on the host does not."""
  rows = [np.asarray(x) for x in rows]
  if not devices:
    # With the dtype given, jnp.asarray compiles no copy (jax's `stage`).
    return [jnp.asarray(x, x.dtype) for x in rows]
  return jax.device_put(rows, jax.sharding.NamedSharding(
      _mesh(devices), _split_spec(axis)))


class PlacedParams:
  """Parameters put on the devices once, for many calls (`mha.Translator`).

  `mha.search.texts`'s functions take these or plain parameters (replicated
  anew on each call); `on(devices)` places them on a tuple of devices (the
  default device for `()`) the first time it is asked for it.
  """

  def __init__(self, params: Any):
    self.params = params
    self._placed: dict[tuple[jax.Device, ...], Any] = {}

  def on(self, devices: tuple[jax.Device, ...]) -> Any:
    if devices not in self._placed:
      self._placed[devices] = (replicate(self.params, devices) if devices
                               else jax.device_put(self.params))
    return self._placed[devices]


def replicate(params: Any, devices: tuple[jax.Device, ...]) -> Any:
  """`params` on every one of `devices` (as the sharded search takes them);
  unchanged for fewer than two devices."""
  if len(devices) < 2:
    return params
  return jax.device_put(params, jax.sharding.NamedSharding(
      _mesh(devices), jax.sharding.PartitionSpec()))


def translate_batch(model_config: TransformerConfig, params: Any,
                    inputs: jax.Array | np.ndarray,
                    settings: SearchSettings | None = None, *, eos_id: int,
                    max_decode_len: int | None = None,
                    first_stage_extra: int | None = FIRST_STAGE_EXTRA,
                    devices: Sequence[jax.Device] | None = None,
                    num_best: int = 0, **given: Any) -> Any:
  """One batch through the Transformer's search: the best hypotheses.

  Encodes once, makes the decode cache (the encoder-decoder keys and values
  once per sentence, the self-attention cache at `batch * beam_size` rows)
  and runs the whole search (`mha.search.decoding.beam_search`, with the
  cache's `cache_rows` and the settings' `step_hook`) as one jitted
  function, cached per (config, the settings' `search_key`, eos_id) and
  compiled per input shape and `max_decode_len`. The search runs in two stages
  (`mha.search.decoding`): first with outputs and a self-attention cache of
  `inputs.shape[1] + first_stage_extra` positions, then, only if some
  sentence is not done by then, continued to `max_decode_len`; the output
  is the same as in one stage.

  Args:
    model_config: the model's `TransformerConfig` (training or eval
      variant; `decode=True, deterministic=True` are set here).
    params: the model parameters.
    inputs: int32 `[batch, s]` source tokens, 0 = pad.
    settings: the search's `SearchSettings` (None: the paper's), or its
      fields as keywords (`given`): beam_size (1 = greedy search), alpha,
      max_decode_extra (each output at most its non-pad source tokens +
      this), beam_stop, matmul_dtype, ...
    eos_id: end-of-sentence token id.
    max_decode_len: the static length of the outputs and of the cache;
      None: the longest limit rounded up to a multiple of 8. Capped at the
      model's `max_len` positions, and so are the limits.
    first_stage_extra: the first stage's room beyond the padded input
      length; None or 0: one stage of `max_decode_len`.
    devices: the devices the sentences are split over (`search_devices`:
      all of them if they divide the rows evenly, else the default device);
      None: `jax.local_devices()`. The outputs are the same on any number.
    num_best: 0 (default): the best output of each sentence; n >= 1 (at
      most beam_size): its n best hypotheses with their scores.

  Returns:
    int32 `[batch, max_decode_len]` output tokens, EOS included, 0 after it;
    with `num_best=n`, `(tokens [batch, n, max_decode_len], scores [batch,
    n], log_probs [batch, n])`, best first: the length-penalised score and
    log P(Y | X) of each hypothesis.
  """
  settings = settings_lib.resolve(settings, given)
  if not 0 <= num_best <= settings.beam_size:
    raise ValueError(f"num_best must be in 0..beam_size = "
                     f"{settings.beam_size}, got {num_best}.")
  inputs_np = np.asarray(inputs)
  static, devices, rows = _search_inputs(
      model_config, inputs_np, max_decode_extra=settings.max_decode_extra,
      max_decode_len=max_decode_len, first_stage_extra=first_stage_extra,
      devices=devices, extra_rows=())
  search = translate_fn(model_config, settings, eos_id)
  return search(replicate(params, devices), *rows, devices=devices,
                num_best=int(num_best), **static)


def translate_fn(model_config: TransformerConfig, settings: SearchSettings,
                 eos_id: int) -> Callable[..., Any]:
  """The jitted search of `translate_batch` for a model config, the
  settings (checked; their `search_key`) and the EOS id: one per key, so
  that its compiled programs serve every call with these."""
  return _translate_fn(model_config, _checked(settings).search_key(),
                       int(eos_id))


def refill_fn(model_config: TransformerConfig, settings: SearchSettings,
              eos_id: int) -> Callable[..., Any]:
  """The jitted search of `refill_batches`, as `translate_fn`."""
  return _refill_fn(model_config, _checked(settings).search_key(),
                    int(eos_id))


def _checked(settings: SearchSettings) -> SearchSettings:
  """`settings`, each checked by its rule (`mha.validation.FIELDS`), with
  ints and floats as such (a beam of 4.0 is the search of 4)."""
  for name, value in settings.as_dict().items():
    validation.check_flag(name, value)
  return settings.given(beam_size=int(settings.beam_size),
                        alpha=float(settings.alpha))


def _limits(model_config: TransformerConfig, inputs_np: np.ndarray,
            max_decode_extra: int, max_decode_len: int | None
            ) -> tuple[int, np.ndarray]:
  """(the static length of the outputs, int32 `[batch]` each sentence's
  limit on |Y|): non-pad source tokens + `max_decode_extra` (1 for a spare
  row of padding alone: every source has its EOS), capped at
  `max_decode_len` (None: the longest limit rounded up to a multiple of
  8) and at the model's `max_len` positions."""
  tokens = (inputs_np != token_ids.PAD_ID).sum(axis=1)  # [batch]
  max_lengths = np.where(tokens, tokens + max_decode_extra, 1).astype(np.int32)
  if max_decode_len is None:  # the longest, rounded up to a multiple of 8
    max_decode_len = -(-int(max_lengths.max()) // 8) * 8
  # The decoder cannot encode positions past its table (config.max_len).
  max_decode_len = min(int(max_decode_len), model_config.max_len)
  return max_decode_len, np.minimum(max_lengths, max_decode_len)


def _static(inputs_lengths: Sequence[int], max_decode_len: int,
            first_stage_extra: int | None) -> dict[str, Any]:
  """A search's static `max_decode_len` and `stage_lengths`: the first
  stages are the padded input lengths (one, or a refilled search's
  several) + `first_stage_extra`, below `max_decode_len`."""
  stages = ()
  if first_stage_extra:
    stages = tuple(min(n + int(first_stage_extra), max_decode_len)
                   for n in inputs_lengths)
  return dict(max_decode_len=max_decode_len, stage_lengths=tuple(
      all_stage_lengths(stages, max_decode_len)[:-1]))


def _search_inputs(model_config: TransformerConfig, inputs_np: np.ndarray, *,
                   max_decode_extra: int, max_decode_len: int | None,
                   first_stage_extra: int | None,
                   devices: Sequence[jax.Device] | None,
                   extra_rows: Sequence[np.ndarray]
                   ) -> tuple[dict[str, Any], tuple[jax.Device, ...], list]:
  """A batch's search arguments (`translate_batch`).

  Returns:
    `(static, devices, rows)`: the static `max_decode_len` and
    `stage_lengths`, the devices the rows are split over, and the row
    arguments `[inputs, max_lengths, *extra_rows]` put on them.
  """
  max_decode_len, max_lengths = _limits(model_config, inputs_np,
                                        max_decode_extra, max_decode_len)
  devices = search_devices(inputs_np.shape[0], devices)
  rows = _put_rows([np.asarray(inputs_np, np.int32),
                    np.asarray(max_lengths, np.int32), *extra_rows], devices)
  return (_static([inputs_np.shape[1]], max_decode_len, first_stage_extra),
          devices, rows)


def sample_batch(model_config: TransformerConfig, params: Any,
                 inputs: jax.Array | np.ndarray, sentence_ids: np.ndarray, *,
                 temperature: float, top_k: int, seed: int,
                 max_decode_extra: int, eos_id: int,
                 max_decode_len: int | None = None,
                 first_stage_extra: int | None = FIRST_STAGE_EXTRA,
                 devices: Sequence[jax.Device] | None = None
                 ) -> tuple[jax.Array, jax.Array]:
  """One batch of sampled outputs (`mha.search.decoding.sample`).

  Args:
    model_config, params, inputs, max_decode_extra, eos_id, max_decode_len,
      first_stage_extra, devices: as in `translate_batch`.
    sentence_ids: int `[batch]`: row b draws with the key `fold_in(key(seed),
      sentence_ids[b])`, so its sample depends on the seed and this id
      alone.
    temperature: >= 0 (0: greedy search).
    top_k: draw from the k most probable tokens; 0 = all.
    seed: the sampler's seed, an int32.

  Returns:
    `(tokens [batch, max_decode_len], log_probs [batch])`: the outputs (EOS
    included, 0 after it) and the model's log P(Y | X) of each.
  """
  static, devices, rows = _search_inputs(
      model_config, np.asarray(inputs), max_decode_extra=max_decode_extra,
      max_decode_len=max_decode_len, first_stage_extra=first_stage_extra,
      devices=devices,
      extra_rows=[np.asarray(sentence_ids, np.int32)])
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}.")
  fn = _sample_fn(model_config, int(eos_id), temperature == 0, int(top_k))
  # NumPy scalars: a jnp scalar made of a Python one is an operation
  # compiled in every process.
  return fn(replicate(params, devices), np.int32(seed),
            np.float32(temperature), *rows, devices=devices, **static)


def score_batch(model_config: TransformerConfig, params: Any,
                inputs: jax.Array | np.ndarray,
                targets: jax.Array | np.ndarray,
                devices: Sequence[jax.Device] | None = None) -> jax.Array:
  """Forced decoding of one batch: log P(y_t | X, y_<t) of each target token.

  Args:
    model_config, params, inputs: as in `translate_batch`.
    targets: int32 `[batch, T]` outputs (EOS included), 0 after the end;
      T <= the model's `max_len`.
    devices: as in `translate_batch`.

  Returns:
    float32 `[batch, T]`, 0 after each target's end.
  """
  inputs_np, targets_np = np.asarray(inputs), np.asarray(targets)
  if targets_np.shape[1] > model_config.max_len:
    raise ValueError(f"Targets of {targets_np.shape[1]} positions: the model "
                     f"has max_len={model_config.max_len}.")
  devices = search_devices(inputs_np.shape[0], devices)
  rows = _put_rows([np.asarray(inputs_np, np.int32),
                    np.asarray(targets_np, np.int32)], devices)
  return _score_fn(model_config)(replicate(params, devices), *rows,
                                 devices=devices)


def refill_batches(model_config: TransformerConfig, params: Any,
                   inputs: Sequence[np.ndarray],
                   max_decode_lens: Sequence[int],
                   settings: SearchSettings | None = None, *, eos_id: int,
                   first_stage_extra: int | None,
                   devices: Sequence[jax.Device] = (),
                   **given: Any) -> jax.Array:
  """The search of several batches (`inputs[i]`, int32 `[rows_i, s_i]`,
  with outputs of `max_decode_lens[i]`) as one search whose slots, as
  their sentences end, take the next ones (`_refill_fn`), on the default
  device, or with each batch's rows split evenly over two or more
  `devices` (`params` placed on them, `PlacedParams.on`), each device
  searching its share of every batch. Returns the outputs, `[sum of
  rows_i, the longest max_decode_len]`, in the devices' order:
  `refilled_outputs` gives each batch's, as `translate_batch` gives them.

  The sources of the batches' several lengths are padded to the longest
  (`_refill_queue`). The stages are a ladder of rooms, each batch's
  padded source length + `first_stage_extra` (greedy search: the longest
  alone) and the output length: each
  step runs in the shortest that holds every busy slot's position
  (`refill.beam_refill`), so that the short sentences' steps, the most,
  read, write and copy the cache of a short room. The arguments are put
  together on the host and `refilled_outputs` cuts the outputs there, so
  that no small operation is compiled around the search (each would be
  compiled again in every process: bench/README.md, issue 33).
  `settings`, `given`: as in `translate_batch`."""
  settings = settings_lib.resolve(settings, given)
  max_decode_extra = settings.max_decode_extra
  devices = tuple(devices) if len(devices) > 1 else ()
  rows = [x.shape[0] for x in inputs]
  if any(n % max(len(devices), 1) for n in rows):
    raise ValueError(f"Batches of {rows} rows cannot be split evenly over "
                     f"{len(devices)} devices.")
  longest = max(range(len(inputs)),
                key=lambda i: (inputs[i].shape[1], max_decode_lens[i]))
  limits = [_limits(model_config, x, max_decode_extra, n)[1]
            for x, n in zip(inputs, max_decode_lens)]
  max_decode_len = _limits(model_config, inputs[longest], max_decode_extra,
                           max(max_decode_lens))[0]
  stacked: list[list[np.ndarray]] = []  # [k, rows, s] for each run of
  for x in inputs:                      # batches of one length s
    if stacked and stacked[-1][0].shape == x.shape:
      stacked[-1].append(x)
    else:
      stacked.append([x])
  # The ladder's rungs (`_static`): each batch's first stage for beam
  # search; the longest alone for greedy search, whose lower rungs (each
  # one more compiled decoder step) saved no time (bench/README.md).
  rungs = [x.shape[1] for x in inputs]
  rungs = rungs if settings.beam_size > 1 else [max(rungs)]
  order = _device_major(rows, max(len(devices), 1))
  sources = _put_rows([np.stack(x).astype(np.int32) for x in stacked],
                      devices, axis=1)
  [max_lengths] = _put_rows(
      [np.concatenate(limits)[order].astype(np.int32)], devices)
  return refill_fn(model_config, settings, eos_id)(
      params, tuple(sources), max_lengths, devices=devices,
      **_static(rungs, max_decode_len, first_stage_extra))


def _device_major(rows: Sequence[int], num_devices: int) -> np.ndarray:
  """The order of a sharded refilled search's sentences (`refill_batches`
  on `num_devices` devices): device 0's share of every batch (the first
  `rows_i / num_devices` rows of batch i), then device 1's, ...; as
  indices of the sentences in the batches' order."""
  starts = np.cumsum([0] + list(rows[:-1]))
  return np.concatenate([
      start + d * (n // num_devices) + np.arange(n // num_devices)
      for d in range(num_devices) for start, n in zip(starts, rows)])


def refilled_outputs(outputs: jax.Array, rows: Sequence[int],
                     max_decode_lens: Sequence[int], num_devices: int
                     ) -> list[np.ndarray]:
  """Each batch's outputs of `refill_batches` (of batches of `rows`,
  `max_decode_lens` and searched on `num_devices` devices, 0 or 1: the
  default device) as NumPy, `[rows_i, max_decode_lens[i]]`: put back in the
  batches' order and cut on the host."""
  outputs = np.asarray(outputs)
  found = np.empty_like(outputs)
  found[_device_major(rows, max(num_devices, 1))] = outputs
  ends = np.cumsum(rows)
  return [found[end - n:end, :length]
          for n, length, end in zip(rows, max_decode_lens, ends)]


__all__ = ["CACHE_ROWS", "FIRST_STAGE_EXTRA", "MIN_SEARCH_ROWS",
           "PlacedParams", "cache_rows", "device_rows", "refill_batches",
           "refilled_outputs", "replicate", "sample_batch", "score_batch",
           "search_devices", "shrink_sizes", "translate_batch"]
