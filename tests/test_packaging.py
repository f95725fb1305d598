"""pyproject.toml and requirements.txt name the same versions."""
import re
import tomllib

from conftest import REPO_ROOT


def _pins(lines):
  pins = {}
  for line in lines:
    match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;#]+)\s*",
                         line)
    if match:
      pins[match.group(1).lower().replace("_", "-")] = match.group(3)
  return pins


def test_pyproject_pins_the_lock_of_requirements_txt():
  lock = _pins((REPO_ROOT / "requirements.txt").read_text().splitlines())
  project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
  declared = _pins(project["project"]["dependencies"])
  dev = _pins(project["project"]["optional-dependencies"]["dev"])
  assert {**declared, **dev} == lock
  for extra in ("tpu", "cuda"):
    (spec,) = project["project"]["optional-dependencies"][extra]
    assert spec.startswith("jax[") and spec.endswith(f"=={lock['jax']}")
