"""The search's settings as one object: beam size, α, output length, rule,
the weight products' dtype.

Every caller that translates (eval.py and `--follow`, `mha.Translator`,
the in-training BLEU) takes its settings from the workdir's config where
the user gives none, checks them by the one table of rules
(`mha.validation`) and passes them on (`as_dict`: the keywords of
mha.search.texts's functions); evaluations of other settings than the
config's get other output folders (`suffix`). A new setting is a field
here, a rule in `mha.validation.FIELDS` and a config field in
configs/base.py; the functions that take the settings one by one from
their callers (`evaluator.evaluate` and `check_flags`, `follow.follow`,
the `Translator` methods and `line_translator`, the commands' flags in
mha/cli/startup.py, and mha.search.texts's functions that use it) name it
too.

This module imports only `mha.validation` (no JAX).
"""
import dataclasses
from typing import Any

from mha import validation

# The value of a search setting that the configs (and metrics.json files)
# written before it existed lack: what the search did then.
OLDER_DEFAULTS = {"beam_stop": "exact", "matmul_dtype": "float32"}


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  """The beam search's settings (the paper's §6.1 by default).

  beam_size: 1 = greedy search; alpha: the length penalty's exponent;
  max_decode_extra: outputs of at most source tokens + this; beam_stop:
  "exact" or "early" (`mha.search.decoding.beam_search`'s stopping rule);
  matmul_dtype: "float32", or "bfloat16" for the model's products with its
  weight matrices (`mha.model.attention.weight_product`: faster on CPUs with
  bfloat16 instructions, other outputs).
  """
  beam_size: int = 4
  alpha: float = 0.6
  max_decode_extra: int = 50
  beam_stop: str = "exact"
  matmul_dtype: str = "float32"

  @classmethod
  def of_config(cls, config: Any) -> "SearchSettings":
    """A workdir's config's settings (`OLDER_DEFAULTS` for a field an
    older config lacks; the class's defaults for a config without any)."""
    return cls(**{name: config.get(name, OLDER_DEFAULTS.get(name, default))
                  for name, default in _defaults().items()})

  def given(self, **values: Any) -> "SearchSettings":
    """These settings with each value given that is not None."""
    unknown = set(values) - set(_defaults())
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
    """{field: value}: the keyword arguments of `mha.search.texts`'s
    functions and the fields metrics.json records."""
    return dataclasses.asdict(self)

  def suffix(self, defaults: "SearchSettings") -> str:
    """'' for `defaults`, else e.g. '_beam8_alpha1.0': names each setting
    that differs, beam size (`_beam<n>`), α (`_alpha<α>`), max_decode_extra
    (`_extra<n>`), the stopping rule (`_early`, `_exact`) and the weight
    products' dtype (`_bfloat16`, `_float32`), so that
    evaluations with other settings get other folders."""
    parts = []
    if self.beam_size != defaults.beam_size:
      parts.append(f"beam{self.beam_size}")
    if float(self.alpha) != float(defaults.alpha):
      parts.append(f"alpha{float(self.alpha)!r}")
    if self.max_decode_extra != defaults.max_decode_extra:
      parts.append(f"extra{self.max_decode_extra}")
    if self.beam_stop != defaults.beam_stop:
      parts.append(self.beam_stop)
    if self.matmul_dtype != defaults.matmul_dtype:
      parts.append(self.matmul_dtype)
    return "".join("_" + p for p in parts)


def _defaults() -> dict[str, Any]:
  return {f.name: f.default for f in dataclasses.fields(SearchSettings)}


FIELDS = tuple(_defaults())  # the settings' names, in order
