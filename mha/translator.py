"""A trained model in one object: `mha.load(workdir)` and its `Translator`.

    import mha
    translator = mha.load("/tmp/run")                     # the latest step
    translator.translate(["Ein Hund läuft."])             # beam 4, alpha 0.6
    translator.nbest(["Ein Hund läuft."], 4)  # [[(text, score, log_prob), ...]]
    translator.sample(["Ein Hund läuft."], temperature=0.8, top_k=10, seed=1)
    translator.score(["Ein Hund läuft."], ["A dog runs."])  # log P(Y | X)

The model, its parameters and the vocabulary are loaded once (the
workdir's reading, `mha.store.trained`: config, vocabulary, parameters,
checkpoint averaging included) and the parameters stay on the devices
between calls (`mha.search.batches.PlacedParams`); every method goes through
`mha.search.texts`, the translation layer of `eval.py` and the in-training
BLEU, so `translate` returns what `eval.py` writes for the same sentences
and settings. The search settings default to the workdir's config (the
paper: beam 4, alpha 0.6, outputs of at most input length + 50 tokens).

An empty (or blank) source line gives an empty translation, an empty n-best
list and an empty sample; it is not translated.
"""
import collections.abc
import dataclasses
import math
import numbers
import os
from typing import Any, NamedTuple, Sequence

import numpy as np

from mha.search import batches as batch_search
from mha import data
from mha.search import texts as translate
from mha import validation
from mha.errors import ConfigError
from mha.search.settings import SearchSettings
from mha.store import trained
from mha.model.transformer import TransformerConfig

_INT32 = 2**31


class Hypothesis(NamedTuple):
  """One entry of an n-best list.

  Attributes:
    text: the detokenized translation.
    score: log P(Y | X) / lp(|Y|), the length-penalised score the beam
      search ranks by (Wu et al. 2016: lp = ((5 + |Y|) / 6) ** alpha, |Y|
      counting EOS).
    log_prob: log P(Y | X), the sum of its tokens' log-probabilities.
  """
  text: str
  score: float
  log_prob: float


class Sample(NamedTuple):
  """A sampled translation and the model's log P(Y | X) of it."""
  text: str
  log_prob: float


class Score(NamedTuple):
  """The model's log-probability of a given target (forced decoding).

  Attributes:
    log_prob: log P(Y | X), the sum of `token_log_probs`.
    token_log_probs: float32 `[|Y|]`, log P(y_t | X, y_<t) of each target
      token, its EOS last.
    pieces: the SentencePiece piece of each token (`</s>` for EOS).
  """
  log_prob: float
  token_log_probs: np.ndarray
  pieces: list[str]


def _check_int(name: str, value: Any, low: int, high: int | None = None,
               flag: str | None = None) -> int:
  """`value` as an int in low..high, or a ConfigError naming `name` (the
  command's `--flag` in a command: `validation.setting`)."""
  if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
      or value < low or (high is not None and value > high)):
    bounds = f">= {low}" if high is None else f"in {low}..{high}"
    raise ConfigError(validation.refusal(name, f"an integer {bounds}", value,
                                         flag))
  return int(value)


def _check_batch_size(batch_size: Any) -> None:
  """None (`translate.batch_size_for`: 64 sentences an accelerator) or an
  integer >= 1."""
  if batch_size is not None:
    _check_int("batch_size", batch_size, 1)


def _check_float(name: str, value: Any, low: float = 0.0) -> float:
  if (not isinstance(value, numbers.Real) or isinstance(value, bool)
      or not math.isfinite(value) or value < low):
    raise ConfigError(validation.refusal(
        name, f"a finite number >= {low}", value))
  return float(value)


def _check_sentences(name: str, sentences: Any) -> list[str]:
  """`sentences` as a list (any iterable of strings: a generator, a file's
  lines), or a ConfigError (a DataError for a string that is no text: a
  lone surrogate, which SentencePiece refuses with a TypeError)."""
  problem = ConfigError(f"{name} must be a list of strings (one sentence "
                        "each), not a single string or other objects.")
  # A dict or a set iterates over keys in an order of its own: no list of
  # sentences whose results could be matched back.
  if isinstance(sentences, (str, bytes, collections.abc.Mapping,
                            collections.abc.Set)):
    raise problem
  try:
    sentences = list(sentences)  # once: a generator is read only once
  except TypeError:
    raise problem from None
  if not all(isinstance(s, str) for s in sentences):
    raise problem
  for number, sentence in enumerate(sentences, 1):
    try:
      sentence.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: no text
      raise data.DataError(
          f"{name}: sentence {number} is not text that UTF-8 can encode "
          f"({e.reason} at character {e.start}).") from None
  return sentences


