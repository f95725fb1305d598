"""bench/data_setup.py's generated corpus: as many aligned pairs as asked,
each two Multi30k pairs joined on both sides; Multi30k's other splits."""
import gzip
import importlib.util
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _bench():
  spec = importlib.util.spec_from_file_location(
      "data_setup", REPO / "bench" / "data_setup.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _lines(path: pathlib.Path) -> list[str]:
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt", encoding="utf-8") as f:
    return f.read().splitlines()


def test_the_corpus_joins_aligned_multi30k_pairs(tmp_path, multi30k):
  bench = _bench()
  folder = tmp_path / "corpus"
  bench.make_corpus(str(multi30k), str(folder), 1200)
  de, en = (_lines(folder / f"train.{lang}") for lang in ("de", "en"))
  assert len(de) == len(en) == 1200
  source = {lang: _lines(multi30k / f"train.{lang}.gz")
            for lang in ("de", "en")}
  index = {}
  for i, sentence in enumerate(source["de"]):
    index.setdefault(sentence, []).append(i)
  for k in range(0, 1200, 97):
    # Some split of line k into two German sentences whose English
    # sentences make line k of the English file.
    words = de[k].split(" ")
    found = [
        (a, b) for cut in range(1, len(words))
        for a in index.get(" ".join(words[:cut]), ())
        for b in index.get(" ".join(words[cut:]), ())
        if en[k] == f"{source['en'][a]} {source['en'][b]}"]
    assert found, k
  for name in ("val.de.gz", "test_2016_flickr.en.gz"):
    assert (folder / name).read_bytes() == (multi30k / name).read_bytes()
  assert not list(folder.glob("*.part"))
