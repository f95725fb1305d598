"""A made-up language pair, generated in code from a seed (no files).

The offline quickstart trains on it: small enough for a ~1-2M-parameter model
to reach BLEU >= 90 in minutes on a CPU, yet not a copy task. The two
languages differ in

* vocabulary: a one-to-one lexicon between two disjoint sets of invented
  words (different consonant inventories), ~160 source words;
* word order: the source is SOV with postpositions and noun phrases written
  noun-first (`noun adj* det`); the target is SVO with prepositions and
  noun phrases written `det adj* noun` (the noun phrase is reversed, the verb
  moves from the end to after the subject, the postpositional phrase moves
  after the object);
* agreement: every target noun has one of two genders, and the target
  determiner depends on it (one source determiner, two target forms), so the
  translation of a determiner depends on a word elsewhere in the phrase.

Example, glossed in English: source `cat black the  mouse a  garden in  sees`
-> target `the black cat  sees  a mouse  in the garden`.

Sentences have 3 to 12 words. The splits `train` (30,000 pairs),
`validation` and `test` (500 each) hold distinct source sentences, so
validation and test are disjoint from training.
"""
import bisect
import dataclasses
import functools

import numpy as np

SOURCE_LANG = "src"
TARGET_LANG = "tgt"
LANGUAGES = (SOURCE_LANG, TARGET_LANG)
SPLIT_SIZES = {"train": 30_000, "validation": 500, "test": 500}
MIN_WORDS, MAX_WORDS = 3, 12

# Number of words per category (source side).
_CATEGORY_SIZES = {
    "name": 12, "noun": 60, "adj": 30, "verb_t": 24, "verb_i": 12,
    "det": 4, "post": 8, "adv": 10,
}
# Syllable inventories: disjoint consonants, so the two vocabularies differ.
_SOURCE_SYLLABLES = ("bdgklmnprt", "aeiou")
_TARGET_SYLLABLES = ("cfhjsvwxz", "aeiouy")


@dataclasses.dataclass(frozen=True)
class SyntheticLanguage:
  """The lexicon and grammar of one seed's language pair.

  Attributes:
    seed: the seed the pair was generated from.
    words: source words per category (`name`, `noun`, `adj`, `verb_t`,
      `verb_i`, `det`, `post`, `adv`).
    lexicon: source word -> target word; a determiner maps to its two
      gendered forms `(masculine, feminine)`.
    gender: source noun -> 0 or 1, the gender of its target noun.
  """
  seed: int
  words: dict[str, tuple[str, ...]]
  lexicon: dict[str, tuple[str, ...]]
  gender: dict[str, int]

  def translate_noun_phrase(self, noun_phrase: list[str]) -> list[str]:
    """Source `[noun, adj*, det]` or `[name]` -> target `[det, adj*, noun]`."""
    if len(noun_phrase) == 1:
      return [self.lexicon[noun_phrase[0]][0]]
    noun, *adjectives, det = noun_phrase
    target_det = self.lexicon[det][self.gender[noun]]
    return ([target_det] + [self.lexicon[a][0] for a in reversed(adjectives)]
            + [self.lexicon[noun][0]])


def _invent_words(rng: np.random.Generator, syllables: tuple[str, str],
                  count: int, num_syllables: tuple[int, ...],
                  taken: set[str]) -> list[str]:
  """`count` new distinct words of CV syllables, none of them in `taken`."""
  consonants, vowels = syllables
  words = []
  while len(words) < count:
    n = int(rng.choice(num_syllables))
    word = "".join(consonants[rng.integers(len(consonants))]
                   + vowels[rng.integers(len(vowels))] for _ in range(n))
    if word not in taken:
      taken.add(word)
      words.append(word)
  return words


