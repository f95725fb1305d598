"""The search's settings as one object, from the caller to the search.

`SearchSettings` goes from every caller that translates (eval.py and
`--follow`, `mha.Translator`, `mha-translate`, the in-training BLEU)
through `mha.search.texts` and `mha.search.batches` to the search. What
each layer needs of the settings is derived from the fields, so that a
new setting cannot be forgotten by one of them:

* the commands' flags (`flags`: `--<field>`, its type and help),
* the checks (`problems`: each field's rule in `mha.validation.FIELDS`),
* an evaluation's output folder (`suffix`) and summary line (`describe`),
* the fields metrics.json records and compares (`as_dict`, `DEFAULTS`),
* the keys of the compiled and traced searches (`search_key`: the
  settings the search captures, all but those marked as its inputs'),
* the hooks on the step's log-probabilities (`step_hook`).

A new search setting is a field here (with its flag's help, its folder
suffix and its hook if it changes the step's scores), a rule in
`mha.validation.FIELDS` and the code that uses it (a hook class of
`mha.search.hooks`, or the search itself): nothing passes it on by name.
A setting's default is the search as it was before the setting existed,
so that a config or a metrics.json without the field reads as what ran.

This module imports only `mha.validation` (no JAX: the commands define
their flags from it before JAX starts).
"""
import dataclasses
from typing import Any, Callable

from mha import validation


