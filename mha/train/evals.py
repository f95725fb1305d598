"""Evaluation during training: plug-ins that the loop runs when they are due.

Each plug-in is an object with `due(step) -> bool` and `__call__(params) ->
metrics`, `params` replicated over the local devices (`devices.
pmap_replicate`); the loop (`mha.train.trainer`) imports none of them: the
set-up builds the list the config asks for (`from_config`) and hands it over. At
every `config.eval_every_steps`-th step and the last:

* `DevLoss`: the loss, NLL, perplexity and accuracy on `config.eval_split`;
* `BeamBleu`: the metrics of `mha.scoring.metric_table` marked
  `in_training` (BLEU and chrF: `eval_bleu`, `eval_chrf`) of the config's
  beam search on the first `config.eval_bleu_sentences` pairs of that
  split (none if 0), in the batches `bleu_batch_size` chooses, so that one
  search is compiled.
"""

import jax
import ml_collections
import numpy as np

from mha.search import batches as batch_search
from mha import data
from mha.train import devices
from mha.scoring import metric_table
from mha.search import texts as translate
from mha.data.batching import ceil_div
from mha.search.settings import SearchSettings
from mha.train.step import make_eval_step
from mha.model.transformer import Transformer
from mha.model.transformer import TransformerConfig
from mha.model.transformer import create_model


def from_config(config: ml_collections.ConfigDict, tokenizer,
                eval_model: Transformer) -> list:
  """The evaluations `config` asks for, in the order their metrics are
  written: the dev loss, then BLEU if `config.eval_bleu_sentences` > 0."""
  evaluations = [DevLoss(config, tokenizer, eval_model)]
  if config.eval_bleu_sentences > 0:
    evaluations.append(BeamBleu(config, tokenizer, eval_model.config))
  return evaluations


class _EveryEvalSteps:
  """Due at every `config.eval_every_steps`-th step and at the last."""
  _config: ml_collections.ConfigDict

  def due(self, step: int) -> bool:
    return (step % self._config.eval_every_steps == 0 or
            step == self._config.num_train_steps)


class DevLoss(_EveryEvalSteps):
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
    model = model or create_model(config, deterministic=True)
    self._eval_step = jax.pmap(make_eval_step(model, config),
                               axis_name=devices.AXIS)
    self._batches = None

  def __call__(self, params) -> dict[str, float]:
    """The metrics for `params` replicated over the local devices."""
    if self._batches is None:
      self._batches = data.eval_batches(self._config, self._tokenizer,
                                        self._config.eval_split)
    num_devices = jax.local_device_count()
    totals: dict[str, float] = {}
    # Each batch's sums are read before the next batch is dispatched. The
    # batches are independent, so dispatched all at once they run at once,
    # and on CPU devices (one thread pool for all of them) the eval step's
    # all-reduce could then wait forever for a device whose thread is busy
    # with another batch: XLA aborts after 40 s ("Termination timeout for
    # all reduce", seen with configs/quickstart.py:tiny on 4 CPU devices
    # and 2 cores). The train loop's updates depend on each other and run
    # one after another whatever is dispatched.
    for batch in self._batches:
      sums = devices.pmap_unreplicate(
          self._eval_step(params, devices.shard(batch, num_devices)))
      for k, v in sums.items():
        totals[k] = totals.get(k, 0.0) + float(v)
    tokens = max(totals.get("tokens", 0.0), 1.0)
    return {"eval_loss": totals["loss"] / tokens,
            "eval_nll": totals["nll"] / tokens,
            "eval_perplexity": float(np.exp(totals["nll"] / tokens)),
            "eval_accuracy": totals["correct"] / tokens}

  def evaluate_params(self, params) -> dict[str, float]:
    """The metrics for host `params` (e.g. a restored checkpoint's)."""
    return self(devices.pmap_replicate(params, jax.local_devices()))