@functools.lru_cache(maxsize=8)
def language(seed: int) -> SyntheticLanguage:
  """The language pair of `seed` (deterministic)."""
  rng = np.random.default_rng([seed, 0])
  source_taken, target_taken = set(), set()
  words, lexicon = {}, {}
  for category, count in _CATEGORY_SIZES.items():
    # Function words are short, content words longer.
    lengths = (1,) if category in ("det", "post") else (2, 3)
    source = _invent_words(rng, _SOURCE_SYLLABLES, count, lengths,
                           source_taken)
    forms = 2 if category == "det" else 1
    target = _invent_words(rng, _TARGET_SYLLABLES, count * forms, lengths,
                           target_taken)
    words[category] = tuple(source)
    for i, word in enumerate(source):
      lexicon[word] = tuple(target[i * forms:(i + 1) * forms])
  gender = {noun: int(rng.integers(2)) for noun in words["noun"]}
  return SyntheticLanguage(seed=seed, words=words, lexicon=lexicon,
                           gender=gender)


# The number of adjectives of a noun phrase: 0, 1 or 2 with probabilities
# 0.5, 0.35 and 0.15, drawn as `rng.choice(3, p=...)` draws it (one
# `rng.random()` placed on the normalised cumulative sums) at a tenth of
# its cost: the same draws, the same pairs.
_ADJECTIVES_CDF = np.cumsum([0.5, 0.35, 0.15])
_ADJECTIVES_CDF = tuple((_ADJECTIVES_CDF / _ADJECTIVES_CDF[-1]).tolist())


def _sample_noun_phrase(rng: np.random.Generator,
                        lang: SyntheticLanguage) -> list[str]:
  """A source noun phrase: `[name]` or `[noun, adj{0,2}, det]`."""
  w = lang.words
  if rng.random() < 0.2:
    return [w["name"][rng.integers(len(w["name"]))]]
  num_adjectives = bisect.bisect_right(_ADJECTIVES_CDF, rng.random())
  # No adjective draws nothing (`rng.choice` of none draws nothing either).
  adjectives = [w["adj"][i] for i in rng.choice(
      len(w["adj"]), num_adjectives, replace=False)] if num_adjectives else []
  return ([w["noun"][rng.integers(len(w["noun"]))]] + adjectives
          + [w["det"][rng.integers(len(w["det"]))]])


def _sample_pair(rng: np.random.Generator,
                 lang: SyntheticLanguage) -> tuple[list[str], list[str]]:
  """One sentence pair as word lists (length not yet checked)."""
  w, lex = lang.words, lang.lexicon
  subject = _sample_noun_phrase(rng, lang)
  transitive = rng.random() < 0.75
  obj = _sample_noun_phrase(rng, lang) if transitive else []
  verb = (w["verb_t"] if transitive else w["verb_i"])
  verb = verb[rng.integers(len(verb))]
  pp = []
  if rng.random() < 0.35:
    pp = (_sample_noun_phrase(rng, lang)
          + [w["post"][rng.integers(len(w["post"]))]])
  adverb = [w["adv"][rng.integers(len(w["adv"]))]] if rng.random() < 0.3 else []
  # Source: S [NP post] [O] [adv] V.
  source = subject + pp + obj + adverb + [verb]
  # Target: S V [O] [prep NP] [adv].
  target = lang.translate_noun_phrase(subject) + [lex[verb][0]]
  if obj:
    target += lang.translate_noun_phrase(obj)
  if pp:
    target += [lex[pp[-1]][0]] + lang.translate_noun_phrase(pp[:-1])
  target += [lex[a][0] for a in adverb]
  return source, target


@functools.lru_cache(maxsize=4)
def generate(seed: int) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
  """All splits of the pair of `seed`: split -> (sources, targets).

  Source sentences are distinct across and within splits; the first ones
  generated go to `test`, then `validation`, the rest to `train`.
  """
  lang = language(seed)
  rng = np.random.default_rng([seed, 1])
  total = sum(SPLIT_SIZES.values())
  seen, sources, targets = set(), [], []
  while len(sources) < total:
    source, target = _sample_pair(rng, lang)
    if not MIN_WORDS <= len(source) <= MAX_WORDS:
      continue
    sentence = " ".join(source)
    if sentence in seen:
      continue
    seen.add(sentence)
    sources.append(sentence)
    targets.append(" ".join(target))
  splits, start = {}, 0
  for split in ("test", "validation", "train"):
    end = start + SPLIT_SIZES[split]
    splits[split] = (tuple(sources[start:end]), tuple(targets[start:end]))
    start = end
  return splits
