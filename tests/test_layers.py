"""The import layers, read from the source (no module is imported here).

Imports point down (DESIGN.md, "Layering"): the file layer, the errors and
the vocabulary's ids at the bottom; `mha/data/` above them and below
everything that consumes batches; tools (`scripts/`, `bench/`) at the top,
side by side.
"""
import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
MHA = REPO / "mha"

# What mha/data/ may import of the rest of mha: the layers below it.
BELOW_DATA = {"mha.errors", "mha.files", "mha.tensorflow_loader",
              "mha.token_ids", "mha.validation"}
# The modules outside mha/data/ that may import it: the data pipeline's
# consumers (training, evaluation, translation set-up) and their checks.
DATA_CONSUMERS = {
    "mha.trainer", "mha.evaluator", "mha.attention_maps",
    "mha.translate", "mha.translator", "mha.export", "mha.workdir",
    "mha.warm_start", "mha.config_check", "mha.cli.train", "mha.train_setup",
    "mha.train_evals"}


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, top_level_only: bool = False) -> set[str]:
  """The modules `path` imports (`from a import b` gives a and a.b); with
  `top_level_only`, not those inside a function or an `if TYPE_CHECKING:`."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  names = set()

  def visit(node):
    for child in ast.iter_child_nodes(node):
      if top_level_only and (
          isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
          or (isinstance(child, ast.If)
              and "TYPE_CHECKING" in ast.unparse(child.test))):
        continue
      if isinstance(child, ast.Import):
        names.update(alias.name for alias in child.names)
      elif isinstance(child, ast.ImportFrom) and child.module:
        names.add(child.module)
        names.update(f"{child.module}.{alias.name}" for alias in child.names)
      visit(child)

  visit(tree)
  return names


def _mha_modules():
  return sorted(MHA.rglob("*.py"))


def test_the_data_package_imports_only_the_layers_below_it():
  for path in sorted((MHA / "data").glob("*.py")):
    outside = {name for name in _imports(path)
               if name.startswith("mha.") and not name.startswith("mha.data")
               and not any(name == m or name.startswith(f"{m}.")
                           for m in BELOW_DATA)}
    assert not outside, f"{path.name} imports {sorted(outside)}"


def test_only_the_pipelines_consumers_import_the_data_package():
  importers = {
      _module_name(path) for path in _mha_modules()
      if "data" not in path.relative_to(MHA).parts[:-1]
      and any(name == "mha.data" or name.startswith("mha.data.")
              for name in _imports(path))}
  assert importers <= DATA_CONSUMERS, sorted(importers - DATA_CONSUMERS)
  # The layers below the translate layer import nothing of data either
  # (the searches read PAD_ID from mha.token_ids).
  assert "mha.decoding" not in importers
  assert "mha.batch_search" not in importers


def test_no_module_of_mha_imports_matplotlib_when_imported():
  importers = [_module_name(path) for path in _mha_modules()
               if any(name.split(".")[0] == "matplotlib"
                      for name in _imports(path, top_level_only=True))]
  assert not importers, importers


def test_scripts_import_no_benchmark():
  for path in sorted((REPO / "scripts").glob("*.py")):
    benches = {name for name in _imports(path)
               if name.split(".")[0] == "bench"}
    assert not benches, f"scripts/{path.name} imports {sorted(benches)}"


def test_every_error_class_is_defined_in_mha_errors_and_is_a_user_error():
  from mha import errors  # pylint: disable=import-outside-toplevel
  defined = {name for name, value in vars(errors).items()
             if isinstance(value, type) and issubclass(value, Exception)}
  elsewhere = []
  for path in _mha_modules():
    if path == MHA / "errors.py":
      continue
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.ClassDef) and any(
          ast.unparse(base).split(".")[-1] in defined
          or ast.unparse(base).endswith(("Error", "Exception"))
          for base in node.bases):
        elsewhere.append(f"{_module_name(path)}.{node.name}")
  assert not elsewhere, elsewhere
  assert {name for name in defined
          if not issubclass(getattr(errors, name), errors.UserError)} == set()
