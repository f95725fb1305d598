"""The commands' shared start-up (mha/cli/startup.py): one line for bad
input, with its exit status, whatever the command's name."""
import gc
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from mha import errors
from mha.cli import startup

REPO = pathlib.Path(__file__).resolve().parents[1]


def _command(*args, cwd=REPO):
  """Runs `python *args` in `cwd`; returns (exit status, stderr lines)."""
  env = dict(os.environ, MHA_HUGE_PAGES="0", PYTHONPATH=str(REPO))
  result = subprocess.run([sys.executable, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120,
                          check=False)
  return result.returncode, result.stderr.splitlines()


def test_config_override_typo_is_one_line_with_the_suggestion(tmp_path):
  workdir = tmp_path / "run"
  code, err = _command("train.py", "--config=configs/quickstart.py:tiny",
                       "--config.num_train_step=4", "--config.d_model=32",
                       f"--workdir={workdir}")
  assert (code, err) == (1, [
      "train.py: --config.num_train_step: configs/quickstart.py:tiny has no "
      "field 'num_train_step'; did you mean 'num_train_steps'?"])
  # A nested path names its first unknown part; no suggestion, no stack.
  code, err = _command("train.py", "--config=configs/quickstart.py",
                       "--config.optimizer.warmup=4", f"--workdir={workdir}")
  assert (code, err) == (1, [
      "train.py: --config.optimizer.warmup: configs/quickstart.py has no "
      "field 'optimizer' (the config file lists its fields)."])
  assert not workdir.exists()


def test_missing_config_file_with_overrides_is_the_same_line(tmp_path):
  lines = []
  for overrides in ([], ["--config.num_train_steps=4"]):
    code, err = _command("train.py", "--config=configs/nonexistent.py",
                         *overrides, f"--workdir={tmp_path / 'run'}")
    assert code == 1 and len(err) == 1, err
    lines.append(err[0])
  assert lines[0] == lines[1] == (
      "train.py: --config: the config file configs/nonexistent.py does not "
      f"exist (relative paths start in {REPO}; the project's configs are in "
      "configs/).")
  # --traceback: ml_collections' own report instead.
  code, err = _command("train.py", "--config=configs/nonexistent.py",
                       "--config.num_train_steps=4", "--traceback",
                       f"--workdir={tmp_path / 'run'}")
  assert code == 1 and "Traceback (most recent call last):" in err
  assert not (tmp_path / "run").exists()


# A command of its own through startup.run: a UserError with the exit
# status a Ctrl-C gets.
_COMMAND = textwrap.dedent("""\
    from absl import flags
    from mha.cli import startup
    from mha.errors import UserError

    class Interrupted(UserError):
      exit_code = 130

    startup.define_flags()

    def main(argv):
      raise Interrupted("Interrupted by the user; the last checkpoint is 8.")

    if __name__ == "__main__":
      startup.run(main)
    """)


def test_user_error_is_one_line_with_its_exit_code(tmp_path):
  script = tmp_path / "mha-probe"
  script.write_text(_COMMAND)
  code, err = _command(str(script), "--compilation_cache_dir=", cwd=tmp_path)
  assert code == 130
  assert err[-1] == ("mha-probe: Interrupted by the user; the last "
                     "checkpoint is 8.")
  assert not [line for line in err if "Traceback" in line]
  # The start-up line on huge pages comes first.
  assert any(line.endswith("Huge pages for host memory: off "
                           "(MHA_HUGE_PAGES=0).") for line in err), err
  code, err = _command(str(script), "--compilation_cache_dir=",
                       "--traceback", cwd=tmp_path)
  assert code == 1 and "Traceback (most recent call last):" in err
  assert err[-1] == ("Interrupted: Interrupted by the user; the "
                     "last checkpoint is 8.")


def test_xla_out_of_memory_is_one_line(tmp_path):
  """An allocation XLA cannot make (a batch or beam too large for the
  device) is one line with what to do; any other JAX error keeps its
  stack (a bug)."""
  script = tmp_path / "mha-oom"
  script.write_text(textwrap.dedent("""\
      import sys
      from mha.cli import startup
      startup.define_flags()

      def main(argv):
        import jax.numpy as jnp
        if sys.argv[-1] == "oom":  # 256 TiB
          jnp.zeros((2**20, 2**20, 64), jnp.float32).block_until_ready()
        jnp.zeros((2, 3)) @ jnp.zeros((2, 3))  # a shape error: a bug

      if __name__ == "__main__":
        startup.run(main)
      """))
  code, err = _command(str(script), "--compilation_cache_dir=", "oom",
                       cwd=tmp_path)
  assert code == 1, err
  assert err[-1] == (
      "mha-oom: RESOURCE_EXHAUSTED: Out of memory allocating "
      "281474976710656 bytes. Use smaller batches (--batch_size or "
      "--beam_size; train.py: config.max_tokens).")
  assert not [line for line in err if "Traceback" in line]
  code, err = _command(str(script), "--compilation_cache_dir=", "bug",
                       cwd=tmp_path)
  assert code == 1 and "Traceback (most recent call last):" in err


def test_a_sigterm_raised_where_python_ignores_exceptions_still_stops(
    monkeypatch):
  """The SIGTERM arrives while a gc callback runs (jax has one): Python
  prints its SigTerm as 'Exception ignored' and goes on; the command must
  stop all the same, not finish its work. The signal is sent again to the
  main thread as a real one (pthread_kill), which also ends a blocking
  wait at once (`_thread.interrupt_main` would let it run its course)."""
  fired = []
  sent = []
  real_kill = signal.pthread_kill

  def recording_kill(thread_id, signum):
    sent.append((thread_id, signum))
    real_kill(thread_id, signum)

  monkeypatch.setattr(signal, "pthread_kill", recording_kill)

  def callback(phase, info):
    del info
    if phase == "start" and not fired:
      fired.append(True)
      os.kill(os.getpid(), signal.SIGTERM)
      sum(range(100))  # bytecodes: the handler runs here, in the callback

  def main(argv):
    del argv
    gc.callbacks.append(callback)
    try:
      gc.collect()
      threading.Event().wait(60)  # the signal raised again ends the wait
      return 0
    finally:
      gc.callbacks.remove(callback)

  handler, hook = signal.getsignal(signal.SIGTERM), sys.unraisablehook
  with pytest.raises(errors.Terminated, match="Stopped by SIGTERM"):
    startup.stops_on_sigterm(main)(["x"])
  assert fired
  # At least once: a signal sent again may itself land in a gc callback
  # (a busy worker collects often), and is sent once more.
  assert sent and set(sent) == {(threading.main_thread().ident,
                                 signal.SIGTERM)}
  assert (signal.getsignal(signal.SIGTERM), sys.unraisablehook) == (handler,
                                                                    hook)


def test_module_form_is_named_as_its_console_script(tmp_path):
  code, err = _command("-m", "mha.cli.train", "--config=configs/nonexistent.py",
                       f"--workdir={tmp_path / 'run'}")
  assert code == 1 and len(err) == 1
  assert err[0].startswith("mha-train: --config: the config file "
                           "configs/nonexistent.py does not exist")


@pytest.mark.parametrize("argv0, name", [
    ("train.py", "train.py"),
    ("/repo/eval.py", "eval.py"),
    ("/venv/bin/mha-train", "mha-train"),
    ("/site-packages/mha/cli/eval.py", "mha-eval"),
    ("/site-packages/mha/cli/translate.py", "mha-translate"),
    ("/site-packages/mha/cli/startup.py", "startup.py"),
    ("", "mha"),
])
def test_command_name(argv0, name):
  assert startup.command_name(argv0) == name


def test_train_distributed_modes_are_the_librarys():
  # mha.cli.train lists them itself (mha.runtime.distributed imports JAX, which
  # the command imports only after its restart with huge pages).
  code, err = _command("-c", (
      "import sys; from absl import flags; import mha.cli.train; "
      "from mha import distributed; "
      "sys.exit(flags.FLAGS['distributed'].parser.enum_values != "
      "list(distributed.MODES))"))
  assert code == 0, err


def test_every_command_module_imports_in_one_process():
  # They share the start-up's flags (startup.define_flags, called again
  # here) and --workdir, --step, --average_last, --output_dir
  # (startup.define_once): a second definition of one would be absl's
  # DuplicateFlagError.
  code, err = _command("-c", (
      "from mha.cli import train, eval, translate, export, startup; "
      "startup.define_flags(); "
      "from absl import flags; flags.FLAGS(['x', '--workdir=w', '--step=3', "
      "'--output_dir=o', '--config=configs/quickstart.py', '--traceback', "
      "'--compilation_cache_dir=', '--verbose_libraries']); "
      "assert (flags.FLAGS.workdir, flags.FLAGS.step) == ('w', 3); "
      "assert flags.FLAGS.traceback and flags.FLAGS.verbose_libraries; "
      # eval.py's --output_dir is optional: mha-export's need of it (checked
      # in its main) is not a requirement of the shared flag.
      "flags.FLAGS.unparse_flags(); flags.FLAGS(['x', '--workdir=w', "
      "'--config=configs/quickstart.py']); "
      "assert flags.FLAGS.output_dir is None; "
      # and mha-train's --config (checked in its main) of the others.
      "flags.FLAGS.unparse_flags(); flags.FLAGS(['x', '--workdir=w']); "
      "assert flags.FLAGS.config is None"))
  assert (code, err) == (0, [])
  # In the other order too (mha-export's --output_dir first).
  code, err = _command("-c", "from mha.cli import export, translate, eval")
  assert (code, err) == (0, [])


def test_train_without_config_is_one_line(tmp_path):
  code, err = _command("train.py", f"--workdir={tmp_path / 'run'}")
  assert (code, err) == (1, [
      "train.py: --config is required: the training config file, e.g. "
      "--config=configs/base.py."])
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_commands_import_no_jax_before_the_restart(command):
  code, err = _command("-c", (
      f"import sys; import mha.cli.{command}; "
      "print(sorted(m for m in ('jax', 'tensorflow', 'flax') "
      "if m in sys.modules), file=sys.stderr)"))
  assert (code, err) == (0, ["[]"])


def test_config_files_load_from_any_folder_as_installed(tmp_path):
  # As after `pip install .`: mha importable, no `configs` package on the
  # path, the working directory elsewhere. The config file's own folder is
  # its `configs` package (it imports `from configs import base`): the
  # override is checked against the loaded config.
  site = tmp_path / "site"
  site.mkdir()
  (site / "mha").symlink_to(REPO / "mha")
  env = dict(os.environ, MHA_HUGE_PAGES="0", PYTHONPATH=str(site))
  result = subprocess.run(
      [sys.executable, "-m", "mha.cli.train",
       f"--config={REPO}/configs/quickstart.py:tiny",
       "--config.num_train_step=4", f"--workdir={tmp_path / 'run'}"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
      check=False)
  assert (result.returncode, result.stderr.splitlines()) == (1, [
      f"mha-train: --config.num_train_step: {REPO}/configs/quickstart.py:tiny"
      " has no field 'num_train_step'; did you mean 'num_train_steps'?"])
  assert not (tmp_path / "run").exists()
