"""The module paths of before the folders by concern (`mha.MOVED`): each
old path imports the module at its new home, the same object, which keeps
its own name and spec; a path that never existed is still an error."""
import importlib

import pytest

import mha


@pytest.mark.parametrize("old, new", sorted(mha.MOVED.items()))
def test_an_old_path_is_the_module_at_its_new_home(old, new):
  moved = importlib.import_module(f"mha.{old}")
  home = importlib.import_module(new)
  assert moved is home
  assert getattr(mha, old) is home  # `mha.<old>` after `import mha`
  assert home.__name__ == home.__spec__.name == new


def test_from_mha_import_an_old_name_and_a_missing_one():
  from mha import transformer  # pylint: disable=import-outside-toplevel
  from mha.model import transformer as home  # pylint: disable=import-outside-toplevel
  assert transformer is home
  assert transformer.TransformerConfig is mha.TransformerConfig
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module("mha.no_such_module")
  with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
    getattr(mha, "no_such_name")
