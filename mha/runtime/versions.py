"""The Python, JAX and flax versions mha runs on, checked at `import mha`.

Two worlds are tested (the locks fork on the Python version, see
pyproject.toml): Python 3.11 with JAX 0.10.2 and flax 0.12.8, and Python
3.12-3.14 with JAX 0.12 and flax 0.12 (JAX 0.11 and later need Python
3.12). Outside them, `check` stops the import with one line naming the
versions found and the ones supported, instead of an error from deep inside
flax or JAX. This module imports nothing but the standard library and
mha.errors, and parses on older Pythons, so that the check runs there.
"""
from __future__ import annotations

import glob
import os
import re
import sys

from mha.errors import UnsupportedVersions

# The first Python supported (the locks cover 3.11 to 3.14).
PYTHON = (3, 11)
# {distribution: (first version supported, first version not)}: the
# ranges of pyproject.toml (tests/test_packaging.py checks that they agree).
RANGES = {"jax": ((0, 10, 2), (0, 13)), "jaxlib": ((0, 10, 2), (0, 13)),
          "flax": ((0, 12, 8), (0, 13))}
INSTALL = ("install mha's locks: pip install -r requirements.txt -e . "
           "(README.md, 'Set-up commands')")


def release(version: str) -> tuple[int, ...]:
  """The leading numbers of a version string: '0.12.0.1' -> (0, 12, 0, 1),
  '0.13.0.dev20261101' -> (0, 13, 0)."""
  match = re.match(r"\d+(?:\.\d+)*", version)
  return tuple(int(n) for n in match.group().split(".")) if match else ()


def _text(version: tuple[int, ...]) -> str:
  return ".".join(map(str, version))


def installed(name: str) -> str | None:
  """The installed version of the distribution `name`, or None: read from
  the name of its .dist-info folder on sys.path (importlib.metadata, which
  costs ~0.1 s of start-up, only where there is none: an egg, a source
  tree)."""
  for folder in sys.path:
    found = glob.glob(os.path.join(glob.escape(folder or "."),
                                   f"{name}-*.dist-info"))
    if found:
      return os.path.basename(found[0])[len(name) + 1:-len(".dist-info")]
  import importlib.metadata  # pylint: disable=import-outside-toplevel
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def problems(python: tuple[int, ...], found: dict) -> list[str]:
  """What is outside the supported versions: `python` (sys.version_info's
  first three) and `found` ({distribution: version string, or None when
  not installed}). Empty: all supported."""
  wrong = []
  if tuple(python[:2]) < PYTHON:
    wrong.append(f"Python {_text(tuple(python[:3]))} (supported: "
                 f"{_text(PYTHON)} to 3.14)")
  for name, (first, stop) in RANGES.items():
    version = found.get(name)
    supported = f"{_text(first)} to {_text(stop)} (not included)"
    if version is None:
      wrong.append(f"{name} not installed (supported: {supported})")
    elif not first <= release(version) < stop:
      wrong.append(f"{name} {version} (supported: {supported})")
  return wrong


def _one_line(previous):
  """A sys.excepthook that prints an uncaught UnsupportedVersions as its
  message alone, and hands any other exception to `previous`."""
  def hook(kind, value, traceback):
    if issubclass(kind, UnsupportedVersions):
      print(f"{type(value).__name__}: {value}", file=sys.stderr)
    else:
      previous(kind, value, traceback)
  return hook


def check() -> None:
  """Raises UnsupportedVersions (one line) unless this Python and the
  installed jax, jaxlib and flax are in the supported ranges."""
  wrong = problems(sys.version_info[:3],
                   {name: installed(name) for name in RANGES})
  if wrong:
    sys.excepthook = _one_line(sys.excepthook)
    raise UnsupportedVersions(
        "mha does not run on " + ", ".join(wrong) + "; Python 3.11 with JAX "
        "0.10.2 and Python 3.12-3.14 with JAX 0.12 are tested: " + INSTALL)
