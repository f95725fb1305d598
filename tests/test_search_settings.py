"""mha.search.settings: the settings from a config and a caller, their
check by the table of rules, and the output folders' suffix."""
import ml_collections
import pytest

from mha.search.settings import SearchSettings


def _config(**fields):
  return ml_collections.ConfigDict({
      "beam_size": 4, "alpha": 0.6, "max_decode_extra": 50,
      "test_split": "test", **fields})


def test_the_defaults_are_the_papers_search():
  # §6.1: beam 4, length penalty alpha 0.6, output length input + 50.
  assert SearchSettings() == SearchSettings(
      beam_size=4, alpha=0.6, max_decode_extra=50, beam_stop="exact",
      matmul_dtype="float32")


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
])
def test_suffix_names_each_setting_that_differs(given, suffix):
  defaults = SearchSettings(4, 0.6, 50, "exact")
  assert defaults.given(**given).suffix(defaults) == suffix


def test_suffix_is_relative_to_the_workdirs_defaults():
  early = SearchSettings.of_config(_config(beam_stop="early"))
  assert SearchSettings(4, 0.6, 50, "exact").suffix(early) == "_exact"
  assert early.suffix(early) == ""
