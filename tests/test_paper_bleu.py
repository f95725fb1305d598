"""The paper's BLEU (tensor2tensor's get_ende_bleu.sh) on hand-counted cases."""
import math

import pytest

from mha.scoring import metric_table
from mha.scoring import paper_bleu
from mha.scoring.corpus import Corpus


def test_compound_split_follows_perls_non_overlapping_matches():
  # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g', run by hand:
  assert paper_bleu.compound_split("rich-text format") == (
      "rich ##AT##-##AT## text format")
  # The match "a-b" consumes "b", so the second hyphen has no \S before it.
  assert paper_bleu.compound_split("a-b-c") == "a ##AT##-##AT## b-c"
  assert paper_bleu.compound_split("a - b, -x, y-") == "a - b, -x, y-"
  # \S is any character but white space: punctuation before the hyphen too.
  assert paper_bleu.compound_split("Die U.S.-Armee") == (
      "Die U.S. ##AT##-##AT## Armee")


def test_tokenize_replaces_unicode_punctuation_escapes_and_splits():
  assert paper_bleu.tokenize(["„Das“ kostet 3,50 € & mehr…"], "de") == [
      "„ Das &quot; kostet 3,50 € &amp; mehr ..."]
  assert paper_bleu.tokenize(["Ein E-Mail-Konto."], "de") == [
      "Ein E ##AT##-##AT## Mail ##AT##-##AT## Konto ."]
  # The German rules of tokenizer.perl -l de: an ordinal's period stays
  # ("3." before a word), an apostrophe is split off on both sides (the
  # English rules give "3 ." and "geht &apos;s").
  assert paper_bleu.tokenize(["Er kam am 3. Oktober, geht's?"], "de") == [
      "Er kam am 3. Oktober , geht &apos; s ?"]


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
  # Two 4-grams on each side, none matched: 0 too (smoothing would give
  # more).
  assert paper_bleu.paper_bleu(["ein Haus ist rot ."],
                               ["ein Haus ist blau ."],
                               "de")["bleu_paper"] == 0.0
  same = "Ein kleiner Hund läuft über die grüne Wiese ."
  assert paper_bleu.paper_bleu([same], [same],
                               "de")["bleu_paper"] == pytest.approx(100.0)
  assert paper_bleu.paper_bleu([same.lower()], [same],
                               "de")["bleu_paper"] < 100.0
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    paper_bleu.paper_bleu(["a", "b"], ["a"], "de")


def test_only_the_translations_get_their_punctuation_replaced():
  # get_ende_bleu.sh replaces Unicode punctuation in the translations only;
  # its reference (newstest2014.tok.de) was tokenized without it.
  sentence = "Er sagte „Ja“ und ging."
  assert paper_bleu.tokenize([sentence], "de", replace_punctuation=False) == [
      "Er sagte „ Ja “ und ging ."]
  # hyp: Er sagte „ Ja &quot; und ging .   ref: Er sagte „ Ja “ und ging .
  # Counted by hand: 1-grams 7/8, 2-grams 5/7, 3-grams 3/6, 4-grams 1/5,
  # equal lengths (no brevity penalty).
  expected = 100 * (7 / 8 * 5 / 7 * 3 / 6 * 1 / 5) ** 0.25
  result = paper_bleu.paper_bleu([sentence], [sentence], "de")
  assert result["bleu_paper"] == pytest.approx(expected, abs=1e-9)
  assert "ref:moses-tok(lang:de)" in result["bleu_paper_signature"]
  # The same reference given tokenized, as the script reads it: the same.
  tokenized = paper_bleu.paper_bleu([sentence], ["Er sagte „ Ja “ und ging ."],
                                    "de", references_tokenized=True)
  assert tokenized["bleu_paper"] == pytest.approx(expected, abs=1e-9)
  assert "ref:tokenized" in tokenized["bleu_paper_signature"]


def test_a_tokenized_reference_is_only_compound_split():
  # Tokenizing it again would escape its "&amp;" once more ("&amp;amp;").
  hypothesis = "Die Rich-Text-Datei kostet 3 € & mehr."
  reference = "Die Rich-Text-Datei kostet 3 € &amp; mehr ."
  result = paper_bleu.paper_bleu([hypothesis], [reference], "de",
                                 references_tokenized=True)
  assert result["bleu_paper"] == pytest.approx(100.0)
  retokenized = paper_bleu.paper_bleu([hypothesis], [reference], "de")
  assert retokenized["bleu_paper"] < 100.0


def test_the_papers_bleu_in_the_table_is_opt_in_and_needs_the_language():
  """The table's `bleu_paper` is this score (hand-counted above), asked
  for by `paper_bleu` (--paper_bleu), not reported in training; without
  the target language it is refused, naming it."""
  (metric,) = [m for m in metric_table.METRICS if m.name == "bleu_paper"]
  assert (metric.opt_in, metric.in_training) == ("paper_bleu", False)
  hypothesis, reference = "Ein E-Mail-Konto.", "Ein E-Mail Konto ."
  value, fields = metric.compute(Corpus([hypothesis], [reference], "de"))
  assert {"bleu_paper": value, **fields} == paper_bleu.paper_bleu(
      [hypothesis], [reference], "de")
  with pytest.raises(ValueError, match=r"needs the target language \("
                     r"Corpus.lang\)"):
    metric.compute(Corpus([hypothesis], [reference]))
