"""mha.runtime.versions: `import mha` on an unsupported Python, JAX or flax
stops with one line naming what was found and what is supported."""
import importlib.metadata
import os
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from conftest import REPO_ROOT
from mha.runtime import versions

SUPPORTED = {"jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8"}


def test_release_reads_the_leading_numbers():
  assert versions.release("0.12.0.1") == (0, 12, 0, 1)
  assert versions.release("0.13.0.dev20261101") == (0, 13, 0)
  assert versions.release("2.13.0+cpu") == (2, 13, 0)
  assert versions.release("0.12rc1") == (0, 12)


def test_supported_versions_pass():
  assert not versions.problems((3, 11, 7), SUPPORTED)
  assert not versions.problems((3, 13, 0), {"jax": "0.12.0.1",
                                            "jaxlib": "0.12.0.1",
                                            "flax": "0.12.12"})
  assert not versions.problems((3, 14, 0), dict(SUPPORTED, jax="0.12.9"))


def test_each_version_outside_is_named_with_the_supported_ones():
  (python,) = versions.problems((3, 10, 12), SUPPORTED)
  assert python == "Python 3.10.12 (supported: 3.11 to 3.14)"
  for name, version in [("jax", "0.10.1"), ("jax", "0.13.0"),
                        ("jaxlib", "0.9.0"), ("flax", "0.13.0"),
                        ("flax", "0.12.7")]:
    (wrong,) = versions.problems((3, 12, 1), dict(SUPPORTED, **{name:
                                                                version}))
    assert wrong.startswith(f"{name} {version} (supported: ")
  (missing,) = versions.problems((3, 12, 1), dict(SUPPORTED, flax=None))
  assert missing == "flax not installed (supported: 0.12.8 to 0.13 (not " \
                    "included))"


def test_installed_versions_are_importlib_metadatas():
  for name in versions.RANGES:
    assert versions.installed(name) == importlib.metadata.version(name)
  assert versions.installed("no-such-distribution-of-mha") is None


def test_ranges_are_pyprojects():
  # The widest range pyproject gives each (the one for Python 3.12+).
  project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
  widest = {}
  for line in project["project"]["dependencies"]:
    requirement = Requirement(line)
    if requirement.name in versions.RANGES and (
        not requirement.marker or requirement.marker.evaluate(
            {"python_version": "3.12", "python_full_version": "3.12.1"})):
      widest[requirement.name] = requirement.specifier
  assert widest == {
      name: SpecifierSet(f">={'.'.join(map(str, first))},"
                         f"<{'.'.join(map(str, stop))}")
      for name, (first, stop) in versions.RANGES.items()}


def test_import_mha_with_an_old_jax_is_one_line(tmp_path):
  # A jax 0.9.0 first on sys.path, as pip leaves it (its .dist-info).
  (tmp_path / "jax-0.9.0.dist-info").mkdir()
  (tmp_path / "jax-0.9.0.dist-info" / "METADATA").write_text(
      "Metadata-Version: 2.1\nName: jax\nVersion: 0.9.0\n")
  result = subprocess.run(
      [sys.executable, "-c", "import mha"], cwd=REPO_ROOT,
      env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True,
      text=True, timeout=60, check=False)
  assert result.returncode == 1
  assert result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith(
      "UnsupportedVersions: mha does not run on jax 0.9.0 (supported: "
      "0.10.2 to 0.13 (not included)); Python 3.11 with JAX 0.10.2")


def test_the_one_line_hook_leaves_other_exceptions_to_the_previous():
  seen = []
  hook = versions._one_line(lambda *args: seen.append(args[0]))  # pylint: disable=protected-access
  hook(ValueError, ValueError("x"), None)
  assert seen == [ValueError]
  hook(versions.UnsupportedVersions, versions.UnsupportedVersions("y"),
       None)
  assert seen == [ValueError]


def test_import_mha_loads_only_the_standard_library_and_mha_errors():
  result = subprocess.run(
      [sys.executable, "-c", "import sys; before = set(sys.modules); "
       "import mha; print(' '.join(sorted(set(sys.modules) - before)))"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True)
  loaded = result.stdout.split()
  assert {"mha", "mha.errors", "mha.runtime", "mha.runtime.versions"} <= set(
      loaded)
  outside = [name for name in loaded if not name.startswith("mha") and
             name.split(".")[0] not in sys.stdlib_module_names]
  assert not outside, outside
