"""The tools (`bench/`, `scripts/`) name only what mha has.

Nothing runs them in the suite (a benchmark takes minutes), so a name of
mha renamed or moved would break them unseen: `from mha.x import Y` with no
Y in mha.x, or `x.f(...)` on an imported mha module x without f. Read from
their source; the mha modules named are imported, the tools are not.
"""
import ast
import importlib
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
TOOLS = sorted([*REPO.glob("bench/*.py"), *REPO.glob("scripts/*.py")])


def _is_ours(module: str) -> bool:
  return module == "mha" or module.startswith("mha.")


def missing_names(source: str) -> list[str]:
  """`module.name` for each name the source takes from an mha module that
  the module does not have."""
  tree = ast.parse(source)
  modules = {}  # local name -> imported mha module
  missing = []

  def take(module, name: str, local: str) -> None:
    if hasattr(module, name):
      value = getattr(module, name)
    else:
      try:
        value = importlib.import_module(f"{module.__name__}.{name}")
      except ModuleNotFoundError:
        missing.append(f"{module.__name__}.{name}")
        return
    if isinstance(value, type(module)):
      modules[local] = value

  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and _is_ours(
        node.module):
      module = importlib.import_module(node.module)
      for alias in node.names:
        take(module, alias.name, alias.asname or alias.name)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if _is_ours(alias.name) and alias.asname:
          modules[alias.asname] = importlib.import_module(alias.name)
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and not hasattr(modules[node.value.id], node.attr)):
      missing.append(f"{modules[node.value.id].__name__}.{node.attr}")
  return sorted(set(missing))


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: f"{p.parent.name}/"
                         f"{p.name}")
def test_tool_names_exist(path):
  assert not missing_names(path.read_text(encoding="utf-8"))


def test_a_renamed_name_is_found():
  # What broke bench/attention.py and bench/train_step.py unseen.
  assert missing_names(
      "from mha.model.attention import ATTENTION_IMPLS\n"
      "from mha import host_memory\n"
      "host_memory.reexec_with_huge_pages()\n"
      "host_memory.start()\n") == [
          "mha.model.attention.ATTENTION_IMPLS",
          "mha.runtime.host_memory.reexec_with_huge_pages"]
  assert not missing_names("from mha.validation import ATTENTION_IMPLS\n"
                           "import mha.data as data\ndata.load_text_pairs\n")
