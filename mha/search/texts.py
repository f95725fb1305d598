"""Text to text: the one translation path of every caller.

    from mha.search import texts as translate
    translations = translate.translate_texts(
        model_config, params, tokenizer, ["Ein Hund läuft."],
        mha.SearchSettings(beam_size=4, alpha=0.6, max_decode_extra=50))

text -> source ids (`encode_sources`: EOS appended, truncated to the model's
`max_len` positions) -> length-bucketed batches (`make_batches`) -> search
(`decode_batches`, through `mha.search.batches`: the Transformer's step
function and cache handed to `mha.search.decoding`'s model-agnostic search, on
this process's devices) -> output ids -> text. The evaluator (`eval.py`),
the trainer's in-training BLEU, the attention maps, `bench/decode.py` and
`mha.load`'s `Translator` all translate through this module.

Beside the best translation: the n best hypotheses of the beam with their
scores (`nbest_ids`), samples (`sample_ids`: a key per sentence, so that a
sample depends on the seed and the sentence's id alone) and the model's
log-probability of given targets (`score_ids`), on the same batches and
devices.

Every output is at most its source's tokens (EOS included) +
`max_decode_extra` tokens long, capped at the model's `max_len` (the paper's
§6.1: input length + 50).

Batching sorts the sentences by length (longest first), cuts them into
batches of `batch_size`, pads each batch's sources to one of a few bucket
lengths (`LENGTH_BUCKETS`) and its rows to a multiple of `ROW_MULTIPLE` (a
power of two below it: `search_rows`; the last of several batches to a
full one's, to share their program), decodes with a cache of bucket
length + `max_decode_extra` positions, and puts the outputs back in the
input order. A split therefore compiles the search a handful of times, and
repeated calls on the same sentences (BLEU during training) reuse the
compiled search.

Several batches (`decode_batches`, the best output of each sentence) are
searched as one where their rows allow it (`_refill_groups`,
`batch_search.refill_batches`): as a sentence is done, its rows (its slot
of beam_size rows) take the next batches' sentences, so that the rows stay
busy; the outputs are those of each batch's own search.

Devices: each batch's sentences are split evenly over this process's
devices (`jax.local_devices()`, or the `devices` given;
`batch_search.search_devices`); in a refilled search, each device searches
its share of every batch of the group, its slots taking its next
sentences. The translations are the same on any number of devices.
Translation is per process: with several processes, each translates the
sentences it is given.
"""
import dataclasses
import time
import unicodedata
from typing import Any, Callable, Sequence

from absl import logging
import jax
import numpy as np

from mha.search import batches as batch_search
from mha.search import settings as settings_lib
from mha.search.settings import SearchSettings
from mha.runtime import compile_time
from mha import data
from mha.data.batching import round_up
from mha.model.transformer import TransformerConfig


# Padded source lengths. Few sizes = few compilations of the search; the
# decode cache is bucket + max_decode_extra long whatever the batch holds.
# Coarser than the training grid (`mha.data.batching.length_grid`, ratio
# 1.25) on purpose: training compiles its step once per bucket and then
# pays for padding on every step of a long run, while a translation run
# compiles the whole search (encoder, decoder step, beam loop) per shape for
# a few batches, so here fewer shapes (ratio ~1.5) are worth a little more
# padding. Both are multiples of 8.
LENGTH_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
ROW_MULTIPLE = 8
# At most this many consecutive batches share one search with refilled
# rows (`_refill_groups`; one compilation per number of batches).
MAX_REFILL_BATCHES = 16
# Sentences per decoding batch on each accelerator when no batch size is
# given (`batch_size_for`): a batch's sentences are split evenly over the
# devices, and batches are searched as one with refilled rows only with
# `batch_search.MIN_SEARCH_ROWS` rows or more on each device
# (`_refill_groups`), which 64 sentences a device give greedy and beam
# search alike. CPU devices are the cores of one host
# (`mha.runtime.cpu_devices`): they share this many sentences, or more where a
# device would have fewer than `MIN_SEARCH_ROWS` rows.
BATCH_SIZE_PER_DEVICE = 64


