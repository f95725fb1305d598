"""The paper's BLEU (tensor2tensor's get_ende_bleu.sh) on hand-counted cases."""
import math

import pytest

from mha import paper_bleu


def test_compound_split_follows_perls_non_overlapping_matches():
  # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g', run by hand:
  assert paper_bleu.compound_split("rich-text format") == (
      "rich ##AT##-##AT## text format")
  # The match "a-b" consumes "b", so the second hyphen has no \S before it.
  assert paper_bleu.compound_split("a-b-c") == "a ##AT##-##AT## b-c"
  assert paper_bleu.compound_split("a - b, -x, y-") == "a - b, -x, y-"


def test_tokenize_replaces_unicode_punctuation_escapes_and_splits():
  assert paper_bleu.tokenize(["„Das“ kostet 3,50 € & mehr…"], "de") == [
      "„ Das &quot; kostet 3,50 € &amp; mehr ..."]
  assert paper_bleu.tokenize(["Ein E-Mail-Konto."], "de") == [
      "Ein E ##AT##-##AT## Mail ##AT##-##AT## Konto ."]


def test_paper_bleu_equals_the_hand_computed_multi_bleu_score():
  hyp = "Das rich-text Format ist gut."
  ref = "Das rich-text Format ist sehr gut."
  # Tokenized and split, counted by hand:
  # hyp: Das rich ##AT##-##AT## text Format ist gut .        (8 tokens)
  # ref: Das rich ##AT##-##AT## text Format ist sehr gut .   (9 tokens)
  # matched n-grams: 8/8, 6/7, 4/6, 3/5; brevity penalty exp(1 - 9/8).
  expected = 100 * math.exp(1 - 9 / 8) * (8 / 8 * 6 / 7 * 4 / 6 * 3 / 5) ** 0.25
  result = paper_bleu.paper_bleu([hyp], [ref], "de")
  assert result["bleu_paper"] == pytest.approx(expected, abs=1e-9)
  assert "compound-split" in result["bleu_paper_signature"]
  # sacreBLEU's 13a keeps "rich-text" whole: 6/6, 4/5, 2/4, 1/3 matched,
  # brevity exp(1 - 7/6): lower, as the module docstring says.
  import sacrebleu
  sacre = sacrebleu.corpus_bleu([hyp], [[ref]]).score
  assert sacre == pytest.approx(
      100 * math.exp(1 - 7 / 6) * (1 * 4 / 5 * 2 / 4 * 1 / 3) ** 0.25, abs=1e-9)
  assert result["bleu_paper"] > sacre


def test_paper_bleu_is_case_sensitive_unsmoothed_and_checks_lengths():
  # No 4-gram in common: multi-bleu.perl gives 0 (no smoothing).
  assert paper_bleu.paper_bleu(["ein Haus ."], ["ein Haus ."],
                               "de")["bleu_paper"] == 0.0
  same = "Ein kleiner Hund läuft über die grüne Wiese ."
  assert paper_bleu.paper_bleu([same], [same],
                               "de")["bleu_paper"] == pytest.approx(100.0)
  assert paper_bleu.paper_bleu([same.lower()], [same],
                               "de")["bleu_paper"] < 100.0
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    paper_bleu.paper_bleu(["a", "b"], ["a"], "de")
