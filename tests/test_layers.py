"""The import layers, read from the source (no module is imported here).

Imports point down (the README's Layout): the errors and the validation
rules at the bottom, then the process (`mha/runtime/`), the data and the
model, the search, the workdir's store and the scores, training and
evaluation side by side, the public API and the commands; tools
(`scripts/`, `bench/`) at the top, side by side.
"""
import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
MHA = REPO / "mha"

# mha's folders and top-level modules, from the bottom layer up. A module
# imports only modules of the layers below its own, and of its own folder:
# folders of one layer do not import each other (training and evaluation
# among them: the in-training evaluation is the trainer's own plug-in,
# over the scores of mha/scoring/).
LAYERS = (
    ("mha.errors",),
    ("mha.validation",),
    ("mha.runtime",),
    ("mha.data", "mha.model"),
    ("mha.search", "mha.store", "mha.scoring"),
    ("mha.train", "mha.evaluation"),
    ("mha.translator", "mha.export"),
    ("mha.huggingface",),  # shares mha.export's output folder and staging
    ("mha.cli",),
)


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


def _unit(module: str) -> str | None:
  """The folder or top-level module of LAYERS that `module` belongs to."""
  for layer in LAYERS:
    for unit in layer:
      if module == unit or module.startswith(f"{unit}."):
        return unit
  return None


def _layer(unit: str) -> int:
  return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def test_every_module_of_mha_has_a_layer():
  units = {_unit(_module_name(path)) for path in _mha_modules()
           if path != MHA / "__init__.py"}
  assert None not in units
  tops = sorted(p.stem for p in MHA.glob("*.py") if p.stem != "__init__")
  assert tops == ["errors", "export", "translator", "validation"]


def test_imports_point_down_the_layers():
  upward = []
  for path in _mha_modules():
    own = _unit(_module_name(path))
    if own is None:  # mha/__init__.py: the public face, lazily
      continue
    for name in _imports(path):
      other = _unit(name)
      if other is None or other == own:
        continue
      if _layer(other) >= _layer(own):
        upward.append(f"{_module_name(path)} imports {name}")
  assert not upward, upward


def test_the_search_takes_only_the_token_ids_of_the_data_package():
  """The search algorithms, their speed-ups and the batch runner know the
  vocabulary's ids, not the data pipeline (only `texts`, text -> ids,
  does)."""
  for path in sorted((MHA / "search").glob("*.py")):
    if path.stem == "texts":
      continue
    taken = {i for i in _imports(path)
             if i == "mha.data" or i.startswith("mha.data.")}
    assert all(i == "mha.data" or i.startswith("mha.data.token_ids")
               for i in taken), (path.stem, taken)


def test_the_search_modules_import_each_other_one_way():
  """Within mha/search the imports form no cycle (the paper's algorithm
  below its refilled form and the batch runner, its speed-ups below it)."""
  search = {p.stem: p for p in (MHA / "search").glob("*.py")
            if p.stem != "__init__"}
  imports = {name: {i.split(".")[2] for i in _imports(path)
                    if i.startswith("mha.search.")} & set(search)
             for name, path in search.items()}
  done = set()

  def visit(name, path):
    assert name not in path, " -> ".join(path + [name])
    if name not in done:
      for other in sorted(imports[name]):
        visit(other, path + [name])
      done.add(name)

  for name in sorted(search):
    visit(name, [])


def test_the_package_faces_import_no_jax():
  """Importing a folder (as `python -m mha.cli.translate` and the
  commands' start-up do) loads none of JAX, flax or the data libraries."""
  heavy = {"jax", "flax", "numpy", "sentencepiece", "tensorflow_datasets"}
  for path in [MHA / "__init__.py", *MHA.glob("*/__init__.py")]:
    imported = {name.split(".")[0] for name in _imports(path)}
    assert not imported & heavy, (path, imported & heavy)
    inside = {name for name in _imports(path)
              if name.startswith("mha.")}
    # But the version check that `import mha` runs first (the standard
    # library and mha.errors only: tests/test_versions.py).
    if path == MHA / "__init__.py":
      inside -= {"mha.runtime", "mha.runtime.versions"}
    assert not inside, (path, inside)


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
