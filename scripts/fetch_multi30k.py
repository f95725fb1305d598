r"""Fetches Multi30k (task 1, raw text) into the folder configs/multi30k.py reads.

    python scripts/fetch_multi30k.py --out=data/multi30k
    export MHA_MULTI30K_DIR=$PWD/data/multi30k     # or --config.data_dir=...
    python train.py --config=configs/multi30k.py --workdir=workdirs/m30k

The files are those of the multi30k/dataset repository on GitHub
(`data/task1/raw/{train,val,test_2016_flickr}.{de,en,fr}.gz`: 29,000 /
1,014 / 1,000 caption pairs, cased, untokenized), the corpus of the README's
Results. Each file is downloaded to a temporary name, checked (it must
decompress, and every language of a split must have the split's line
count), then renamed into place; a file already present and valid is kept.
A failed or partial download leaves nothing under the final name, and a
folder the run created is removed again if it failed before putting a file
in it.
"""
import argparse
import gzip
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib

BASE_URL = ("https://raw.githubusercontent.com/multi30k/dataset/master/"
            "data/task1/raw")
SPLITS = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}
LANGUAGES = ("de", "en", "fr")


class FetchError(Exception):
  """A file that could not be fetched or is not the expected one."""


def count_lines(path: str) -> int:
  """Lines of a gzip file; FetchError naming it if it does not decompress."""
  try:
    with gzip.open(path, "rt", encoding="utf-8") as f:
      return sum(1 for _ in f)
  except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
    raise FetchError(f"{path} is not a valid gzip text file ({e}).") from None


def fetch_file(url: str, path: str, expected_lines: int) -> bool:
  """Downloads `url` to `path` unless a valid copy is there.

  Returns:
    True if it downloaded, False if `path` was already valid.

  Raises:
    FetchError: the download failed or the file has the wrong line count;
      nothing is left at `path` in that case (an earlier file is kept).
  """
  if os.path.exists(path):
    try:
      if count_lines(path) == expected_lines:
        return False
    except FetchError:
      pass
  folder = os.path.dirname(os.path.abspath(path))
  try:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".fetch_")
  except OSError as e:
    raise FetchError(f"Cannot write into {folder}: {e.strerror}.") from None
  try:
    with os.fdopen(fd, "wb") as out:
      try:
        with urllib.request.urlopen(url, timeout=60) as response:
          shutil.copyfileobj(response, out)
      except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"Cannot download {url}: {e}.") from None
    lines = count_lines(tmp)
    if lines != expected_lines:
      raise FetchError(f"{url} has {lines} lines, expected {expected_lines}.")
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return True


def make_folder(out: str) -> list[str]:
  """Creates `out` and its missing parents; returns those it created,
  deepest first.

  Raises:
    FetchError: `out` is a file, or cannot be created (naming --out).
  """
  if os.path.exists(out) and not os.path.isdir(out):
    raise FetchError(f"--out={out} is a file, not a folder.")
  created = []
  path = os.path.abspath(out)
  while not os.path.exists(path):
    created.append(path)
    path = os.path.dirname(path)
  try:
    os.makedirs(out, exist_ok=True)
  except OSError as e:
    remove_empty(created)
    raise FetchError(f"--out={out}: cannot create the folder "
                     f"({e.strerror}).") from None
  return created


def remove_empty(folders: list[str]) -> None:
  """Removes each of `folders` (deepest first) that exists and is empty:
  a failed run leaves no folder of its own behind, and keeps any file."""
  for folder in folders:
    try:
      os.rmdir(folder)
    except OSError:
      return  # not empty (or gone): its parents are not empty either


def fetch(out: str, languages=LANGUAGES, base_url: str = BASE_URL
          ) -> list[str]:
  """Fetches every split of `languages` into `out`; returns the new files.

  Raises:
    FetchError: a file that could not be fetched; the folders this call
      created are removed again if nothing was put in them.
  """
  created = make_folder(out)
  fetched = []
  try:
    for split, lines in SPLITS.items():
      for lang in languages:
        name = f"{split}.{lang}.gz"
        if fetch_file(f"{base_url}/{name}", os.path.join(out, name), lines):
          fetched.append(name)
  except BaseException:
    remove_empty(created)
    raise
  return fetched


def check_base_url(url: str) -> None:
  """Raises FetchError naming --base_url unless it is a URL urllib reads."""
  scheme = urllib.parse.urlsplit(url).scheme
  if scheme not in ("http", "https", "ftp", "file"):
    raise FetchError(f"--base_url={url}: not a URL (expected https://..., "
                     "http://..., ftp://... or file://...).")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="Destination folder.")
  parser.add_argument("--languages", default=",".join(LANGUAGES),
                      help="Comma-separated (default de,en,fr).")
  parser.add_argument("--base_url", default=BASE_URL,
                      help="Where the .gz files are (a mirror, or file://).")
  args = parser.parse_args(argv)
  languages = [l.strip() for l in args.languages.split(",") if l.strip()]
  unknown = sorted(set(languages) - set(LANGUAGES))
  if unknown:
    print(f"fetch_multi30k.py: unknown language(s) {unknown}; Multi30k task "
          f"1 has {', '.join(LANGUAGES)}.", file=sys.stderr)
    return 1
  if not languages:
    print(f"fetch_multi30k.py: --languages={args.languages!r} names no "
          f"language; Multi30k task 1 has {', '.join(LANGUAGES)}.",
          file=sys.stderr)
    return 1
  try:
    check_base_url(args.base_url)
    fetched = fetch(args.out, languages, args.base_url.rstrip("/"))
  except FetchError as e:
    print(f"fetch_multi30k.py: {e}", file=sys.stderr)
    return 1
  print(f"{args.out}: {len(fetched)} file(s) fetched, "
        f"{len(SPLITS) * len(languages) - len(fetched)} already there.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
