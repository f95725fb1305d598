"""A TFDS builder for a local folder of parallel text files.

The folder holds one sentence per line in `{split}.{lang}` or
`{split}.{lang}.gz` files, line i of `{split}.{source}` translating line i of
`{split}.{target}` (Multi30k: `train.de.gz`, `val.en.gz`,
`test_2016_flickr.fr.gz`, ...). The split name is the file prefix.

The folder is prepared once per language pair by a real
`tfds.core.GeneratorBasedBuilder`, stored as ArrayRecord files (read back
through TFDS's random-access data source, which needs no TensorFlow: a
training run on local text never imports it), and cached under a TFDS data
dir: the
environment variable `MHA_TFDS_DIR`, else `TFDS_DATA_DIR`, else
`~/tensorflow_datasets` (never under the data folder, which may be
read-only). The cache is keyed by the folder's absolute path and the names,
sizes and modification times of its files, so different folders, or a folder
whose files changed, never share a cache entry:
`<tfds dir>/parallel_text/<lang1>-<lang2>-<fingerprint>/<VERSION>/`.

Files are checked before preparation; a bad folder raises one `DataError`
naming the folder, file, split or line (missing folder or file, a directory
where a file should be, different line counts, empty split, invalid UTF-8, a
damaged gzip file). A UTF-8 byte order mark at the start of a file is
dropped.
"""
import dataclasses
import hashlib
import os
import re

from absl import logging
import tensorflow_datasets as tfds

from mha.data import multihost
from mha.data.progress import Progress
from mha.errors import DataError
from mha.errors import LanguageNotFound
from mha.runtime.files import read_lines

_FILE_RE = re.compile(r"^(?P<split>.+?)\.(?P<lang>[A-Za-z][A-Za-z0-9_-]{0,15})"
                      r"(?P<gz>\.gz)?$")
_SPLIT_RE = re.compile(r"^[A-Za-z0-9_]+$")


def tfds_dir() -> str:
  """The TFDS data dir where prepared parallel_text folders are cached."""
  for var in ("MHA_TFDS_DIR", "TFDS_DATA_DIR"):
    if os.environ.get(var):
      return os.environ[var]
  return os.path.join(os.path.expanduser("~"), "tensorflow_datasets")


def scan_folder(folder: str) -> dict[str, dict[str, str]]:
  """The text files of `folder`: split -> language -> path.

  Raises:
    DataError: the folder does not exist, or a split has both `x.lang` and
      `x.lang.gz`.
  """
  if not folder:
    raise DataError("dataset_name='parallel_text' needs config.data_dir, the "
                    "folder of {split}.{lang}[.gz] files; it is not set.")
  if not os.path.isdir(folder):
    raise DataError(f"Parallel text folder {folder!r} (config.data_dir) does "
                    "not exist or is not a directory.")
  splits: dict[str, dict[str, str]] = {}
  for name in sorted(os.listdir(folder)):
    match = _FILE_RE.match(name)
    path = os.path.join(folder, name)
    if not match or not os.path.isfile(path):
      continue
    langs = splits.setdefault(match["split"], {})
    lang = match["lang"]
    if lang in langs:
      raise DataError(f"Split {match['split']!r} of language {lang!r} has two "
                      f"files in {folder!r}: {os.path.basename(langs[lang])} "
                      f"and {name}; keep one.")
    langs[lang] = path
  return splits


def split_files(folder: str, split: str, languages: tuple[str, ...]
                ) -> dict[str, str]:
  """The file of each language of `split` in `folder`.

  Raises:
    DataError: a language appears in no file of the folder, or the split
      lacks the file of a language (or it is a directory).
  """
  splits = scan_folder(folder)
  found = sorted({lang for langs in splits.values() for lang in langs})
  for lang in languages:
    if lang not in found:
      raise LanguageNotFound(
          f"Language {lang!r} has no file in {folder!r} (languages found: "
          f"{', '.join(found) or 'none'}); expected files like "
          f"{split}.{lang} or {split}.{lang}.gz.", lang)
  files = splits.get(split, {})
  for lang in languages:
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
      if lang not in files and os.path.isdir(os.path.join(folder, name)):
        raise DataError(f"{os.path.join(folder, name)} is a directory, not "
                        f"the text file of split {split!r}, language "
                        f"{lang!r}.")
    if lang not in files:
      pair_splits = sorted(s for s, langs in splits.items()
                           if all(l in langs for l in languages))
      raise DataError(
          f"Missing file {os.path.join(folder, f'{split}.{lang}')}[.gz] for "
          f"split {split!r}; splits with files for {'-'.join(languages)}: "
          f"{', '.join(pair_splits) or 'none'}.")
  return {lang: files[lang] for lang in languages}


