"""What every command does first, the same way: `run(main)`.

1. Huge pages: the process restarts once with glibc's huge-page tunable
   where it helps (`mha.runtime.host_memory.start`: CPU hosts;
   `MHA_HUGE_PAGES=0/1` decides otherwise), before JAX is imported.
2. The libraries' INFO lines hidden unless `--verbose_libraries`
   (`mha.runtime.library_logs`).
3. absl parses the flags; a bad flag, config file or config override is one
   line (`parse_flags`).
4. In `main`: one log line saying whether huge pages are on, XLA's
   persistent compilation cache turned on (`--compilation_cache_dir`), then
   the command's own work. A `UserError` (bad input: a config field, a
   workdir, a data file, a checkpoint, a flag) is printed as one line,
   `<command>: <message>`, on standard error, and the process exits with
   the error's `exit_code` (1 unless it says otherwise); a Ctrl-C that the
   command does not handle itself is the line `Interrupted (Ctrl-C).` and
   exit status 130; `--traceback` raises either with its stack instead.
   Any other exception is a bug and keeps its stack. The commands that
   search make the host's cores CPU devices first (`use_search_devices`).

A command module defines its flags at import, with `define_flags()` for the
shared ones, and ends with

    def run() -> None:
      startup.run(main)

Importing this module imports neither JAX nor TensorFlow: the restart
comes first.
"""
import functools
import importlib.util
import os
import re
import sys
from typing import Any, Callable, Sequence

from absl import app
from absl import flags
from absl import logging

from mha.runtime import compilation_cache
from mha.runtime import host_memory
from mha.runtime import library_logs
from mha.runtime import sigterm
from mha.search import settings as settings_lib
from mha import validation
from mha.errors import ConfigError
from mha.errors import SigTerm
from mha.errors import Terminated
from mha.errors import UserError

FLAGS = flags.FLAGS
# The mha package's folder (with a separator: not mha_other/).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The console scripts' names, for messages: the command as the user typed it.
_SCRIPTS = ("mha-train", "mha-eval", "mha-translate", "mha-export",
            "mha-import")


def define_flags() -> None:
  """Defines --traceback, --compilation_cache_dir and --verbose_libraries,
  once: several command modules may be imported into one process (tests)."""
  if "traceback" not in FLAGS:
    flags.DEFINE_bool(
        "traceback", False,
        "On bad input (a config, workdir, data file, flag), raise with the "
        "stack instead of printing only the message.")
  if "compilation_cache_dir" not in FLAGS:
    compilation_cache.define_flag()
  if library_logs.FLAG not in FLAGS:
    library_logs.define_flag()


def define_once(define: Callable[..., Any], name: str, default: Any,
                help_text: str) -> None:
  """`define(name, default, help_text)` unless a command module imported
  before defined a flag of that name (several commands in one process, as
  in tests or a user's script, share --workdir, --step, --average_last:
  a second definition would be absl's DuplicateFlagError)."""
  if name not in FLAGS:
    define(name, default, help_text)
    if name == "workdir":  # `--workdir=$WD` with WD unset: not the cwd
      flags.register_validator(
          name, lambda value: value is None or bool(value.strip()),
          message="empty: give the workdir's path (an unset "
          "shell variable?).")


_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def define_search_flags() -> None:
  """Defines the flags of the commands that read a trained workdir and
  search (mha-eval, mha-translate): --workdir, --average_last, one flag
  for each search setting (`mha.search.settings.flags`: --beam_size,
  --alpha, ...), --batch_size, --cpu_devices (`use_search_devices`);
  once, as `define_flags`."""
  for name, kind, help_text in settings_lib.flags():
    define_once(_DEFINE[kind], name, None, help_text)
  for define, name, default, help_text in (
      (flags.DEFINE_string, "workdir", None, "A training workdir."),
      (flags.DEFINE_integer, "average_last", None,
       "Average the last N checkpoints' parameters."),
      (flags.DEFINE_integer, "batch_size", None,
       "Sentences per decoding batch. Default: 64 for each accelerator; "
       "64 in all on CPU devices, more where a device would have fewer than "
       "64 search rows."),
      (flags.DEFINE_integer, "cpu_devices", None,
       "JAX CPU devices the searches run on (a host without accelerators): "
       "default one per core, at most 8, unless XLA_FLAGS sets "
       "--xla_force_host_platform_device_count; 1: one device for all "
       "cores.")):
    define_once(define, name, default, help_text)


