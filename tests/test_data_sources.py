"""Dataset sources: local parallel text (TFDS builder), TFDS by name, errors."""
import gzip
import os
import pathlib
import re
import subprocess
import sys

from etils import epath
import pytest
import requests
import tensorflow_datasets as tfds

from conftest import tiny_config
from configs import base
from mha import data
from mha.data import parallel_text
from mha.data import sources

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _tfds_dir(tmp_path_factory, monkeypatch):
  """Prepared parallel_text folders go to one temporary TFDS dir per module,
  so Multi30k is prepared once and ~/tensorflow_datasets is left alone."""
  monkeypatch.setenv("MHA_TFDS_DIR", str(tmp_path_factory.getbasetemp()
                                         / "tfds"))


def _config(**changes):
  config = base.get_config("tiny")
  config.update(dict(dataset_name="parallel_text", source_lang="de",
                     target_lang="en"))
  config.update(changes)
  return config


def _write(folder, name, lines, raw=None):
  folder.mkdir(parents=True, exist_ok=True)
  content = raw if raw is not None else "".join(f"{l}\n" for l in lines)
  if isinstance(content, str):
    content = content.encode()
  path = folder / name
  if name.endswith(".gz"):
    with gzip.open(path, "wb") as f:
      f.write(content)
  else:
    path.write_bytes(content)
  return path


def _gz_lines(path):
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return f.read().split("\n")[:-1]


def test_multi30k_line_counts_through_the_builder(multi30k):
  config = _config(data_dir=str(multi30k))
  expected = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}
  for split, count in expected.items():
    sources, targets = data.load_text_pairs(config, split)
    assert len(sources) == len(targets) == count
  # In file order, line for line.
  assert sources == _gz_lines(multi30k / "test_2016_flickr.de.gz")
  assert targets == _gz_lines(multi30k / "test_2016_flickr.en.gz")
  # Cached under MHA_TFDS_DIR, keyed by the folder.
  prepared = os.listdir(os.path.join(os.environ["MHA_TFDS_DIR"],
                                     "parallel_text"))
  assert any(name.startswith("de-en-") for name in prepared)


def test_multi30k_other_direction_and_slices(multi30k):
  config = _config(data_dir=str(multi30k), source_lang="en",
                   target_lang="fr")
  sources, targets = data.load_text_pairs(config, "val[:10]")
  assert sources == _gz_lines(multi30k / "val.en.gz")[:10]
  assert targets == _gz_lines(multi30k / "val.fr.gz")[:10]


def test_parallel_text_plain_and_gz_files(tmp_path):
  folder = tmp_path / "corpus"
  _write(folder, "train.de", ["eins", "zwei", "drei"])
  _write(folder, "train.en.gz", ["one", "two", "three"])
  sources, targets = data.load_text_pairs(_config(data_dir=str(folder)),
                                          "train")
  assert sources == ["eins", "zwei", "drei"]
  assert targets == ["one", "two", "three"]


def test_a_slice_beyond_a_parallel_text_split_is_one_line(tmp_path):
  # TFDS raised its own ValueError ('Requested slice [5000:3] incompatible
  # with 3 examples') when the split was read: now one DataError naming the
  # slice, the split and its size, before anything is read.
  folder = tmp_path / "corpus"
  _write(folder, "val.de", ["eins", "zwei", "drei"])
  _write(folder, "val.en", ["one", "two", "three"])
  config = _config(data_dir=str(folder))
  for split, what in (("val[5000:]", "reaches beyond"),
                      ("val[:4]", "reaches beyond"),
                      ("val[-4:]", "reaches beyond"),
                      ("val[:1]+val[4:]", "reaches beyond"),
                      ("val[3:]", "selects nothing of")):
    part = split.split("+")[-1]
    with pytest.raises(data.DataError) as refused:
      data.load_text_pairs(config, split)
    assert str(refused.value) == (
        f"Split {part!r} of {folder} {what} split 'val', which has 3 "
        "sentence pairs: slice within it (e.g. 'val[:3]').")
  # Slices inside the split read as TFDS reads them.
  assert data.load_text_pairs(config, "val[-2:]")[0] == ["zwei", "drei"]
  assert data.load_text_pairs(config, "val[:1]+val[2:]")[1] == ["one",
                                                                  "three"]