class Translator:
  """A workdir's model, parameters and vocabulary, loaded once.

  Made by `mha.load`. The methods take a list of sentences and return one
  result per sentence, in order; the search settings default to
  `defaults` (the workdir's config).

  Attributes:
    config: the workdir's ml_collections config.
    tokenizer: its SentencePiece vocabulary.
    model_config: the model's `TransformerConfig` (deterministic).
    step: the checkpoint step loaded (the last one averaged).
    steps: the steps averaged (one step without averaging).
    defaults: the search settings used where a method is not given them.
  """

  def __init__(self, config: Any, tokenizer: data.Tokenizer, params: Any,
               step: int, steps: Sequence[int]):
    self.config = config
    self.tokenizer = tokenizer
    self.model_config = TransformerConfig.from_config(config,
                                                      deterministic=True)
    self.params = batch_search.PlacedParams(params)
    self.step = int(step)
    self.steps = [int(s) for s in steps]
    self.defaults = SearchSettings.of_config(config)

  def _search(self, **given) -> SearchSettings:
    """`defaults` with the settings given (None: not given), checked.

    Raises:
      ConfigError: a setting out of range, or a keyword that is none.
    """
    try:
      given = self.defaults.given(**given)
    except TypeError as e:
      raise ConfigError(str(e)) from None
    for field, allowed in given.problems(self.model_config.vocab_size):
      raise ConfigError(validation.refusal(field, allowed,
                                           getattr(given, field)))
    return dataclasses.replace(  # NumPy scalars as Python numbers
        given, beam_size=int(given.beam_size), alpha=float(given.alpha),
        max_decode_extra=int(given.max_decode_extra))

  def _text(self, ids: np.ndarray) -> str:
    return translate.detokenize(self.tokenizer, ids)

  def _nonempty(self, sentences: Sequence[str], batch_size: int | None
                ) -> tuple[list[int], list[str]]:
    """(positions, sentences) of the sentences that are not blank."""
    _check_batch_size(batch_size)
    keep = [i for i, s in enumerate(sentences) if not translate.is_blank(s)]
    return keep, [sentences[i] for i in keep]

  def translate(self, sentences: Sequence[str], *,
                batch_size: int | None = None, **search: Any) -> list[str]:
    """The best translation of each sentence by beam search.

    Args:
      sentences: plain text, one sentence each.
      batch_size: sentences per decoding batch (None:
        `translate.batch_size_for`, 64 for each accelerator).
      **search: any field of `mha.SearchSettings` (None or not given:
        `defaults`, the workdir's config): beam_size (1 = greedy search),
        alpha (the length penalty's exponent, >= 0), max_decode_extra
        (outputs of at most source tokens + this), beam_stop ("exact":
        the result of a search run to the length limit; "early": sooner,
        may miss a longer hypothesis), matmul_dtype ("float32", or
        "bfloat16" for the model's products with its weight matrices:
        faster on CPUs with bfloat16 instructions, other outputs),
        no_repeat_ngram_size (n > 0: no output repeats an n-gram).

    Returns:
      One translation per sentence, without newlines ("" for a blank one).

    Raises:
      ConfigError: a setting out of range.
    """
    sentences = _check_sentences("sentences", sentences)
    settings = self._search(**search)
    _check_batch_size(batch_size)
    return translate.translate_texts(
        self.model_config, self.params, self.tokenizer, sentences, settings,
        batch_size=batch_size)

  def nbest(self, sentences: Sequence[str], n: int, *,
            batch_size: int | None = None,
            **search: Any) -> list[list[Hypothesis]]:
    """The n best hypotheses of each sentence's beam search, best first.

    Args:
      n: 1..beam_size; the first is `translate`'s translation.
      sentences, batch_size, search: as in `translate` (beam_stop="early"
        ends a sentence's search when no live hypothesis would beat its
        n-th best if it ended at the next step).

    Returns:
      Per sentence, up to n `Hypothesis(text, score, log_prob)` (fewer only
      when fewer complete hypotheses exist; none for a blank sentence).

    Raises:
      ConfigError: n > beam_size, or a setting out of range.
    """
    sentences = _check_sentences("sentences", sentences)
    settings = self._search(**search)
    n = _check_int("n", n, 1, flag="nbest")
    if n > settings.beam_size:
      raise ConfigError(
          f"{validation.setting('n', 'nbest')}={n} hypotheses asked of a "
          f"beam of {settings.beam_size}: give "
          f"{validation.setting('beam_size')} >= {n}.")
    keep, texts = self._nonempty(sentences, batch_size)
    out: list[list[Hypothesis]] = [[] for _ in sentences]
    for i, found in zip(keep, translate.nbest_ids(
        self.model_config, self.params, self.tokenizer, texts, settings,
        num_best=n, batch_size=batch_size)):
      out[i] = [Hypothesis(self._text(ids), score, log_prob)
                for ids, score, log_prob in found]
    return out

  def sample(self, sentences: Sequence[str], temperature: float = 1.0,
             top_k: int = 0, seed: int = 0,
             max_decode_extra: int | None = None, batch_size: int | None = None,
             first_id: int = 0, with_log_probs: bool = False
             ) -> list[str] | list[Sample]:
    """A translation of each sentence drawn from the model (ancestral
    sampling, as back-translation uses it).

    Args:
      sentences, max_decode_extra, batch_size: as in `translate`.
      temperature: >= 0; 0 = greedy search, < 1 sharper, > 1 flatter.
      top_k: draw each token from the k most probable only; 0 = all; at
        most the vocabulary's size.
      seed: an int32. The same seed gives the same samples, on any number
        of devices and in any batches: sentence i draws with its own key,
        derived from the seed and `first_id + i`.
      first_id: the position of `sentences[0]` in a larger corpus sampled
        in pieces (the pieces then give the samples of the whole).
      with_log_probs: return `Sample(text, log_prob)`, with the model's
        log P(Y | X) of each sample.

    Returns:
      One sampled translation per sentence ("" for a blank one).

    Raises:
      ConfigError: a setting out of range.
    """
    sentences = _check_sentences("sentences", sentences)
    temperature = _check_float("temperature", temperature)
    # Above the vocabulary's size it would act as 0 (every token): a typo.
    top_k = _check_int("top_k", top_k, 0, self.model_config.vocab_size)
    seed = _check_int("seed", seed, -_INT32, _INT32 - 1)
    first_id = _check_int("first_id", first_id, 0, _INT32 - 1)
    if not isinstance(with_log_probs, bool):
      raise ConfigError(f"with_log_probs must be True or False, got "
                        f"{with_log_probs!r}.")
    max_decode_extra = self._search(
        max_decode_extra=max_decode_extra).max_decode_extra
    keep, texts = self._nonempty(sentences, batch_size)
    out = [Sample("", 0.0)] * len(sentences)
    # A sentence's key follows its position in `sentences` (blank ones
    # included), whatever the batching.
    found = translate.sample_ids(
        self.model_config, self.params, self.tokenizer, texts,
        temperature=temperature, top_k=top_k, seed=seed,
        max_decode_extra=max_decode_extra,
        sentence_ids=[first_id + i for i in keep], batch_size=batch_size)
    for i, (ids, log_prob) in zip(keep, found):
      out[i] = Sample(self._text(ids), log_prob)
    return out if with_log_probs else [s.text for s in out]

  def score(self, sources: Sequence[str], targets: Sequence[str],
            batch_size: int | None = None) -> list[Score]:
    """The model's log-probability of each (source, target) pair.

    Teacher forcing: the target is tokenized with the workdir's vocabulary,
    EOS appended, and fed to the decoder's step function behind the start
    symbol; each token's log-probability is read from the model's
    prediction before it.

    Args:
      sources, targets: plain sentences, as many targets as sources.
      batch_size: pairs per batch (None: `translate.batch_size_for`).

    Returns:
      One `Score(log_prob, token_log_probs, pieces)` per pair.

    Raises:
      ConfigError: not as many targets as sources.
      DataError: a target longer than the model's max_len - 1 tokens.
    """
    sources = _check_sentences("sources", sources)
    targets = _check_sentences("targets", targets)
    if len(sources) != len(targets):
      raise ConfigError(f"{len(sources)} sources but {len(targets)} "
                        "targets: give one target per source.")
    _check_batch_size(batch_size)
    out = []
    for ids, log_probs in translate.score_ids(
        self.model_config, self.params, self.tokenizer, sources, targets,
        batch_size=batch_size):
      pieces = ["</s>" if i == data.EOS_ID else self.tokenizer.id_to_piece(i)
                for i in ids.tolist()]
      out.append(Score(float(np.sum(log_probs, dtype=np.float64)),
                       np.asarray(log_probs, np.float32), pieces))
    return out