def search_flags() -> dict[str, Any]:
  """The search settings' flags as given ({field: value}; None: the
  config's), the keywords of `evaluate`, `follow` and the Translator."""
  return {name: flags.FLAGS[name].value for name in settings_lib.FIELDS}


def use_search_devices() -> None:
  """First thing in a searching command's `main`, before JAX starts: the
  host's cores as CPU devices (`mha.runtime.cpu_devices.use_cpu_cores`,
  --cpu_devices), with one log line saying so."""
  from mha.runtime import cpu_devices  # pylint: disable=g-import-not-at-top
  count = cpu_devices.use_cpu_cores(FLAGS.cpu_devices)
  if count is not None:
    logging.info("Searching on %d CPU device(s) (--cpu_devices).", count)


def command_name(argv0: str | None = None) -> str:
  """The name messages start with: `train.py`, `mha-train`, ...

  `python -m mha.cli.train` is named `mha-train`, as its console script.
  """
  argv0 = sys.argv[0] if argv0 is None else argv0
  name = os.path.basename(argv0)
  parent = os.path.basename(os.path.dirname(argv0))
  if parent == "cli" and name.endswith(".py"):
    candidate = f"mha-{name[:-3]}"
    if candidate in _SCRIPTS:
      return candidate
  return name or "mha"


def fail(message: str, exit_code: int = 1) -> None:
  """Prints `<command>: <message>` (one line) and exits with `exit_code`."""
  print(f"{command_name()}: {' '.join(str(message).split())}",
        file=sys.stderr)
  sys.exit(exit_code)


def stops_on_sigterm(main: Callable[[list[str]], int | None]
                     ) -> Callable[[list[str]], int | None]:
  """`main` stopping on a SIGTERM (`SigTerm` raised where it is, in the
  main thread) instead of being ended by it: its locks are released and
  its temporary files removed, and it raises `Terminated` (one line,
  status 143). The commands that only read and write results (eval,
  translate, export), through `sigterm.raised`; train.py saves a
  checkpoint on a SIGTERM instead (`train_actions.StopSignal`)."""

  @functools.wraps(main)
  def wrapper(argv: list[str]) -> int | None:
    try:
      with sigterm.raised():
        return main(argv)
    except SigTerm:
      raise Terminated("Stopped by SIGTERM.") from None

  return wrapper


def _out_of_memory(error: Exception) -> str | None:
  """XLA's first line for an allocation it could not make (its
  RESOURCE_EXHAUSTED: a batch too large for the device's memory), or None
  for any other error (a bug, which keeps its stack)."""
  if "jax" not in sys.modules:
    return None
  from jax.errors import JaxRuntimeError  # pylint: disable=import-outside-toplevel
  text = str(error)
  if isinstance(error, JaxRuntimeError) and text.startswith(
      "RESOURCE_EXHAUSTED"):
    return text.split("\n")[0].rstrip(".") + "."
  return None


