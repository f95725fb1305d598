"""The synthetic language pair: deterministic, reordered, disjoint splits."""
import numpy as np
import pytest

from conftest import synthetic_config
from mha import data
from mha.data import synthetic


def test_deterministic_for_a_seed_and_seeds_differ():
  first = synthetic.generate(0)
  synthetic.generate.cache_clear()
  synthetic.language.cache_clear()
  again = synthetic.generate(0)
  assert first == again
  other = synthetic.generate(1)
  assert other["train"][0][:100] != first["train"][0][:100]
  assert (set(" ".join(other["train"][0]).split())
          != set(" ".join(first["train"][0]).split()))
  # The same sentences in every version (recorded): the first ones
  # generated go to test, then validation, the rest to train.
  sources, targets = first["test"]
  assert (sources[0], targets[0]) == ("guno duma ri moge nigo ri ponoru pabo",
                                      "fe vohe zafaze cujy wi zafi wova vuzy")
  assert first["validation"][0][0] == "tokade ba bopuda meku"
  assert first["train"][0][0] == (
      "diruga dogeki ripipe ge pudo dogeki ba pe lure redere")


def test_noun_phrases_are_numpys_choice_draws():
  # The sampler's shortcut for the number of adjectives draws what
  # `rng.choice(3, p=[0.5, 0.35, 0.15])` draws (the reference below, as the
  # generator was first written), phrase by phrase, and leaves the
  # generator in the same state.
  lang = synthetic.language(0)
  w = lang.words

  def reference(rng):
    if rng.random() < 0.2:
      return [w["name"][rng.integers(len(w["name"]))]]
    k = int(rng.choice(3, p=[0.5, 0.35, 0.15]))
    adjectives = [w["adj"][i] for i in rng.choice(len(w["adj"]), k,
                                                  replace=False)]
    return ([w["noun"][rng.integers(len(w["noun"]))]] + adjectives
            + [w["det"][rng.integers(len(w["det"]))]])

  ours, theirs = np.random.default_rng(3), np.random.default_rng(3)
  phrases = [synthetic._sample_noun_phrase(ours, lang)  # pylint: disable=protected-access
             for _ in range(3000)]
  assert phrases == [reference(theirs) for _ in range(3000)]
  assert ours.random() == theirs.random()
  counts = np.bincount([len(p) - 2 for p in phrases if len(p) > 1])
  assert len(counts) == 3 and counts[0] > counts[1] > counts[2] > 0


def test_split_sizes_lengths_and_vocabulary():
  splits = synthetic.generate(0)
  assert {k: len(v[0]) for k, v in splits.items()} == {
      "test": 500, "validation": 500, "train": 30_000}
  sources = [s for split in splits.values() for s in split[0]]
  targets = [t for split in splits.values() for t in split[1]]
  # 3 to 12 words, both bounds reached.
  assert {len(s.split()) for s in sources} == set(range(3, 13))
  source_vocab = set(" ".join(sources).split())
  target_vocab = set(" ".join(targets).split())
  assert 100 <= len(source_vocab) <= 200
  assert 100 <= len(target_vocab) <= 200
  assert not source_vocab & target_vocab  # different vocabularies


def test_splits_disjoint():
  splits = synthetic.generate(0)
  train = set(splits["train"][0])
  assert len(train) == 30_000
  for split in ("validation", "test"):
    assert not train & set(splits[split][0])
  assert not set(splits["validation"][0]) & set(splits["test"][0])


def test_target_is_a_reordering_not_a_word_for_word_copy():
  lang = synthetic.language(0)
  sources, targets = synthetic.generate(0)["train"]
  reordered = 0
  for source, target in zip(sources[:2000], targets[:2000]):
    source, target = source.split(), target.split()
    assert len(source) == len(target)
    # Word for word, in source order (a determiner takes its first form).
    copy = [lang.lexicon[w][0] for w in source]
    # The target uses the same lexemes: each word is a form of one of them.
    forms = {f: w for w in source for f in lang.lexicon[w]}
    assert sorted(forms[w] for w in target) == sorted(source)
    reordered += copy != target
  # Every sentence ends with its verb in the source; in the target the verb
  # follows the subject, so nearly all sentences are reordered.
  assert reordered > 1900


def _translate_by_hand(lang, source):
  """The module docstring's grammar, applied to a parse of `source`:
  source `S [NP post] [O] [adv] V` -> target `S V [O] [prep NP] [adv]`,
  a noun phrase `noun adj* det` -> `det adj* noun` (reversed), the
  determiner's form that of the noun's gender."""
  category = {w: c for c, words in lang.words.items() for w in words}
  lex = lang.lexicon
  *rest, verb = source.split()
  adverb = [rest.pop()] if rest and category[rest[-1]] == "adv" else []
  phrases, i = [], 0  # (noun phrase, postposition or None)
  while i < len(rest):
    end = i
    while category[rest[end]] not in ("name", "det"):
      end += 1
    phrase, i = rest[i:end + 1], end + 1
    post = None
    if i < len(rest) and category[rest[i]] == "post":
      post, i = rest[i], i + 1
    phrases.append((phrase, post))

  def noun_phrase(phrase):
    if len(phrase) == 1:
      return [lex[phrase[0]][0]]
    noun, *adjectives, det = phrase
    return ([lex[det][lang.gender[noun]]]
            + [lex[a][0] for a in reversed(adjectives)] + [lex[noun][0]])

  (subject, _), *others = phrases
  target = noun_phrase(subject) + [lex[verb][0]]
  for phrase, post in others:
    if post is None:  # the object
      target += noun_phrase(phrase)
  for phrase, post in others:
    if post is not None:
      target += [lex[post][0]] + noun_phrase(phrase)
  return target + [lex[a][0] for a in adverb]


def test_target_follows_the_documented_grammar():
  lang = synthetic.language(0)
  sources, targets = synthetic.generate(0)["train"]
  for source, target in zip(sources[:3000], targets[:3000]):
    assert target.split() == _translate_by_hand(lang, source), source


def test_load_text_pairs_both_directions():
  sources, targets = data.load_text_pairs(synthetic_config(), "validation")
  assert (sources, targets) == tuple(
      list(x) for x in synthetic.generate(0)["validation"])
  back = data.load_text_pairs(
      synthetic_config(source_lang="tgt", target_lang="src"), "validation")
  assert back == (targets, sources)


@pytest.mark.parametrize("changes, message", [
    (dict(source_lang="en"), "no language 'en'"),
    (dict(target_lang="src"), "both 'src'"),
])
def test_bad_languages(changes, message):
  with pytest.raises(data.DataError, match=message):
    data.load_text_pairs(synthetic_config(**changes), "train")


def test_unknown_split():
  with pytest.raises(data.DataError, match="no split 'dev'.*validation"):
    data.load_text_pairs(synthetic_config(), "dev")
