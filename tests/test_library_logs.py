"""The libraries' log lines: hidden by default, shown with
--verbose_libraries."""
import logging
import os
import re
import subprocess
import sys
import pathlib

import numpy as np
import pytest

from mha.store import checkpoints
from mha.runtime import library_logs
from mha.runtime import tensorflow_loader

REPO = pathlib.Path(__file__).resolve().parents[1]


def _orbax_info(records) -> list[str]:
  return [r.getMessage() for r in records
          if "/orbax/" in r.pathname and r.levelno < logging.WARNING]


def _save(folder) -> None:
  manager = checkpoints.make_manager(folder, keep=1)
  checkpoints.save(manager, 1, {"w": np.arange(3, dtype=np.float32)},
                   {"step": 1})
  manager.close()


@pytest.fixture
def absl_info(caplog):
  caplog.set_level(logging.INFO, logger="absl")
  yield caplog
  library_logs.configure(verbose=True)  # as the library is left by default


def test_orbax_info_lines_are_hidden_by_default_and_shown_verbose(
    tmp_path, absl_info):
  library_logs.configure(verbose=False)
  _save(tmp_path / "quiet")
  # The project's own lines and Orbax's warnings pass; its INFO lines not.
  logging.getLogger("absl").info("project line")
  logging.getLogger("absl").warning("a warning")
  assert _orbax_info(absl_info.records) == []
  messages = [r.getMessage() for r in absl_info.records]
  assert "project line" in messages and "a warning" in messages
  assert checkpoints.all_steps(tmp_path / "quiet") == [1]

  absl_info.clear()
  library_logs.configure(verbose=True)
  _save(tmp_path / "verbose")
  shown = _orbax_info(absl_info.records)
  assert any("Saving checkpoint at step 1" in m for m in shown), shown


def test_tensorflow_start_up_lines_are_hidden(tmp_path):
  # One process asks for quiet start-up lines (as train.py does), imports
  # TensorFlow as a dataset by name does and reports how many lines it hid;
  # none reach its stderr.
  script = ("import sys; from mha import library_logs, tensorflow_loader; "
            "library_logs.quiet_native(sys.argv); "
            "hidden = tensorflow_loader.import_tensorflow(); "
            "import tensorflow; print(hidden)")
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          check=True)
  hidden = int(result.stdout.strip())
  if hidden == 0:
    pytest.skip("this TensorFlow prints no native INFO line when it loads")
  assert not [line for line in result.stderr.splitlines()
              if tensorflow_loader.is_native_info(line)], result.stderr
  assert "oneDNN" not in result.stderr


def test_verbose_flag_in_argv_leaves_tensorflow_alone(monkeypatch, capfd):
  monkeypatch.delenv(library_logs.NATIVE_LEVEL_ENV, raising=False)
  monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
  monkeypatch.setattr(tensorflow_loader, "_hide_native", False)

  def import_loudly():
    os.write(2, b"I1124 10:00:00.000000 1 port.cc:153] oneDNN ...\n")
  monkeypatch.setattr(tensorflow_loader, "_import_tensorflow", import_loudly)
  library_logs.quiet_native(["train.py", "--verbose_libraries"])
  assert library_logs.NATIVE_LEVEL_ENV not in library_logs.os.environ
  assert tensorflow_loader.import_tensorflow() == 0
  assert "oneDNN" in capfd.readouterr().err
  # Without the flag, the same line is hidden and counted.
  library_logs.quiet_native(["train.py"])
  assert tensorflow_loader.import_tensorflow() == 1
  assert "oneDNN" not in capfd.readouterr().err


def test_quiet_native_imports_nothing():
  script = ("import sys; from mha import library_logs; "
            "library_logs.quiet_native(sys.argv); "
            "print('tensorflow' in sys.modules)")
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          check=True)
  assert result.stdout.strip() == "False"


@pytest.mark.parametrize("flag, hidden", [((), True),
                                          (("--verbose_libraries",), False)])
def test_eval_py_hides_the_libraries_lines_unless_verbose(
    eval_py, tmp_path, flag, hidden):
  # A refused run (no such workdir) is enough: main configures the logs first.
  assert eval_py(f"--workdir={tmp_path / 'missing'}", *flag) == 1
  absl_filters = logging.getLogger("absl").filters
  assert (library_logs._FILTER in absl_filters) is hidden  # pylint: disable=protected-access


def test_tensorflow_missing_is_one_line_naming_the_install(monkeypatch):
  # The core install has no TensorFlow (sys.modules[name] = None: the
  # import fails and find_spec finds nothing, as where it is not installed).
  from mha.data import sources  # pylint: disable=import-outside-toplevel
  from mha.errors import UserError  # pylint: disable=import-outside-toplevel
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  with pytest.raises(UserError) as error:
    tensorflow_loader.import_tensorflow("WMT14")
  assert str(error.value) == (
      "WMT14 needs TensorFlow, which the core install leaves out: pip "
      "install -r requirements-tfds.txt (or pip install 'mha[tfds]').")
  from configs import wmt14  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match=r"^config.dataset_name="
                     r"'wmt14_translate/de-en' \(a TFDS dataset by name\) "
                     r"needs TensorFlow, .* requirements-tfds.txt"):
    sources.open_split(wmt14.get_config(), "train")
  # The install command it names installs it.
  lock = (REPO / "requirements-tfds.txt").read_text()
  assert re.search(r"^tensorflow(-cpu)?==", lock, re.MULTILINE)


def test_orbax_warnings_and_errors_pass_the_filter(absl_info):
  """Only Orbax's lines below WARNING are hidden: its warnings and errors
  reach the handlers."""
  import orbax.checkpoint  # pylint: disable=import-outside-toplevel
  library_logs.configure(verbose=False)
  absl = logging.getLogger("absl")
  for level in (logging.INFO, logging.WARNING, logging.ERROR):
    absl.handle(logging.LogRecord("absl", level, orbax.checkpoint.__file__,
                                  1, f"orbax line {level}", None, None))
  assert [r.levelno for r in absl_info.records
          if r.getMessage().startswith("orbax line")] == [logging.WARNING,
                                                          logging.ERROR]


def test_a_native_log_level_the_user_set_is_kept(monkeypatch):
  """quiet_native sets TF_CPP_MIN_LOG_LEVEL=1 only when it is not set."""
  monkeypatch.setattr(tensorflow_loader, "_hide_native", False)
  monkeypatch.setenv(library_logs.NATIVE_LEVEL_ENV, "0")
  library_logs.quiet_native(["train.py"])
  assert os.environ[library_logs.NATIVE_LEVEL_ENV] == "0"
  monkeypatch.delenv(library_logs.NATIVE_LEVEL_ENV)
  library_logs.quiet_native(["train.py"])
  assert os.environ[library_logs.NATIVE_LEVEL_ENV] == "1"


def test_jax_backend_probe_lines_are_hidden_unless_verbose(caplog):
  """JAX's backend start-up INFO lines: hidden by default, shown with
  --verbose_libraries."""
  caplog.set_level(logging.INFO, logger="jax")
  probe = logging.getLogger("jax._src.xla_bridge")
  try:
    library_logs.configure(verbose=False)
    probe.info("probe line, quiet")
    library_logs.configure(verbose=True)
    probe.info("probe line, verbose")
  finally:
    library_logs.configure(verbose=True)  # as the library is left by default
  messages = [r.getMessage() for r in caplog.records]
  assert "probe line, quiet" not in messages
  assert "probe line, verbose" in messages