def guarded(main: Callable[[list[str]], int | None]
            ) -> Callable[[list[str]], int | None]:
  """`main` with the start-up of step 4 (module docstring) around it.

  Returns `main`'s return value; a `UserError` ends the process through
  `fail` (SystemExit), unless --traceback.
  """

  @functools.wraps(main)
  def wrapper(argv: list[str]) -> int | None:
    library_logs.configure(FLAGS.verbose_libraries)
    logging.info("%s", host_memory.status())
    try:
      compilation_cache.enable(FLAGS.compilation_cache_dir)
      with validation.as_flags():  # messages name settings as flags
        return main(argv)
    except UserError as e:
      if FLAGS.traceback:
        raise
      fail(str(e), getattr(e, "exit_code", 1))
    except KeyboardInterrupt:  # a Ctrl-C the command does not handle itself
      if FLAGS.traceback:
        raise
      fail("Interrupted (Ctrl-C).", 130)
    except Exception as e:  # pylint: disable=broad-except
      message = _out_of_memory(e)
      if message is None or FLAGS.traceback:
        raise
      fail(f"{message} Use smaller batches (--batch_size or --beam_size; "
           "train.py: config.max_tokens).")

  wrapper.guarded = True
  return wrapper


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing, with a bad flag, config file or config override as
  one line (`fail`); --traceback shows absl's own report instead.

  ml_collections reports a config file that raises while it is loaded (e.g.
  an unknown config argument, `configs/base.py:Z9`) with the file's whole
  traceback inside the flag error: only its last line, the exception, is
  printed. An override of a field the config does not have
  (`--config.num_train_step=4`) is ml_collections' AttributeError, with its
  "Did you mean" suggestion; an override that follows a config file that
  could not be loaded is its OSError. The config file is loaded here, so
  that a missing one is refused before anything starts.
  """
  argv = list(argv)
  overrides = any(a.startswith("--config.") for a in argv)
  if _config_arg(argv):
    import_config_package(_config_arg(argv).split("=", 1)[1])
  try:
    remaining = FLAGS(argv)
    if _config_arg(argv):
      loaded_config()
    return remaining
  except ConfigError as e:
    if "--traceback" in argv:
      raise
    fail(str(e))
  except flags.Error as e:
    if "--traceback" in argv:
      raise
    message = str(e)
    if "Error whilst parsing config file" in message:
      last = message.strip().splitlines()[-1].strip()  # "ValueError: ..."
      message = f"{_config_arg(argv)}: " + re.sub(r"^[\w.]+: ", "", last)
    fail(message)
  except OSError:
    if "--traceback" in argv or not (overrides and _config_arg(argv)):
      raise
    fail(config_file_error(_config_arg(argv).split("=", 1)[1]))
  except Exception as e:  # pylint: disable=broad-exception-caught
    if "--traceback" in argv or not _config_arg(argv):
      raise
    spec = _config_arg(argv).split("=", 1)[1]
    message = config_load_error(e, spec)
    if message is None:
      if not (overrides and isinstance(e, (AttributeError, KeyError))):
        raise
      message = _unknown_field_message(e, argv)
    fail(message)


def import_config_package(spec: str) -> None:
  """Makes `configs` the package of the config file `spec` (path[:argument])
  when the file lies in a folder named configs with an `__init__.py`, as the
  project's do, and no `configs` is imported yet.

  The project's config files import their siblings (`from configs import
  base`); installed with pip, no `configs` package is on the path (mha
  installs none of that name), and from any working directory the one of
  the file given is the right one.
  """
  folder = os.path.dirname(os.path.abspath(spec.split(":", 1)[0]))
  init = os.path.join(folder, "__init__.py")
  if (os.path.basename(folder) != "configs" or not os.path.isfile(init)
      or "configs" in sys.modules):
    return
  package_spec = importlib.util.spec_from_file_location(
      "configs", init, submodule_search_locations=[folder])
  package = importlib.util.module_from_spec(package_spec)
  sys.modules["configs"] = package
  try:
    package_spec.loader.exec_module(package)
  except BaseException:
    del sys.modules["configs"]
    raise


def _config_arg(argv: Sequence[str]) -> str:
  """The `--config=...` argument of `argv`, or ''."""
  return next((a for a in argv if a.startswith("--config=")), "")


def _unknown_field_message(error: Exception, argv: Sequence[str]) -> str:
  """The line for an override of a field the config does not have."""
  text = error.args[0] if error.args else ""
  while isinstance(text, Exception):  # AttributeError(KeyError(message))
    text = text.args[0] if text.args else ""
  text = str(text)
  key = re.match(r"""^['"]?(.*?)['"]?(\n|$)""", text).group(1)
  overrides = [a.split("=", 1)[0] for a in argv if a.startswith("--config.")]
  flag = next((o for o in overrides if key in o[len("--config."):].split(".")),
              "--config." + key)
  suggestion = re.search(r'Did you mean "([^"]+)"', text)
  hint = (f"; did you mean {suggestion.group(1)!r}?" if suggestion else
          " (the config file lists its fields).")
  spec = _config_arg(argv).split("=", 1)[1]
  return f"{flag}: {spec} has no field {key!r}{hint}"


def config_load_error(error: BaseException, spec: str) -> str | None:
  """The line for a config file `spec` (path[:argument]) whose code fails
  while ml_collections loads it (a syntax error, no `get_config`, an
  exception in `get_config` or in a file it imports), naming the file and
  line where it failed; None for an error raised elsewhere (an override
  of a field the config does not have)."""
  path = spec.split(":", 1)[0]
  if isinstance(error, SyntaxError) and error.filename:
    return (f"--config: {error.filename}, line {error.lineno}: "
            f"{error.msg} (the config file {path} does not load).")
  if isinstance(error, AttributeError) and "get_config" in str(error):
    return (f"--config: the config file {path} defines no get_config() "
            "function.")
  # The deepest frame of the user's own code (not of Python or a library).
  library = (sys.prefix, sys.base_prefix, os.path.dirname(os.__file__))
  where = None
  traceback = error.__traceback__
  while traceback is not None:
    name = traceback.tb_frame.f_code.co_filename
    if not name.startswith("<") and not name.startswith(library):
      where = (name, traceback.tb_lineno)
    traceback = traceback.tb_next
  if where is None or os.path.abspath(where[0]).startswith(_PACKAGE):
    return None  # raised by mha itself: not the config file's code
  reason = f"{type(error).__name__}: {error}"
  return (f"--config: {where[0]}, line {where[1]}: {reason} (the config "
          f"file {path} does not load).")


def config_file_error(spec: str) -> str:
  """The line for a config file `spec` (path[:argument]) that could not be
  read: ml_collections defers that error to the config's first use."""
  path = spec.split(":", 1)[0]
  reason = "does not exist" if not os.path.exists(path) else "cannot be read"
  return (f"--config: the config file {path} {reason} (relative paths start "
          f"in {os.getcwd()}; the project's configs are in configs/).")


def loaded_config(flag_name: str = "config"):
  """The config of a `config_flags` flag; a config file that could not be
  read as a `ConfigError` (ml_collections defers a missing or unreadable
  file to the first access of the config, as an OSError)."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config = getattr(FLAGS, flag_name)
  try:
    config.get("workdir")
  except OSError:
    raise ConfigError(config_file_error(
        config_flags.get_config_filename(FLAGS[flag_name]))) from None
  return config


def run(main: Callable[[list[str]], int | None],
        flags_parser: Callable[[list[str]], list[str]] = parse_flags
        ) -> None:
  """Starts a command: huge pages, quiet library logs, then absl's
  `app.run` of `guarded(main)` (steps 1 to 4 of the module docstring;
  `main` may be guarded already, as a command module's `main` is when its
  tests call it directly)."""
  host_memory.start()
  # TensorFlow's start-up lines are hidden unless --verbose_libraries, if a
  # dataset imports it (a TFDS dataset by name; mha/runtime/library_logs.py).
  library_logs.quiet_native(sys.argv)
  if not getattr(main, "guarded", False):
    main = guarded(main)
  app.run(main, flags_parser=flags_parser)
