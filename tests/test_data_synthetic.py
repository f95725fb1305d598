"""The synthetic language pair: deterministic, reordered, disjoint splits."""
import pytest

from configs import base
from mha import data
from mha.data import synthetic


def _config(**changes):
  config = base.get_config("tiny")
  config.update(dict(dataset_name="synthetic", source_lang="src",
                     target_lang="tgt"))
  config.update(changes)
  return config


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


def test_split_sizes_lengths_and_vocabulary():
  splits = synthetic.generate(0)
  assert {k: len(v[0]) for k, v in splits.items()} == {
      "test": 500, "validation": 500, "train": 30_000}
  sources = [s for split in splits.values() for s in split[0]]
  targets = [t for split in splits.values() for t in split[1]]
  assert all(3 <= len(s.split()) <= 12 for s in sources)
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


def test_load_text_pairs_both_directions():
  sources, targets = data.load_text_pairs(_config(), "validation")
  assert (sources, targets) == tuple(
      list(x) for x in synthetic.generate(0)["validation"])
  back = data.load_text_pairs(_config(source_lang="tgt", target_lang="src"),
                              "validation")
  assert back == (targets, sources)


@pytest.mark.parametrize("changes, message", [
    (dict(source_lang="en"), "no language 'en'"),
    (dict(target_lang="src"), "both 'src'"),
])
def test_bad_languages(changes, message):
  with pytest.raises(data.DataError, match=message):
    data.load_text_pairs(_config(**changes), "train")


def test_unknown_split():
  with pytest.raises(data.DataError, match="no split 'dev'.*validation"):
    data.load_text_pairs(_config(), "dev")
