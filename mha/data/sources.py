"""Raw sentence pairs of a split, from the dataset the config names.

`config.dataset_name` selects the source:

* `'synthetic'`: the made-up language pair of `mha.data.synthetic` (languages
  `src` and `tgt`; `config.synthetic_seed`, default 0, picks the language);
* `'parallel_text'`: the folder `config.data_dir` of `{split}.{lang}[.gz]`
  files, through the TFDS builder of `mha.data.parallel_text`, read through
  TFDS's random-access data source (no TensorFlow);
* anything else: a TFDS translation dataset by name, e.g.
  `'wmt14_translate/de-en'`, read from the TFDS data dir `config.data_dir`
  (None: the TFDS default), downloaded and prepared first if needed, and
  read with `tf.data` (TensorFlow is imported then, through
  `tensorflow_loader.import_tensorflow`).

`config.source_lang` and `config.target_lang` choose the direction. Splits
of TFDS datasets (and of parallel_text folders) accept TFDS slicing, e.g.
`'train[:1000]'`.
"""
import dataclasses
import hashlib
import re
from typing import Any, Callable, Iterator, Mapping

from absl import logging
import ml_collections

from mha.runtime import tensorflow_loader
from mha.data import multihost
from mha.data import synthetic
from mha.errors import DataError
from mha.errors import DatasetNotFound
from mha.errors import LanguageNotFound

Chunk = tuple[list[str], list[str]]


@dataclasses.dataclass(frozen=True)
class TextSplit:
  """One split of a dataset, in a given direction, not yet read.

  Attributes:
    key: identifies the split's content (dataset, version or file
      fingerprint, languages, split) for caches.
    description: a human-readable name for messages.
    read: `read(chunk_size)` iterates over (sources, targets) chunks in the
      split's order.
    size: the number of sentence pairs, or None if unknown (for progress
      lines).
  """
  key: str
  description: str
  read: Callable[[int], Iterator[Chunk]]
  size: int | None = None


def _check_languages(config: ml_collections.ConfigDict,
                     available: tuple[str, ...], dataset: str) -> None:
  for field in ("source_lang", "target_lang"):
    lang = config[field]
    if lang not in available:
      raise DataError(f"Dataset {dataset!r} has no language {lang!r} "
                      f"(config.{field}); its languages: "
                      f"{', '.join(sorted(available))}.")
  if config.source_lang == config.target_lang:
    raise DataError(f"config.source_lang and config.target_lang are both "
                    f"{config.source_lang!r}.")


def _split_names(split: str) -> list[str]:
  """The split names of a TFDS split spec: 'train[:10%]+val' -> [train, val].

  Raises:
    DataError: `split` is not a TFDS split spec.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    tfds.core.ReadInstruction.from_spec(split)
  except ValueError:
    raise DataError(
        f"Split {split!r} is not a TFDS split spec: a name, optionally "
        "sliced and joined, e.g. 'train', 'val[:40]', 'train[:10%]+val' "
        "(https://www.tensorflow.org/datasets/splits).") from None
  return [part.split("[")[0].strip() for part in split.split("+")]


def _check_slices(split: str, splits: Mapping[str, Any], where: str) -> None:
  """Refuses a slice of `split` (a TFDS split spec) that reaches beyond its
  split (TFDS would raise a ValueError when the split is read) or selects
  nothing.

  Args:
    split: e.g. 'val[5000:]' or 'train[:10]+val'.
    splits: the dataset's splits (a TFDS builder's `info.splits`).
    where: the dataset, for the message.

  Raises:
    DataError: naming the slice, its split and the split's size.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  for part in split.split("+"):
    name = part.split("[")[0].strip()
    if name not in splits:
      continue
    size = splits[name].num_examples
    try:
      (rows,) = tfds.core.ReadInstruction.from_spec(part).to_absolute(splits)
      inside = range(size)[rows.from_:rows.to]
    except ValueError:
      inside = None
    if not inside:
      what = "reaches beyond" if inside is None else "selects nothing of"
      raise DataError(
          f"Split {part.strip()!r} of {where} {what} split {name!r}, which "
          f"has {size} sentence pairs: slice within it (e.g. "
          f"'{name}[:{min(size, 100)}]').")