def load(workdir: str, step: int | None = None,
         average_last: int | None = None) -> Translator:
  """The model of a training workdir, ready to translate.

  Reads the workdir's config.json, spm.model and checkpoint(s) without
  modifying anything (the evaluator's loading).

  Args:
    workdir: a training workdir's path (local or gs://; a str or path).
    step: the checkpoint step; None = the latest.
    average_last: use the element-wise mean of the last N checkpoints up to
      `step` (the paper averages the last 5 or 20).

  Returns:
    A `Translator`.

  Raises:
    mha.errors.UserError: a missing workdir, config.json, spm.model or
      checkpoint, a step that does not exist, fewer than `average_last`
      checkpoints, or a bad argument; one line naming it.
  """
  if not isinstance(workdir, (str, os.PathLike)):
    raise ConfigError(f"workdir must be a path (a string), got {workdir!r}.")
  workdir = os.fspath(workdir)
  if not workdir.strip():
    raise ConfigError("workdir is empty: give a training workdir's path.")
  if step is not None:
    _check_int("step", step, 0)
  if average_last is not None:
    _check_int("average_last", average_last, 1)
  config, tokenizer = trained.load_workdir(workdir)
  with validation.choosing_step("load", "step"):  # a damaged step's advice
    params, last, steps = trained.load_params(workdir, step, average_last)
  trained.check_fit(config, params, workdir, last)
  return Translator(config, tokenizer, params, last, steps)


__all__ = ["Hypothesis", "Sample", "Score", "SearchSettings", "Translator",
           "load"]