def _setting(default: Any, help_text: str, suffix: Callable[[Any], str],
             summary: Callable[[Any], str] | None = None,
             always: bool = False, traced: bool = True) -> Any:
  """A field of `SearchSettings` and what the layers derive from it.

  Args:
    default: the paper's value (or the search before the setting existed).
    help_text: its flag's help (mha-eval, mha-translate).
    suffix: value -> its part of an output folder's name, where it
      differs from the workdir config's.
    summary: value -> its words in eval's summary line; shown where the
      value is not `default`, or `always`.
    always: show `summary` whatever the value.
    traced: the traced search captures it (its keys include it); False
      for a setting that only shapes the search's inputs.
  """
  return dataclasses.field(default=default, metadata=dict(
      help=help_text, suffix=suffix, summary=summary, always=always,
      traced=traced))


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  """The search's settings (the paper's §6.1 by default).

  beam_size: 1 = greedy search; alpha: the length penalty's exponent;
  max_decode_extra: outputs of at most source tokens + this; beam_stop:
  "exact" or "early" (`mha.search.decoding.beam_search`'s stopping rule);
  matmul_dtype: "float32", or "bfloat16" for the model's products with
  its weight matrices (`mha.model.attention.weight_product`: faster on
  CPUs with bfloat16 instructions, other outputs); no_repeat_ngram_size:
  n > 0 bans every token that would repeat an n-gram of the output
  (`mha.search.hooks.NoRepeatNGram`; 0, the paper: off).
  """
  beam_size: int = _setting(
      4, "Beam size; 1 = greedy search. Default: config.",
      "beam{}".format, "beam {}".format, always=True)
  alpha: float = _setting(
      0.6, "Length penalty exponent. Default: config.",
      lambda v: f"alpha{float(v)!r}", "alpha {}".format, always=True)
  max_decode_extra: int = _setting(
      50, "Output length limit = input length + this. Default: config.",
      "extra{}".format, traced=False)
  beam_stop: str = _setting(
      "exact", "When a sentence's beam search ends: exact (its result is "
      "that of a search run to the length limit) or early (faster; may miss "
      "a longer hypothesis). Default: config (exact).", str, "stop {}".format)
  matmul_dtype: str = _setting(
      "float32", "The model's products with its weight matrices: float32, "
      "or bfloat16 (float32 results; faster on CPUs with bfloat16 "
      "instructions, other outputs). Default: config (float32).", str,
      "{} products".format)
  no_repeat_ngram_size: int = _setting(
      0, "N > 0: no output repeats an n-gram of N tokens (a token that "
      "would is banned; EOS never is). 0: off, the paper's search. Default: "
      "config (0).", "norepeat{}".format, "no repeated {}-grams".format)

  @classmethod
  def of_config(cls, config: Any) -> "SearchSettings":
    """A workdir's config's settings (the default for a field the config
    lacks: one older than the setting)."""
    return cls(**{name: config.get(name, default)
                  for name, default in DEFAULTS.items()})

  def given(self, **values: Any) -> "SearchSettings":
    """These settings with each value given that is not None."""
    unknown = set(values) - set(DEFAULTS)
    if unknown:
      raise TypeError(f"Not a search setting: {', '.join(sorted(unknown))}.")
    return dataclasses.replace(
        self, **{k: v for k, v in values.items() if v is not None})

  def problems(self, vocab_size: int | None = None
               ) -> list[tuple[str, str]]:
    """(field, what it must be) of each setting its rule refuses
    (`mha.validation.FIELDS`), in field order; given the model's
    `vocab_size`, a beam wider than the vocabulary too (no search needs
    more hypotheses than there are tokens, and its rows would be
    batch × beam: a beam of 10^6 took the machine's memory)."""
    found = []
    for name, value in self.as_dict().items():
      allowed = validation.FIELDS[name](value)
      if allowed is not None:
        found.append((name, allowed))
    if (vocab_size is not None and "beam_size" not in dict(found)
        and self.beam_size > vocab_size):
      found.insert(0, ("beam_size", f"<= {vocab_size}, the vocabulary's "
                       "size"))
    return found

  def as_dict(self) -> dict[str, Any]:
    """{field: value}: the fields metrics.json records."""
    return dataclasses.asdict(self)

  def search_key(self) -> "SearchSettings":
    """These settings with those the traced search does not capture (it
    reads them from its inputs) at their defaults: the settings part of
    every key of a compiled or traced search (lru caches, the disk cache
    of `mha.search.trace_cache`), so that a new setting is in every key
    unless it says otherwise."""
    return dataclasses.replace(self, **{
        f.name: f.default for f in dataclasses.fields(self)
        if not f.metadata["traced"]})

  def suffix(self, defaults: "SearchSettings") -> str:
    """'' for `defaults`, else e.g. '_beam8_alpha1.0': each setting that
    differs from `defaults` (the workdir config's), in field order, so
    that evaluations with other settings get other folders."""
    return "".join(
        "_" + f.metadata["suffix"](getattr(self, f.name))
        for f in dataclasses.fields(self)
        if _normal(f, getattr(self, f.name)) != _normal(
            f, getattr(defaults, f.name)))

  def describe(self) -> str:
    """eval's words for the search: 'beam 4, alpha 0.6', and each other
    setting that is not the paper's default ('stop early')."""
    return ", ".join(
        f.metadata["summary"](getattr(self, f.name))
        for f in dataclasses.fields(self)
        if f.metadata["summary"] and (f.metadata["always"] or _normal(
            f, getattr(self, f.name)) != _normal(f, f.default)))

  def step_hook(self, eos_id: int) -> Any:
    """The hook on each step's log-probabilities of these settings
    (`mha.search.decoding.StepHook`; None: the plain search)."""
    # pylint: disable=import-outside-toplevel  (JAX: when a search is made)
    from mha.search import hooks
    found = []
    if self.no_repeat_ngram_size:
      found.append(hooks.NoRepeatNGram(self.no_repeat_ngram_size, eos_id))
    return hooks.chain(found)


def _normal(field: dataclasses.Field, value: Any) -> Any:
  """`value` as its field's type (alpha 1 and 1.0 are one setting)."""
  return field.type(value)


# Each setting's default: a config or a metrics.json without the field
# ran the search so.
DEFAULTS = {f.name: f.default for f in dataclasses.fields(SearchSettings)}
FIELDS = tuple(DEFAULTS)  # the settings' names, in order


def flags() -> list[tuple[str, type, str]]:
  """(name, type, help) of each setting's flag (`--beam_size`, ...: the
  commands define them with no default, the config's then)."""
  return [(f.name, f.type, f.metadata["help"])
          for f in dataclasses.fields(SearchSettings)]


def resolve(settings: SearchSettings | None,
            given: dict[str, Any]) -> SearchSettings:
  """`settings` (None: the paper's) with the fields `given` as keywords
  (None: unchanged): the search functions' `settings=None, **given`."""
  return (SearchSettings() if settings is None else settings).given(**given)


def of_record(record: dict[str, Any]) -> SearchSettings:
  """The settings a metrics.json (or an evaluation's result) records."""
  return SearchSettings(**{k: record.get(k, DEFAULTS[k]) for k in FIELDS})
