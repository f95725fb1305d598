"""mha.search.settings: the settings from a config and a caller, their
check by the table of rules, and the output folders' suffix."""
import ml_collections
import pytest

from mha import validation
from mha.search import settings as settings_lib
from mha.search.settings import SearchSettings


def _config(**fields):
  return ml_collections.ConfigDict({
      "beam_size": 4, "alpha": 0.6, "max_decode_extra": 50,
      "test_split": "test", **fields})


def test_the_defaults_are_the_papers_search():
  # §6.1: beam 4, length penalty alpha 0.6, output length input + 50.
  assert SearchSettings() == SearchSettings(
      beam_size=4, alpha=0.6, max_decode_extra=50, beam_stop="exact",
      matmul_dtype="float32", no_repeat_ngram_size=0)
  assert SearchSettings().step_hook(eos_id=1) is None  # no hook: as written


def test_of_config_reads_the_fields_and_an_older_config_searches_exactly():
  assert SearchSettings.of_config(_config(beam_stop="early")) == (
      SearchSettings(4, 0.6, 50, "early"))
  config = _config(beam_size=8, alpha=1.0, max_decode_extra=10)
  assert "beam_stop" not in config  # written before the setting existed
  assert SearchSettings.of_config(config) == SearchSettings(8, 1.0, 10,
                                                            "exact")


def test_given_replaces_only_the_values_given():
  defaults = SearchSettings(4, 0.6, 50, "exact")
  assert defaults.given(beam_size=None, alpha=None) == defaults
  assert defaults.given(beam_size=1, alpha=0.0, max_decode_extra=None,
                        beam_stop="early") == SearchSettings(1, 0.0, 50,
                                                             "early")
  with pytest.raises(TypeError, match="Not a search setting: beam"):
    defaults.given(beam=8)


def test_problems_follow_the_table_of_rules():
  assert SearchSettings().problems() == []
  bad = SearchSettings(beam_size=0, alpha=float("nan"), max_decode_extra=-1,
                       beam_stop="fast")
  assert [field for field, _ in bad.problems()] == [
      "beam_size", "alpha", "max_decode_extra", "beam_stop"]
  assert dict(bad.problems())["beam_stop"] == "one of exact, early"
  assert SearchSettings(beam_size=True).problems() == [
      ("beam_size", "an integer >= 1")]
  # Given the vocabulary: no beam wider than it (its first problem).
  assert SearchSettings(beam_size=16).problems(vocab_size=16) == []
  assert [field for field, _ in SearchSettings(
      beam_size=17, alpha=-1.0).problems(vocab_size=16)] == [
          "beam_size", "alpha"]
  assert SearchSettings(beam_size=17).problems(vocab_size=16) == [
      ("beam_size", "<= 16, the vocabulary's size")]
  assert SearchSettings(beam_size=0).problems(vocab_size=16) == [
      ("beam_size", ">= 1")]


@pytest.mark.parametrize("given, suffix", [
    ({}, ""),
    ({"alpha": 0.60}, ""),  # the same number, however written
    ({"beam_size": 8}, "_beam8"),
    ({"alpha": 1}, "_alpha1.0"),
    ({"max_decode_extra": 10}, "_extra10"),
    ({"beam_stop": "early"}, "_early"),
    ({"beam_size": 1, "alpha": 0.0, "max_decode_extra": 0,
      "beam_stop": "early"}, "_beam1_alpha0.0_extra0_early"),
    ({"no_repeat_ngram_size": 3}, "_norepeat3"),
    ({"matmul_dtype": "bfloat16", "no_repeat_ngram_size": 2},
     "_bfloat16_norepeat2"),
])
def test_suffix_names_each_setting_that_differs(given, suffix):
  defaults = SearchSettings(4, 0.6, 50, "exact")
  assert defaults.given(**given).suffix(defaults) == suffix


def test_suffix_is_relative_to_the_workdirs_defaults():
  early = SearchSettings.of_config(_config(beam_stop="early"))
  assert SearchSettings(4, 0.6, 50, "exact").suffix(early) == "_exact"
  assert early.suffix(early) == ""


def test_each_setting_has_its_flag_rule_suffix_and_record():
  """What the layers derive from the fields: a flag of the field's type,
  a rule, a folder suffix, a metrics.json field and its default."""
  names = [name for name, _, _ in settings_lib.flags()]
  assert names == list(settings_lib.FIELDS) == list(SearchSettings().as_dict())
  for name, kind, help_text in settings_lib.flags():
    assert kind is type(settings_lib.DEFAULTS[name]) and help_text
    assert validation.FIELDS[name](settings_lib.DEFAULTS[name]) is None
  # A record without a setting (older than it) reads as its default.
  record = {"beam_size": 8, "alpha": 1.0, "split": "test"}
  assert settings_lib.of_record(record) == SearchSettings(beam_size=8,
                                                          alpha=1.0)


def test_describe_names_beam_and_alpha_and_what_is_not_the_papers():
  assert SearchSettings().describe() == "beam 4, alpha 0.6"
  assert SearchSettings(beam_size=1, max_decode_extra=3, beam_stop="early",
                        matmul_dtype="bfloat16",
                        no_repeat_ngram_size=2).describe() == (
      "beam 1, alpha 0.6, stop early, bfloat16 products, "
      "no repeated 2-grams")


def test_the_search_key_holds_every_setting_the_search_captures():
  """The keys of compiled and traced searches: a setting the search reads
  from its inputs (the output length) shares one; every other gets its
  own, so that no stale search serves another setting."""
  base = SearchSettings()
  shared = [name for name in settings_lib.FIELDS
            if base.given(**{name: object()}).search_key()
            == base.search_key()]
  assert shared == ["max_decode_extra"]
  assert base.given(max_decode_extra=7).search_key() == base.search_key()
  assert base.given(alpha=1.0).search_key() != base.search_key()


def test_step_hook_of_the_settings():
  from mha.search import hooks  # pylint: disable=import-outside-toplevel
  assert SearchSettings(no_repeat_ngram_size=3).step_hook(eos_id=1) == (
      hooks.NoRepeatNGram(3, eos_id=1))