def check_split(split: str, files: dict[str, str]) -> int:
  """Checks the files of one split; returns its number of sentence pairs.

  Raises:
    DataError: invalid split name, unreadable or invalid UTF-8 file,
      different line counts, or an empty split.
  """
  if not _SPLIT_RE.match(split) or split.lower() == "all":
    raise DataError(f"Split name {split!r} (from {sorted(files.values())}) "
                    "must be letters, digits and '_' (and not 'all'); rename "
                    "the files.")
  counts = {path: len(read_lines(path)) for path in files.values()}
  if len(set(counts.values())) > 1:
    detail = ", ".join(f"{p}: {n} lines" for p, n in counts.items())
    raise DataError(f"Split {split!r}: the files have different line counts "
                    f"({detail}); line i of each must translate line i of "
                    "the others.")
  (count,) = set(counts.values())
  if count == 0:
    raise DataError(f"Split {split!r} is empty: "
                    f"{', '.join(files.values())} have no lines.")
  return count


@dataclasses.dataclass(eq=False)
class ParallelTextConfig(tfds.core.BuilderConfig):
  """One folder and language pair.

  Attributes:
    folder: absolute path of the folder.
    languages: the two languages, sorted.
    splits: split -> ((language, path), ...) of every split that has files
      for both languages.
  """
  folder: str = ""
  languages: tuple[str, ...] = ()
  splits: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()


class ParallelText(tfds.core.GeneratorBasedBuilder):
  """Sentence-aligned text files of a local folder, as a TFDS dataset."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {
      "1.0.0": "Initial release.",
      "1.0.1": "A UTF-8 byte order mark at the start of a file is dropped.",
      "1.1.0": "Stored as ArrayRecord (was TFRecord), read without "
               "TensorFlow.",
  }
  # The format of the prepared files (FILE_FORMAT: `download_and_prepare`).
  FILE_FORMAT = "array_record"
  BUILDER_CONFIGS = []  # Made per folder by `make_builder`.
  # No checksums or metadata files beside the code. (TFDS 4.9.10 would
  # otherwise need the `importlib_resources` package to locate them.)
  code_path = None

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=f"Parallel text of {self.builder_config.folder}.",
        features=tfds.features.Translation(
            languages=self.builder_config.languages),
        supervised_keys=None,
        # Keep the files' line order: evaluation compares line by line.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {split: self._generate_examples(dict(files))
            for split, files in self.builder_config.splits}

  # Counts the examples generated (`make_builder` sets it while preparing).
  progress: Progress | None = None

  def _generate_examples(self, files: dict[str, str]):
    columns = {lang: read_lines(path) for lang, path in files.items()}
    for i, texts in enumerate(zip(*columns.values())):
      yield i, dict(zip(columns, texts))
      if self.progress is not None:
        self.progress.add(1)


def _fingerprint(folder: str, splits) -> str:
  """A hash of the folder path and its files' names, sizes and mtimes."""
  h = hashlib.sha256(folder.encode())
  for split, files in splits:
    for lang, path in files:
      st = os.stat(path)
      h.update(f"|{split}|{lang}|{os.path.basename(path)}|{st.st_size}|"
               f"{st.st_mtime_ns}".encode())
  return h.hexdigest()[:16]


def make_builder(folder: str, languages: tuple[str, str]) -> ParallelText:
  """The prepared builder of `folder` for a language pair.

  Prepares (checks and converts) the folder's splits that have files for
  both languages on first use; later calls read the TFDS cache. With
  several processes, process 0 prepares while the others wait
  (`multihost.process_zero_first`).
  """
  folder = os.path.abspath(folder)
  languages = tuple(sorted(languages))
  all_splits = scan_folder(folder)
  splits = tuple(
      (split, tuple((lang, files[lang]) for lang in languages))
      for split, files in sorted(all_splits.items())
      if all(lang in files for lang in languages))
  if not splits:
    # Raises a DataError naming what is missing.
    split_files(folder, "train", languages)
  config = ParallelTextConfig(
      name=f"{'-'.join(languages)}-{_fingerprint(folder, splits)}",
      description=f"{'-'.join(languages)} text of {folder}",
      folder=folder, languages=languages, splits=splits)

  def prepare():
    builder = ParallelText(config=config, data_dir=tfds_dir())
    if not builder.is_prepared():
      total = sum(check_split(split, dict(files)) for split, files in splits)
      with Progress(f"Preparing {folder} ({config.name})", total) as counter:
        builder.progress = counter
        builder.download_and_prepare(file_format=ParallelText.FILE_FORMAT)
      logging.info("Prepared %d pairs of %s in %.0f s.", total, folder,
                   counter.elapsed())
    return builder

  return multihost.process_zero_first(f"prepare {folder}", prepare)