class BeamBleu(_EveryEvalSteps):
  """BLEU of the config's beam search on the first
  `config.eval_bleu_sentences` pairs of `config.eval_split`, read at the
  first call."""

  def __init__(self, config: ml_collections.ConfigDict, tokenizer,
               model_config: TransformerConfig):
    self._config = config
    self._tokenizer = tokenizer
    self._model_config = model_config
    self._pairs = None  # (sources, references), read at first use

  def __call__(self, params) -> dict[str, float]:
    """The metrics for `params` replicated over the local devices."""
    config = self._config
    if self._pairs is None:
      sources, references = data.load_text_pairs(config, config.eval_split)
      self._pairs = (sources[:config.eval_bleu_sentences],
                     references[:config.eval_bleu_sentences])
    return evaluate_bleu(
        self._model_config, devices.pmap_unreplicate(params), self._tokenizer,
        *self._pairs, config,
        batch_size=bleu_batch_size(len(self._pairs[0]), config.beam_size,
                                   jax.local_device_count()))


# Search rows (sentences x beam) a device takes in one batch of the
# in-training BLEU on several devices (`bleu_batch_size`).
BLEU_ROWS_PER_DEVICE = 512


def bleu_batch_size(num_sentences: int, beam_size: int,
                    num_devices: int) -> int:
  """Sentences per batch of the in-training BLEU, chosen so that one
  search is compiled.

  The same sentences are translated at every evaluation of a run, so the
  first evaluation's time is mostly compiling the search, once per batch
  shape. Batches of `translate.BATCH_SIZE_PER_DEVICE` sentences a device,
  eval.py's default on one device or on accelerators (split evenly over
  the devices; of equal sizes below it if the last batch would be too
  small), which `translate.decode_batches` searches as one search with
  refilled rows (one program; a single batch's search shrinks as its
  sentences end and compiles the decoder step once per size:
  bench/train_bleu.py), where every batch has at least
  `mha.search.batches.MIN_SEARCH_ROWS` rows on each device. Otherwise: all
  the sentences in one batch, up to `BLEU_ROWS_PER_DEVICE` search rows on
  each device, where batches of 64 sorted by length would compile one
  search per length bucket. The translations are those of batches of 64
  (tests/test_train_evals.py; a search row's bits do not depend on the
  batch once it has `MIN_SEARCH_ROWS` rows or more).
  """
  per_batch = translate.BATCH_SIZE_PER_DEVICE * num_devices
  if num_sentences > per_batch:
    batches = ceil_div(num_sentences, per_batch)
    # Full batches, or of equal sizes if the last would be too small.
    for size in (per_batch, ceil_div(num_sentences, batches)):
      rows = [translate.search_rows(n) for n in
              (size, num_sentences - (batches - 1) * size)]
      if all(n % num_devices == 0 and batch_search.device_rows(
          n, beam_size, num_devices) >= batch_search.MIN_SEARCH_ROWS
             for n in rows):
        return size
  rows = BLEU_ROWS_PER_DEVICE * num_devices // beam_size
  return max(1, min(num_sentences, rows))


def evaluate_bleu(model_config: TransformerConfig, params, tokenizer,
                  sources: list[str], references: list[str],
                  config: ml_collections.ConfigDict,
                  batch_size: int = 64) -> dict[str, float]:
  """The metrics of the table reported in training (`eval_<name>` of each
  `metric_table.in_training()`: `eval_bleu`, `eval_chrf`) of the config's
  beam search on `sources` (`mha.search.texts`), in batches of
  `batch_size` sentences.

  Cheap to call repeatedly on the same sentences: nothing is read from disk
  and the compiled searches are reused. `eval_decode_sentences_per_sec`
  counts the translation only, not the scoring, compilation included;
  `eval_decode_compile_seconds` is the time of it spent preparing the
  searches (`translate.Translations.compile_seconds`: 0 once the searches
  of these sentences are compiled).
  """
  # The search runs on every local device.
  translations = translate.translate_with_ids(
      model_config, params, tokenizer, sources,
      SearchSettings.of_config(config), batch_size=batch_size)
  seconds = translations.seconds
  metrics = metric_table.in_training()
  scores = metric_table.corpus_scores(
      translations.texts, references, lang=config.target_lang,
      metrics=metrics)
  return {**{f"eval_{metric.name}": scores[metric.name]
             for metric in metrics},
          "eval_decode_sentences_per_sec": len(sources) / max(seconds, 1e-9),
          "eval_decode_compile_seconds": translations.compile_seconds}