def test_an_empty_slice_of_the_synthetic_pair_names_the_split_and_its_size():
  config = tiny_config()
  assert config.dataset_name == "synthetic"
  for split in ("test[500:]", "test[3:3]", "test[-1:-1]"):
    with pytest.raises(data.DataError) as refused:
      data.load_text_pairs(config, split)
    assert str(refused.value) == (
        f"Split {split!r} of the synthetic dataset selects nothing of split "
        "'test', which has 500 sentence pairs: slice within it (e.g. "
        "'test[:100]').")
  sources, targets = data.load_text_pairs(config, "test[-2:]")
  assert len(sources) == len(targets) == 2
  assert sources == data.load_text_pairs(config, "test")[0][-2:]


@pytest.mark.parametrize("dataset", ["synthetic", "parallel_text"])
def test_a_missing_split_is_one_line_without_leading_spaces(tmp_path,
                                                             dataset):
  folder = tmp_path / "corpus"
  _write(folder, "val.de", ["eins"])
  _write(folder, "val.en", ["one"])
  config = (tiny_config() if dataset == "synthetic"
            else _config(data_dir=str(folder)))
  assert config.dataset_name == dataset
  with pytest.raises(data.DataError) as refused:
    data.load_text_pairs(config, "nosuch")
  message = str(refused.value)
  assert message == " ".join(message.split()), repr(message)
  assert "'nosuch'" in message and ("val" in message or "test" in message)