def batch_size_for(batch_size: int | None,
                   devices: Sequence[jax.Device] | None = None,
                   beam_size: int = 1) -> int:
  """`batch_size`, or for None the default for searches of `beam_size`
  rows a sentence on `devices` (default `jax.local_devices()`):

  * accelerators: `BATCH_SIZE_PER_DEVICE` sentences for each, 512 on 8;
  * CPU devices (the cores of one host, `mha.runtime.cpu_devices`):
    `BATCH_SIZE_PER_DEVICE` sentences in all, or more where a device would
    have fewer than `batch_search.MIN_SEARCH_ROWS` rows (greedy search on
    2 devices: 128), as many for each device: the fastest batches of both
    searches measured on 2 cores (bench/README.md, issue 33).
  """
  if batch_size is not None:
    return batch_size
  devices = tuple(jax.local_devices() if devices is None else devices)
  if not all(d.platform == "cpu" for d in devices):
    return BATCH_SIZE_PER_DEVICE * len(devices)
  each = max(-(-BATCH_SIZE_PER_DEVICE // len(devices)),
             -(-batch_search.MIN_SEARCH_ROWS // beam_size))
  return each * len(devices)


# ------------------------------------------------------------ text batches

@dataclasses.dataclass(frozen=True)
class DecodeBatch:
  """Sentences decoded together.

  Attributes:
    indices: int `[n]` positions of the batch's sentences in the input list.
    inputs: int32 `[rows, length]` source ids with EOS, 0 = padding; rows
      past `n` are all padding.
    max_decode_len: the length of the outputs and of the decode cache,
      `length + max_decode_extra` capped at the model's `max_len`, whatever
      the longest sentence of the batch (one compilation per bucket).
  """
  indices: np.ndarray
  inputs: np.ndarray
  max_decode_len: int

  @property
  def shape_key(self) -> tuple[int, int]:
    """Batches with equal keys share one compiled search."""
    return self.inputs.shape


def bucket_length(n: int, max_len: int) -> int:
  """The smallest bucket >= n (multiples of 256 past the last), <= max_len."""
  for b in LENGTH_BUCKETS:
    if b >= n:
      return min(b, max_len)
  return min(-(-n // 256) * 256, max_len)


def encode_sources(tokenizer: data.Tokenizer, sources: Sequence[str],
                   max_len: int) -> list[list[int]]:
  """Source ids with EOS; sentences longer than `max_len` are truncated.

  Truncation (the model cannot encode more positions) is logged as a warning
  naming the first affected lines (1-based); it never raises.
  """
  encoded = tokenizer.encode_batch(list(sources))
  too_long = [i for i, ids in enumerate(encoded) if len(ids) + 1 > max_len]
  if too_long:
    logging.warning(
        "%d source sentence(s) have more than max_len - 1 = %d tokens and "
        "were truncated (lines %s%s).", len(too_long), max_len - 1,
        ", ".join(str(i + 1) for i in too_long[:10]),
        ", ..." if len(too_long) > 10 else "")
  return [list(ids[:max_len - 1]) + [data.EOS_ID] for ids in encoded]


def search_rows(n: int) -> int:
  """The rows of a batch of n sentences: n rounded up to a power of two
  below `ROW_MULTIPLE` (1, 2, 4, 8), to a multiple of `ROW_MULTIPLE` above.
  Few batch shapes (compilations), and a lone sentence (standard input) is
  one search, not eight."""
  if n >= ROW_MULTIPLE:
    return round_up(n, ROW_MULTIPLE)
  return 1 << max(n - 1, 0).bit_length()


def make_batches(encoded: Sequence[Sequence[int]], *, batch_size: int,
                 max_len: int, max_decode_extra: int) -> list[DecodeBatch]:
  """Length-sorted, bucket-padded batches covering every sentence once.

  Args:
    encoded: source ids of each sentence (EOS included, at most max_len).
    batch_size: sentences per batch.
    max_len: the model's number of positions.
    max_decode_extra: output limit = source length + this.

  Returns:
    Batches, longest sentences first.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  longest = max((len(ids) for ids in encoded), default=0)
  if longest > max_len:
    raise ValueError(f"A sentence has {longest} ids, more than max_len="
                     f"{max_len}: encode it with encode_sources.")
  order = np.argsort([-len(ids) for ids in encoded], kind="stable")
  # With several batches the last has a full one's rows (its spare rows
  # empty), so that it shares the others' search program.
  rows = min(search_rows(min(len(order), batch_size)), batch_size)
  batches = []
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    length = bucket_length(max(len(encoded[i]) for i in chunk), max_len)
    inputs = np.zeros((rows, length), np.int32)  # [rows, length]
    for row, i in enumerate(chunk):
      inputs[row, :len(encoded[i])] = encoded[i]
    batches.append(DecodeBatch(chunk, inputs,
                               min(length + max_decode_extra, max_len)))
  return batches


def decode_batches(model_config: TransformerConfig, params: Any,
                   batches: Sequence[DecodeBatch],
                   settings: SearchSettings | None = None, *,
                   eos_id: int = data.EOS_ID,
                   first_stage_extra: int | None = (
                       batch_search.FIRST_STAGE_EXTRA),
                   devices: Sequence[jax.Device] | None = None,
                   num_best: int = 0, **given: Any) -> list[Any]:
  """Output ids of each batch (`[rows, max_decode_len]`, EOS included);
  with `num_best=n`, `(tokens, scores, log_probs)` of its n best
  (`translate_batch`).

  All batches are dispatched before the first result is fetched, so the host
  work overlaps with the device's. Each batch's sentences are split over
  `devices` (default: `jax.local_devices()`; `search_devices`), the
  parameters replicated to them once. `eos_id=-1` disables early ends (every
  output runs to its length limit: decoding benchmarks of random models).
  `first_stage_extra`: as in `translate_batch` (None: one stage). Without
  `num_best`, consecutive batches are searched as one with refilled rows
  where `_refill_groups` allows it (the same outputs). `settings`,
  `given`: the search's (`translate_batch`).
  """
  settings = settings_lib.resolve(settings, given)

  def run(batch, params, used):
    return batch_search.translate_batch(
        model_config, params, batch.inputs, settings, eos_id=eos_id,
        max_decode_len=batch.max_decode_len,
        first_stage_extra=first_stage_extra, devices=used, num_best=num_best)

  if num_best:
    return _run_batches(params, batches, devices, run)

  def refill(group, params, used):
    return batch_search.refill_batches(
        model_config, params, [b.inputs for b in group],
        [b.max_decode_len for b in group], settings, eos_id=eos_id,
        first_stage_extra=first_stage_extra, devices=used)

  return _run_refilled(params, batches, devices, run, refill,
                       settings.beam_size)


def _refill_groups(batches: Sequence[DecodeBatch],
                   devices: tuple[jax.Device, ...],
                   beam_size: int = 1) -> list[list[int]]:
  """The batches (their indices) searched together by
  `batch_search.refill_batches`:
  runs of consecutive batches, at most `MAX_REFILL_BATCHES` each, split
  over the same devices (`batch_search.search_devices`: all of them, or
  the default device) with at least `MIN_SEARCH_ROWS` rows (sentences x
  beam) on each device (fewer may give a row other bits in another row);
  every other batch alone. The group's search has the first batch's number
  of sentences at a time (on each device, its share), and for greedy and
  beam search alike takes batches of any source length: its steps run in
  the smallest room of a ladder (the batches' source lengths +
  `FIRST_STAGE_EXTRA`; greedy search: the longest's) that holds every busy
  slot, going up and down (`batch_search.
  refill_batches`; beam search once grouped by source length, when each
  step reordered the whole cache: one group compiles once where one per
  length compiled each, bench/README.md, issue 33's fifth round)."""
  def placed(b):  # the devices of the batch's search and its rows on each
    return (batch_search.search_devices(b.inputs.shape[0], devices),
            batch_search.device_rows(b.inputs.shape[0], beam_size,
                                     len(devices)))

  groups: list[list[int]] = []
  for i, batch in enumerate(batches):
    last = groups[-1] if groups else []
    if last and len(last) < MAX_REFILL_BATCHES:
      (used, rows), (first_used, first_rows) = (placed(batch),
                                                placed(batches[last[0]]))
      if (used == first_used
          and min(rows, first_rows) >= batch_search.MIN_SEARCH_ROWS):
        last.append(i)
        continue
    groups.append([i])
  return groups


def _placed(params: Any, devices: Sequence[jax.Device] | None
            ) -> tuple[tuple[jax.Device, ...], batch_search.PlacedParams]:
  """(the devices, default `jax.local_devices()`; `params` as a
  `PlacedParams`, kept if given as one)."""
  devices = tuple(jax.local_devices() if devices is None else devices)
  return devices, (params if isinstance(params, batch_search.PlacedParams)
                   else batch_search.PlacedParams(params))


def _run_refilled(params: Any, batches: Sequence[DecodeBatch],
                  devices: Sequence[jax.Device] | None,
                  run: Callable[[DecodeBatch, Any, tuple[jax.Device, ...]],
                                Any],
                  refill: Callable[[list[DecodeBatch], Any,
                                    tuple[jax.Device, ...]], jax.Array],
                  beam_size: int) -> list[np.ndarray]:
  """`_run_batches`' outputs, with each group of `_refill_groups` of two
  or more batches searched by `refill(batches, params, devices)` as one
  (`batch_search.refill_batches`, each batch's outputs cut from the
  search's by `batch_search.refilled_outputs`); all dispatched before the
  first result is fetched."""
  devices, placed = _placed(params, devices)
  groups = _refill_groups(batches, devices, beam_size)
  outputs = []
  for group in groups:
    used = batch_search.search_devices(batches[group[0]].inputs.shape[0],
                                       devices)
    if len(group) == 1:
      outputs.append((run(batches[group[0]], placed.on(used), used), used))
    else:
      outputs.append((refill([batches[i] for i in group], placed.on(used),
                             used), used))
  found = []
  for group, (output, used) in zip(groups, outputs):
    if len(group) == 1:
      found.append(np.asarray(output))
    else:
      found += batch_search.refilled_outputs(
          output, [batches[i].inputs.shape[0] for i in group],
          [batches[i].max_decode_len for i in group], len(used))
  return found


def _run_batches(params: Any, batches: Sequence[DecodeBatch],
                 devices: Sequence[jax.Device] | None,
                 run: Callable[[DecodeBatch, Any, tuple[jax.Device, ...]],
                               Any]) -> list[Any]:
  """`run(batch, params on its devices, devices)` for every batch, as NumPy.

  All batches are dispatched before the first result is fetched. Each
  batch's sentences are split over `devices` (default:
  `jax.local_devices()`; `search_devices`), the parameters placed on them
  once (`PlacedParams`, kept for later calls if given as one).
  """
  devices, placed = _placed(params, devices)
  outputs = [run(batch, placed.on(used), used) for batch in batches
             for used in [batch_search.search_devices(batch.inputs.shape[0],
                                                      devices)]]
  return [jax.tree.map(np.asarray, o) for o in outputs]


def translate_ids(model_config: TransformerConfig, params: Any,
                  tokenizer: data.Tokenizer, sources: Sequence[str],
                  settings: SearchSettings | None = None, *,
                  batch_size: int | None = None,
                  devices: Sequence[jax.Device] | None = None, **given: Any
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
  """(source ids, output ids) of each source, in the order of `sources`.

  Args:
    model_config: the model's `TransformerConfig` (eval variant or not).
    params: its parameters.
    tokenizer: the workdir's vocabulary.
    sources: plain sentences (an empty one gets a translation too).
    settings: the search's `SearchSettings` (None: the paper's: beam 4,
      alpha 0.6, outputs up to source tokens, EOS included, + 50, capped
      at the model's `max_len`), or its fields as keywords (`given`).
    batch_size: sentences per decoding batch; None: `batch_size_for`'s
      (64 for each accelerator).
    devices: the devices each batch is split over (`decode_batches`;
      default: `jax.local_devices()`).

  Returns:
    Per source: int32 `[s]` source ids as encoded (EOS included, truncated
    to `max_len`) and int32 `[max_decode_len]` output ids of its batch's
    search (EOS included, 0 after the end).
  """
  if not sources:
    return []
  settings = settings_lib.resolve(settings, given)
  encoded, batches = _batches(model_config, tokenizer, sources, batch_size,
                              settings.max_decode_extra, devices,
                              settings.beam_size)
  outputs = decode_batches(model_config, params, batches, settings,
                           devices=devices)
  pairs: list[Any] = [None] * len(sources)
  for batch, tokens in zip(batches, outputs):  # tokens [rows, len]
    for row, i in enumerate(batch.indices):
      pairs[i] = (np.asarray(encoded[i], np.int32), tokens[row])
  return pairs


def crop_output(ids: Sequence[int]) -> np.ndarray:
  """Output ids up to and including the first EOS (or the padding)."""
  ids = np.asarray(ids, np.int32).reshape(-1)
  end = np.flatnonzero((ids == data.EOS_ID) | (ids == data.PAD_ID))
  if not end.size:
    return ids
  return ids[:end[0] + 1] if ids[end[0]] == data.EOS_ID else ids[:end[0]]


def _batches(model_config: TransformerConfig, tokenizer: data.Tokenizer,
             sources: Sequence[str], batch_size: int | None,
             max_decode_extra: int,
             devices: Sequence[jax.Device] | None, beam_size: int = 1
             ) -> tuple[list[list[int]], list[DecodeBatch]]:
  """(source ids, batches) of `sources` (`encode_sources`, `make_batches`;
  `batch_size_for(batch_size, devices, beam_size)` sentences a batch)."""
  encoded = encode_sources(tokenizer, sources, model_config.max_len)
  return encoded, make_batches(encoded,
                               batch_size=batch_size_for(batch_size, devices,
                                                         beam_size),
                               max_len=model_config.max_len,
                               max_decode_extra=max_decode_extra)


def nbest_ids(model_config: TransformerConfig, params: Any,
              tokenizer: data.Tokenizer, sources: Sequence[str],
              settings: SearchSettings | None = None, *, num_best: int,
              batch_size: int | None = None,
              devices: Sequence[jax.Device] | None = None, **given: Any
              ) -> list[list[tuple[np.ndarray, float, float]]]:
  """The `num_best` best hypotheses of each source, by the beam search.

  Args:
    num_best: hypotheses per source, 1..beam_size.
    model_config, params, tokenizer, sources, settings, batch_size,
      devices, given: as in `translate_ids`.

  Returns:
    Per source, best first: (output ids up to and including EOS, the
    length-penalised score log P(Y | X) / lp(|Y|), log P(Y | X)). The first
    one's ids are `translate_ids`' output. A source with fewer complete
    hypotheses than `num_best` (a tiny vocabulary and length limit) has
    fewer.
  """
  if not sources:
    return []
  settings = settings_lib.resolve(settings, given)
  _, batches = _batches(model_config, tokenizer, sources, batch_size,
                        settings.max_decode_extra, devices,
                        settings.beam_size)
  outputs = decode_batches(model_config, params, batches, settings,
                           devices=devices, num_best=num_best)
  found: list[Any] = [None] * len(sources)
  for batch, (tokens, scores, log_probs) in zip(batches, outputs):
    for row, i in enumerate(batch.indices):
      found[i] = [(crop_output(tokens[row, k]), float(scores[row, k]),
                   float(log_probs[row, k])) for k in range(num_best)
                  if scores[row, k] > -np.inf]
  return found


def sample_ids(model_config: TransformerConfig, params: Any,
               tokenizer: data.Tokenizer, sources: Sequence[str], *,
               temperature: float, top_k: int, seed: int,
               max_decode_extra: int,
               sentence_ids: Sequence[int] | None = None,
               batch_size: int | None = None,
               devices: Sequence[jax.Device] | None = None
               ) -> list[tuple[np.ndarray, float]]:
  """A sampled output of each source (`mha.search.decoding.sample`).

  Source i draws with the key `fold_in(key(seed), sentence_ids[i])`
  (default: i): its sample depends on the seed and that id alone, not on
  the batching or the devices, so a corpus sampled in pieces (each
  sentence's id its position in the corpus) equals the corpus sampled at
  once.

  Args:
    temperature: >= 0 (0: greedy search); top_k: 0 = every token.
    seed: an int32.
    sentence_ids: one int per source (default: its position).
    model_config, params, tokenizer, sources, max_decode_extra, batch_size,
      devices: as in `translate_ids`.

  Returns:
    Per source: (output ids up to and including EOS, the model's log P(Y |
    X) of them).
  """
  if not sources:
    return []
  _, batches = _batches(model_config, tokenizer, sources, batch_size,
                        max_decode_extra, devices)

  if sentence_ids is None:
    sentence_ids = range(len(sources))
  sentence_ids = np.asarray(sentence_ids, np.int64)
  if sentence_ids.shape != (len(sources),):
    raise ValueError(f"{len(sentence_ids)} sentence_ids for {len(sources)} "
                     "sources.")

  def run(batch, params, used):
    ids = np.zeros(batch.inputs.shape[0], np.int64)
    ids[:len(batch.indices)] = sentence_ids[batch.indices]
    return batch_search.sample_batch(
        model_config, params, batch.inputs, ids, temperature=temperature,
        top_k=top_k, seed=seed, max_decode_extra=max_decode_extra,
        eos_id=data.EOS_ID, max_decode_len=batch.max_decode_len,
        devices=used)

  found: list[Any] = [None] * len(sources)
  for batch, (tokens, log_probs) in zip(
      batches, _run_batches(params, batches, devices, run)):
    for row, i in enumerate(batch.indices):
      found[i] = (crop_output(tokens[row]), float(log_probs[row]))
  return found


def score_ids(model_config: TransformerConfig, params: Any,
              tokenizer: data.Tokenizer, sources: Sequence[str],
              targets: Sequence[str], *, batch_size: int | None = None,
              devices: Sequence[jax.Device] | None = None
              ) -> list[tuple[np.ndarray, np.ndarray]]:
  """Forced decoding: the model's log-probability of each given target.

  Args:
    sources, targets: plain sentences, as many targets as sources.
    model_config, params, tokenizer, batch_size, devices: as in
      `translate_ids`.

  Returns:
    Per pair: (target ids with EOS, float32 log P(y_t | X, y_<t) of each);
    the sum is log P(Y | X).

  Raises:
    ValueError: not as many targets as sources.
    DataError: a target longer than the model's `max_len` - 1 tokens.
  """
  if len(sources) != len(targets):
    raise ValueError(f"{len(sources)} sources but {len(targets)} targets.")
  if not sources:
    return []
  target_ids = [ids + [data.EOS_ID] for ids in
                tokenizer.encode_batch(list(targets), side="target")]
  too_long = [i for i, ids in enumerate(target_ids)
              if len(ids) > model_config.max_len]
  if too_long:
    raise data.DataError(
        f"Target {too_long[0] + 1} has {len(target_ids[too_long[0]]) - 1} "
        f"tokens, more than the model's max_len - 1 = "
        f"{model_config.max_len - 1}: it cannot be scored.")
  _, batches = _batches(model_config, tokenizer, sources, batch_size, 0,
                        devices)

  def run(batch, params, used):
    longest = max(len(target_ids[i]) for i in batch.indices)
    rows = np.zeros((batch.inputs.shape[0],
                     bucket_length(longest, model_config.max_len)), np.int32)
    for row, i in enumerate(batch.indices):
      rows[row, :len(target_ids[i])] = target_ids[i]
    return batch_search.score_batch(model_config, params, batch.inputs, rows,
                                    used)

  found: list[Any] = [None] * len(sources)
  for batch, log_probs in zip(batches,
                              _run_batches(params, batches, devices, run)):
    for row, i in enumerate(batch.indices):
      ids = np.asarray(target_ids[i], np.int32)
      found[i] = (ids, log_probs[row, :ids.size])
  return found


def is_blank(sentence: str) -> bool:
  """Nothing to translate: white space and invisible format characters
  only (Unicode category Cf: zero-width spaces and joiners, U+FEFF), which
  the vocabulary encodes to no pieces. Its translation is empty, as a
  blank line's (the model would otherwise translate the end of sentence
  alone into a sentence of its own)."""
  return all(c.isspace() or unicodedata.category(c) == "Cf"
             for c in sentence)


def detokenize(tokenizer: data.Tokenizer, ids: Sequence[int]) -> str:
  """The text of output ids, on one line (newlines become spaces)."""
  text = tokenizer.decode(ids)
  # One line per sentence in translations.txt and on standard output.
  return text.replace("\r", " ").replace("\n", " ")


@dataclasses.dataclass(frozen=True)
class Translations:
  """What one search made of a list of sources, in their order.

  Attributes:
    texts: one detokenized translation per source, without newlines ("" for
      a blank source: empty or white space only, not translated).
    source_ids: per source, the int32 ids searched from (`encode_sources`:
      EOS included, truncated to `max_len`); None for a blank source.
    output_ids: per source, the int32 output ids up to and including its
      EOS (`crop_output`); None for a blank source.
    seconds: the time the search and the detokenization took, compilation
      included.
    compile_seconds: of `seconds`, the time spent preparing the searches:
      tracing, compiling (or fetching from the compilation cache), reading
      kept searches (`mha.runtime.compile_time`); 0 when every search of these
      shapes was prepared before in this process.
  """
  texts: list[str]
  source_ids: list[np.ndarray | None]
  output_ids: list[np.ndarray | None]
  seconds: float
  compile_seconds: float = 0.0


def translate_with_ids(model_config: TransformerConfig, params: Any,
                       tokenizer: data.Tokenizer, sources: Sequence[str],
                       settings: SearchSettings | None = None, *,
                       batch_size: int | None = None,
                       devices: Sequence[jax.Device] | None = None,
                       **given: Any) -> Translations:
  """The translations of `sources` with the ids they were made of.

  Args:
    model_config, params, tokenizer, sources, settings, batch_size,
      devices, given: as in `translate_ids`.
  """
  start = time.perf_counter()
  keep = [i for i, s in enumerate(sources) if not is_blank(s)]
  texts = [""] * len(sources)
  source_ids: list[np.ndarray | None] = [None] * len(sources)
  output_ids: list[np.ndarray | None] = [None] * len(sources)
  with compile_time.CompileTime() as preparing:
    pairs = translate_ids(
        model_config, params, tokenizer, [sources[i] for i in keep],
        settings, batch_size=batch_size, devices=devices, **given)
  for i, (source, output) in zip(keep, pairs):
    texts[i] = detokenize(tokenizer, output)
    source_ids[i], output_ids[i] = source, crop_output(output)
  return Translations(texts, source_ids, output_ids,
                      time.perf_counter() - start, preparing.seconds)


def translate_texts(model_config: TransformerConfig, params: Any,
                    tokenizer: data.Tokenizer, sources: Sequence[str],
                    settings: SearchSettings | None = None, *,
                    batch_size: int | None = None,
                    devices: Sequence[jax.Device] | None = None,
                    **given: Any) -> list[str]:
  """Detokenized translations of `sources`, in their order: the `texts` of
  `translate_with_ids` (one per source, "" for a blank one)."""
  return translate_with_ids(
      model_config, params, tokenizer, sources, settings,
      batch_size=batch_size, devices=devices, **given).texts


__all__ = ["DecodeBatch", "LENGTH_BUCKETS", "MAX_REFILL_BATCHES",
           "ROW_MULTIPLE", "Translations", "bucket_length", "crop_output",
           "decode_batches", "detokenize", "encode_sources", "make_batches",
           "nbest_ids", "sample_ids", "score_ids", "search_rows",
           "translate_ids", "translate_texts", "translate_with_ids"]