def _synthetic_split(config: ml_collections.ConfigDict, split: str
                     ) -> TextSplit:
  _check_languages(config, synthetic.LANGUAGES, "synthetic")
  # A split name, optionally sliced as in TFDS with example counts: 'test[:40]'.
  match = re.fullmatch(r"(\w+)(?:\[(-?\d*):(-?\d*)\])?", split.strip())
  if not match or match.group(1) not in synthetic.SPLIT_SIZES:
    raise DataError(f"The synthetic dataset has no split {split!r}; its "
                    f"splits: {', '.join(synthetic.SPLIT_SIZES)} (sliced as "
                    "e.g. 'test[:40]').")
  name = match.group(1)
  rows = slice(*(int(x) if x else None for x in match.group(2, 3)))
  size = synthetic.SPLIT_SIZES[name]
  if not range(size)[rows]:
    raise DataError(
        f"Split {split.strip()!r} of the synthetic dataset selects nothing "
        f"of split {name!r}, which has {size} sentence pairs: slice within "
        f"it (e.g. '{name}[:{min(size, 100)}]').")
  seed = int(config.get("synthetic_seed", 0))

  def read(chunk_size: int) -> Iterator[Chunk]:
    columns = dict(zip(synthetic.LANGUAGES, synthetic.generate(seed)[name]))
    sources = columns[config.source_lang][rows]
    targets = columns[config.target_lang][rows]
    for start in range(0, len(sources), chunk_size):
      yield (list(sources[start:start + chunk_size]),
             list(targets[start:start + chunk_size]))

  direction = f"{config.source_lang}-{config.target_lang}"
  return TextSplit(key=f"synthetic/seed{seed}/v1/{direction}/{split}",
                   description=f"synthetic {direction} {split}", read=read,
                   size=len(range(size)[rows]))


def _tfds_reader(builder, split: str, source_lang: str, target_lang: str
                 ) -> Callable[[int], Iterator[Chunk]]:
  """Reads a Translation-featured TFDS split in its stored order (tf.data)."""

  def read(chunk_size: int) -> Iterator[Chunk]:
    ds = builder.as_dataset(split=split, shuffle_files=False)
    for batch in ds.batch(chunk_size).as_numpy_iterator():
      yield ([s.decode("utf-8") for s in batch[source_lang]],
             [s.decode("utf-8") for s in batch[target_lang]])

  return read


def _data_source_reader(builder, split: str, source_lang: str,
                        target_lang: str) -> Callable[[int], Iterator[Chunk]]:
  """Reads a Translation-featured TFDS split stored as ArrayRecord, in its
  stored order, through the random-access data source (no TensorFlow)."""

  def read(chunk_size: int) -> Iterator[Chunk]:
    source = builder.as_data_source(split=split)
    for start in range(0, len(source), chunk_size):
      examples = source.__getitems__(
          range(start, min(start + chunk_size, len(source))))
      yield ([e[source_lang].decode("utf-8") for e in examples],
             [e[target_lang].decode("utf-8") for e in examples])

  return read


def _split_size(builder, split: str) -> int | None:
  """The number of examples of a TFDS split spec, None if TFDS has none."""
  try:
    return builder.info.splits[split].num_examples
  except (KeyError, ValueError):
    return None


def _parallel_text_split(config: ml_collections.ConfigDict, split: str
                         ) -> TextSplit:
  # Imports TFDS; kept out of module import time.
  from mha.data import parallel_text  # pylint: disable=g-import-not-at-top
  languages = (config.source_lang, config.target_lang)
  if config.source_lang == config.target_lang:
    _check_languages(config, languages, "parallel_text")
  for name in _split_names(split):
    parallel_text.split_files(config.data_dir, name, languages)
  builder = parallel_text.make_builder(config.data_dir, languages)
  _check_slices(split, builder.info.splits,
                config.data_dir)
  direction = f"{config.source_lang}-{config.target_lang}"
  return TextSplit(
      key=f"parallel_text/{builder.builder_config.name}/{direction}/{split}",
      description=f"{config.data_dir} {direction} {split}",
      read=_data_source_reader(builder, split, config.source_lang,
                               config.target_lang),
      size=_split_size(builder, split))