def test_cache_keyed_by_folder_and_contents(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  for folder, words in ((a, ("x", "y")), (b, ("p", "q"))):
    _write(folder, "train.de", words)
    _write(folder, "train.en", words)
  assert data.load_text_pairs(_config(data_dir=str(a)), "train")[0] == [
      "x", "y"]
  assert data.load_text_pairs(_config(data_dir=str(b)), "train")[0] == [
      "p", "q"]
  _write(a, "train.de", ["changed", "too"])
  _write(a, "train.en", ["changed", "too"])
  assert data.load_text_pairs(_config(data_dir=str(a)), "train")[0] == [
      "changed", "too"]
  # An edit that keeps the size is seen by its modification time.
  for name in ("train.de", "train.en"):
    mtime = (b / name).stat().st_mtime_ns + 1_000_000_000
    os.utime(_write(b, name, ["r", "s"]), ns=(mtime, mtime))
  assert data.load_text_pairs(_config(data_dir=str(b)), "train")[0] == [
      "r", "s"]


def test_tfds_dir_is_mha_tfds_dir_then_tfds_data_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("MHA_TFDS_DIR", "/mha")
  monkeypatch.setenv("TFDS_DATA_DIR", "/tfds")
  assert parallel_text.tfds_dir() == "/mha"
  monkeypatch.delenv("MHA_TFDS_DIR")
  assert parallel_text.tfds_dir() == "/tfds"
  monkeypatch.delenv("TFDS_DATA_DIR")
  monkeypatch.setenv("HOME", str(tmp_path))
  assert parallel_text.tfds_dir() == str(tmp_path / "tensorflow_datasets")


@pytest.mark.parametrize("files, split, message", [
    ({}, "train", "does not exist"),
    ({"train.de": ["a"], "val.de": ["a"], "val.en": ["b"]}, "train",
     r"Missing file .*train\.en.*splits with files for de-en: val"),
    ({"train.de": ["a", "b"], "train.en": ["a"]}, "train",
     r"different line counts.*train\.de: 2 lines.*train\.en: 1 lines"),
    ({"train.de": [], "train.en": []}, "train", "Split 'train' is empty"),
    ({"train.de": ["a"], "train.en": ["b"]}, "test",
     r"Missing file .*test\.de.*splits with files for de-en: train"),
    ({"train.de": ["a"], "train.fr": ["b"]}, "train",
     "Language 'en' has no file.*languages found: de, fr"),
    ({"train.de": ["a"], "train.en": ["b"]}, "train[:x]",
     r"Split 'train\[:x\]' is not a TFDS split spec"),
])
def test_parallel_text_bad_folders(tmp_path, files, split, message):
  folder = tmp_path / "corpus"
  for name, lines in files.items():
    _write(folder, name, lines)
  with pytest.raises(data.DataError, match=message):
    data.load_text_pairs(_config(data_dir=str(folder)), split)


def test_parallel_text_invalid_utf8_names_file_and_line(tmp_path):
  folder = tmp_path / "corpus"
  _write(folder, "train.de.gz", None, raw=b"gut\nauch gut\nkaputt \xff\n")
  _write(folder, "train.en", ["good", "also good", "broken"])
  with pytest.raises(data.DataError,
                     match=r"train\.de\.gz, line 3: invalid UTF-8"):
    data.load_text_pairs(_config(data_dir=str(folder)), "train")


def test_parallel_text_needs_data_dir():
  with pytest.raises(data.DataError, match="config.data_dir"):
    data.load_text_pairs(_config(data_dir=None), "train")


def test_read_lines_keeps_empty_lines_and_strips_crlf(tmp_path):
  path = _write(tmp_path, "x.de", None, raw=b"a\r\n\nb")
  assert parallel_text.read_lines(str(path)) == ["a", "", "b"]


# TFDS datasets by name.


def _wmt_config(**changes):
  config = base.get_config("tiny")
  config.update(dict(dataset_name="wmt14_translate/de-en", source_lang="en",
                     target_lang="de", data_dir=None))
  config.update(changes)
  return config


def test_wmt_by_name_with_mock_data(tmp_path):
  config = _wmt_config(vocab_size=40, max_source_length=64,
                       max_target_length=64, max_len=64)
  with tfds.testing.mock_data(num_examples=50,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    sources, targets = data.load_text_pairs(config, "train")
    assert len(sources) == len(targets) == 50
    assert sources != targets
    tok = data.get_tokenizer(config, str(tmp_path))
    batch = next(data.train_batches(config, tok, process_index=0,
                                    process_count=1, num_global_devices=4))
    assert batch["inputs"].shape[0] % 4 == 0
    evaluation = data.eval_batches(config, tok, config.eval_split,
                                   num_global_devices=4, process_index=0,
                                   process_count=1)
    assert sum(int((b["targets"][:, 0] != 0).sum()) for b in evaluation) == 50
    reverse = _wmt_config(source_lang="de", target_lang="en")
    assert data.load_text_pairs(reverse, "train") == (targets, sources)


def test_wmt_language_it_does_not_have():
  with tfds.testing.mock_data(num_examples=2,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    with pytest.raises(data.DataError,
                       match="no language 'fr'.*languages: de, en"):
      data.load_text_pairs(_wmt_config(target_lang="fr"), "train")


def test_a_language_without_files_is_named_as_its_field(tmp_path):
  folder = tmp_path / "corpus"
  for name in ("train.de", "train.en"):
    _write(folder, name, ["a"])
  for field in ("source_lang", "target_lang"):
    config = _config(data_dir=str(folder), **{field: "dee"})
    with pytest.raises(data.DataError, match=(
        rf"^config.{field}='dee': Language 'dee' has no file in .*"
        r"\(languages found: de, en\)")):
      sources.open_config_splits(config)


def test_unknown_tfds_dataset():
  config = _wmt_config(dataset_name="nosuch_translate/de-en")
  with pytest.raises(data.DataError, match="Unknown TFDS dataset 'nosuch"):
    data.load_text_pairs(config, "train")
  # Training names the field at fault, not the split it was opening.
  from mha.train import setup as train_setup  # pylint: disable=g-import-not-at-top
  from mha.store import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(data.DataError) as error:
    train_setup.check_inputs(config, workdir_lib.Workdir("/nonexistent/run"))
  assert re.fullmatch(
      r"Unknown TFDS dataset 'nosuch_translate/de-en' \(config.dataset_name\)"
      r": .*[^.]\. Use a TFDS translation dataset, 'parallel_text' or "
      r"'synthetic'\.", str(error.value)), str(error.value)


def test_wmt_download_failure_is_one_line(tmp_path, monkeypatch):
  """The real WMT14 builder prepared with the network down: the download
  manager is made (tensorflow/datasets#11212 broke it: a module TFDS
  imports without requiring it) and the failed download is one line that
  names the dataset and the way out; nothing is downloaded."""
  def offline(self, url_or_urls):
    raise requests.exceptions.ConnectionError(
        "HTTPConnectionPool(host='www.statmt.org', port=80): Failed to "
        "resolve 'www.statmt.org'\n(second line)")

  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract",
                      offline)
  with pytest.raises(data.DataError) as error:
    data.load_text_pairs(_wmt_config(data_dir=str(tmp_path)), "train")
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(
      "Cannot prepare TFDS dataset 'wmt14_translate/de-en' "
      f"(config.dataset_name) in {tmp_path}")
  assert ("(ConnectionError: HTTPConnectionPool(host='www.statmt.org', port=80)"
          ": Failed to resolve 'www.statmt.org'): run where") in message
  assert message.endswith("give its folder as config.data_dir.")


class TinyTranslate(tfds.core.GeneratorBasedBuilder):
  """A registered translation dataset, prepared offline from code."""
  VERSION = tfds.core.Version("1.0.0")
  code_path = None  # see mha/data/parallel_text.py
  # Metadata (README, citations) would be looked up beside the code, which
  # needs a package; the tests folder is not one.
  pkg_dir_path = epath.Path(__file__).parent

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.Translation(languages=("de", "en")),
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(5),
            "dev": self._generate_examples(2)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {"de": f"satz {i}", "en": f"sentence {i}"}


def test_tfds_by_name_prepared_offline_and_unknown_split(tmp_path):
  config = _wmt_config(dataset_name="tiny_translate", data_dir=str(tmp_path),
                       source_lang="de", target_lang="en")
  assert data.load_text_pairs(config, "dev") == (
      ["satz 0", "satz 1"], ["sentence 0", "sentence 1"])
  assert len(data.load_text_pairs(config, "train[:3]")[0]) == 3
  with pytest.raises(data.DataError,
                     match="no split 'validation'.*splits: (train, dev|dev, "
                     "train)"):
    data.load_text_pairs(config, "validation")


def test_parallel_text_is_read_without_tensorflow(tmp_path):
  # A fresh interpreter (this one has TensorFlow from other tests) prepares
  # and reads a folder: ArrayRecord files, no TensorFlow imported.
  folder = tmp_path / "corpus"
  _write(folder, "train.de", ["eins", "zwei", "drei"])
  _write(folder, "train.en", ["one", "two", "three"])
  script = (
      "import sys; from configs import base; from mha import data; "
      "config = base.get_config('tiny'); "
      "config.update(dict(dataset_name='parallel_text', source_lang='en', "
      f"target_lang='de', data_dir={str(folder)!r})); "
      "print(data.load_text_pairs(config, 'train[1:]')); "
      "print('tensorflow' in sys.modules)")
  env = dict(os.environ, MHA_TFDS_DIR=str(tmp_path / "tfds"))
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120,
                          check=True)
  # TFDS prints its own progress lines first.
  assert result.stdout.splitlines()[-2:] == [
      "(['two', 'three'], ['zwei', 'drei'])", "False"], result.stderr
  stored = [p.name for p in (tmp_path / "tfds").rglob("*-train.*")]
  assert stored and all(".array_record-" in name for name in stored), stored