def _tfds_split(config: ml_collections.ConfigDict, split: str) -> TextSplit:
  # Preparing and reading (tf.data) a dataset by name may import TensorFlow:
  # imported first, with its start-up lines hidden when asked.
  name = config.dataset_name
  tensorflow_loader.import_tensorflow(
      f"config.dataset_name={name!r} (a TFDS dataset by name)")
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    builder = tfds.builder(name, data_dir=config.data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise DatasetNotFound(
        f"Unknown TFDS dataset {name!r} (config.dataset_name): "
        f"{str(e).splitlines()[0].rstrip('.')}. Use a TFDS translation "
        "dataset, 'parallel_text' or 'synthetic'.") from None
  except (ValueError, KeyError) as e:
    raise DataError(f"Cannot build TFDS dataset {name!r} "
                    f"(config.dataset_name): {e}") from None
  features = builder.info.features
  available = tuple(getattr(features, "keys", lambda: ())())
  _check_languages(config, available, name)
  if not builder.is_prepared():
    logging.info("Preparing TFDS dataset %s in %s (may download).", name,
                 builder.data_dir)
    try:
      builder.download_and_prepare()
    except OSError as e:  # requests' errors too: no network, a refused URL
      raise DataError(
          f"Cannot prepare TFDS dataset {name!r} (config.dataset_name) in "
          f"{builder.data_dir}, which downloads its files on first use "
          f"({type(e).__name__}: {(str(e).splitlines() or [''])[0]}): run "
          "where the network reaches them, or prepare it elsewhere (`tfds "
          "build`) and give its folder as config.data_dir.") from None
  known = list(builder.info.splits.keys())
  for split_name in _split_names(split):
    if known and split_name not in known:
      raise DataError(f"TFDS dataset {name!r} has no split {split_name!r} "
                      f"(from {split!r}); its splits: {', '.join(known)}.")
  _check_slices(split, builder.info.splits,
                f"TFDS dataset {name!r}")
  direction = f"{config.source_lang}-{config.target_lang}"
  return TextSplit(
      key=(f"tfds/{name}/{builder.version}/{config.data_dir}/{direction}/"
           f"{split}"),
      description=f"{name} {direction} {split}",
      read=_tfds_reader(builder, split, config.source_lang,
                        config.target_lang),
      size=_split_size(builder, split))


def open_split(config: ml_collections.ConfigDict, split: str) -> TextSplit:
  """The split `split` of the config's dataset, checked but not yet read.

  Raises:
    DataError: unknown dataset, language or split, or bad files.
  """
  if not split:
    raise DataError("Empty split name.")
  if config.dataset_name == "synthetic":
    return _synthetic_split(config, split)
  if config.dataset_name == "parallel_text":
    return _parallel_text_split(config, split)
  return _tfds_split(config, split)


def load_text_pairs(config: ml_collections.ConfigDict, split: str
                    ) -> tuple[list[str], list[str]]:
  """The raw (sources, targets) of a split, in the split's order.

  Raises:
    DataError: unknown dataset, language or split, bad files, or an empty
      split.
  """
  text_split = open_split(config, split)
  sources, targets = [], []
  for chunk_sources, chunk_targets in text_split.read(8192):
    sources.extend(chunk_sources)
    targets.extend(chunk_targets)
  if not sources:
    raise DataError(f"Split {text_split.description} is empty.")
  return sources, targets


def cache_key(text_split: TextSplit, *parts: str) -> str:
  """A short file-name-safe hash of a split's key and extra parts."""
  text = "|".join((text_split.key,) + parts)
  return hashlib.sha256(text.encode()).hexdigest()[:20]


def prepare_splits(config: ml_collections.ConfigDict) -> None:
  """Several processes: process 0 opens the config's three splits first.

  Opening a split of a TFDS dataset downloads and prepares it when its data
  dir lacks it (`open_split`); a parallel_text folder is prepared the same
  way. The other processes open the splits once process 0 has, and
  find them prepared. A single process does nothing here: the trainer opens
  the splits itself.

  Raises:
    DataError: a split that cannot be opened, as `config.<field>=...`.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return
  multihost.process_zero_first(f"prepare dataset {config.dataset_name!r}",
                               lambda: open_config_splits(config))


def open_config_splits(config: ml_collections.ConfigDict) -> None:
  """Opens (without reading) the train, eval and test splits the config
  names.

  Raises:
    DataError: a split that cannot be opened, as `config.<field>=...`; an
      unknown dataset (`DatasetNotFound`) as `config.dataset_name`, a
      language without files as `config.source_lang` or `target_lang`.
  """
  for field in ("train_split", "eval_split", "test_split"):
    try:
      open_split(config, config[field])
    except DatasetNotFound:
      raise
    except DataError as e:
      where = f"config.{field}={config[field]!r}"
      if isinstance(e, LanguageNotFound):  # the field that names it
        named = [name for name in ("source_lang", "target_lang")
                 if config.get(name) == e.language]
        where = f"config.{named[0]}={e.language!r}" if named else where
      raise DataError(f"{where}: {e}") from None
