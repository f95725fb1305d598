"""A training workdir: its layout, its resolved config and its lock.

    <workdir>/lock            the running trainer: host, pid, start time
    <workdir>/config.json     the resolved config
    <workdir>/spm.model       the shared SentencePiece vocabulary, or
    <workdir>/source.spm, target.spm, vocab.json   separate ones with one
                              id table (an imported Marian model's)
    <workdir>/tokenized/      encoded splits (a cache)
    <workdir>/checkpoints/<step>/
    <workdir>/metrics.jsonl   and TensorBoard event files
    <workdir>/eval/<split>_<step>/

`Workdir` owns these paths and the lock (one training run per workdir);
evaluation reads a workdir through its read-only loaders (`load_config`,
`load_tokenizer`) and takes no lock. The names are defined here, except the
two the data layer writes itself (`spm.model`, `tokenized/`): mha/data sits
below this module (only the file layer, errors, token ids and validation are
under it), so they are defined there and read from there.

A workdir may be a local folder or a `gs://bucket/...` URL: every file here
is read and written through the one file layer (`mha/runtime/files.py`), and
the lock is an atomic create-if-absent on either.
"""
import contextlib
import datetime
import json
import os
import socket
from typing import Iterable, Iterator

from absl import logging
import ml_collections

from mha.store import event_files
from mha.runtime import files
from mha import validation
from mha.data import tokenized
from mha.data import tokenizer
from mha.errors import ConfigError
from mha.errors import UserError
from mha.errors import WorkdirError
from mha.errors import os_reason

# Fields that change the shapes of the parameters or the vocabulary, or the
# function the parameters compute: a workdir trained with other values
# cannot be resumed with these. (A workdir of before a field has none in its
# config.json: it was the paper's, the field's default, and is not
# compared.)
MODEL_SHAPE_FIELDS = (
    "vocab_size", "num_layers", "num_encoder_layers", "num_decoder_layers",
    "d_model", "d_ff", "num_heads", "d_k", "d_v", "attention_type",
    "location_filter_sizes", "location_num_filters", "position_encoding",
    "layer_norm", "share_embeddings", "max_len", "layer_norm_epsilon",
    "ffn_activation", "attention_bias", "output_bias",
)
# The language pair: a workdir's model and vocabulary translate one; a run
# is not resumed with another (a warm start, `init_from`, begins a new one).
LANGUAGE_FIELDS = ("source_lang", "target_lang")
# Fields that shape parameters only when attention_type is 'location': for
# another attention type they may change freely.
LOCATION_FIELDS = ("location_filter_sizes", "location_num_filters")
# Fields that decide which examples fill which batch: changed on resume, the
# run goes on (from the checkpoint's count of batches read) but does not
# replay the batches an uninterrupted run would have seen.
DATA_ORDER_FIELDS = (
    "dataset_name", "data_dir", "train_split",
    "max_source_length", "max_target_length", "max_tokens",
    "max_tokens_counts", "pack_examples",
    "grad_accum_steps", "seed",
)
CONFIG_FILE = "config.json"
LOCK_FILE = "lock"
VOCABULARY_FILE = tokenizer.MODEL_FILENAME
TOKENIZED_DIR = tokenized.TOKENIZED_DIR
RUN_METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
EVAL_DIR = "eval"
# Marks a folder mha-export wrote (a CTranslate2 model): not a workdir.
EXPORT_MANIFEST = "mha_export.json"


# Characters a workdir's path may not hold: Orbax 0.12.8 finds a
# checkpoint's per-process files with a glob of the whole path, so a '[x]'
# (or '*', '?') anywhere in it is read as a pattern and the checkpoint
# cannot be read back.
GLOB_CHARACTERS = "[]*?"


def check_path_characters(path: str, flag: str = "--workdir") -> None:
  """Refuses a workdir whose absolute path holds a `GLOB_CHARACTERS`.

  Raises:
    WorkdirError: naming the flag, the path and the characters.
  """
  full = path if files.has_scheme(path) else os.path.abspath(path)
  found = sorted({c for c in full if c in GLOB_CHARACTERS})
  if found:
    raise WorkdirError(
        f"{flag}={path}: its path holds {' '.join(found)}, which the "
        "checkpoint library (Orbax) reads as a file pattern, so checkpoints "
        "written there could not be read back. Use a path without "
        f"{' '.join(GLOB_CHARACTERS)}.")


def read_saved_config(workdir: str) -> dict | None:
  """The workdir's config.json as a dict; None if it has none.

  Raises:
    WorkdirError: naming config.json, when it is not a readable JSON object.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  return _read_json(path) if files.exists(path) else None


def _read_json(path: str) -> dict:
  """The JSON object in `path`.

  Raises:
    WorkdirError: naming `path`, when it is not a readable JSON object.
  """
  try:
    value = json.loads(files.read_text(path))
  except json.JSONDecodeError as e:
    raise WorkdirError(
        f"{path} is not valid JSON ({e.msg}, line {e.lineno} column "
        f"{e.colno}): restore it, or use another --workdir.") from None
  except (OSError, UnicodeDecodeError) as e:
    reason = e.strerror if isinstance(e, OSError) and e.strerror else e
    raise WorkdirError(f"{path} cannot be read ({reason}).") from None
  if not isinstance(value, dict):
    raise WorkdirError(f"{path} does not hold a config (a JSON object): "
                       "restore it, or use another --workdir.")
  return value


def check_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a workdir whose saved config differs in a model-shape field.

  Raises:
    ConfigError: naming the field, the saved and the given value.
    WorkdirError: config.json cannot be read.
  """
  check_saved_config(config, read_saved_config(workdir), workdir)


def check_saved_config(config: ml_collections.ConfigDict,
                       saved: dict | None, workdir: str) -> None:
  """`check_config` on `saved`, the workdir's config.json as read (None:
  the workdir has none).

  Raises:
    ConfigError: naming the field, the saved and the given value.
  """
  if saved is None:
    return
  path = os.path.join(workdir, CONFIG_FILE)
  check_saved_fields(saved, path)
  given = json.loads(config.to_json())
  location = "location" in (saved.get("attention_type"),
                            given.get("attention_type"))
  for field in MODEL_SHAPE_FIELDS:
    if field in LOCATION_FIELDS and not location:
      continue
    if field in saved and saved[field] != given.get(field):
      raise ConfigError(
          f"{path} was written with {field}={saved[field]!r} but the config "
          f"gives {field}={given.get(field)!r}; a workdir holds one model. "
          f"Use another --workdir or --config.{field}={saved[field]!r}.")
  for field in LANGUAGE_FIELDS:
    if field in saved and saved[field] != given.get(field):
      raise ConfigError(
          f"{path} was written with {field}={saved[field]!r} but the config "
          f"gives {field}={given.get(field)!r}; a workdir translates one "
          "language pair. Use another --workdir (config.init_from=<this "
          f"workdir> starts from its parameters) or --config.{field}="
          f"{saved[field]!r}.")


def check_saved_fields(saved, path: str,
                       error: type[UserError] = WorkdirError) -> None:
  """The model fields of a workdir's config.json (`saved`, read from
  `path`) by their rules (`validation.FIELDS`): a file edited into a value
  no run writes (`num_heads: "four"`) is named, not compared with the
  given config or handed to the model.

  Raises:
    error: naming the file, the field and its value.
  """
  for field in MODEL_SHAPE_FIELDS:
    if field in saved and field in validation.FIELDS:
      try:
        validation.check_field(field, saved[field])
      except ConfigError as e:
        raise error(f"{path}: {e} The file was edited or damaged: put the "
                    "value back, or use another --workdir.") from None


def changed_data_fields(config: ml_collections.ConfigDict,
                        saved: dict | None) -> list[str]:
  """DATA_ORDER_FIELDS whose value differs from `saved` (the workdir's
  config.json as read), as 'field: saved -> given' (empty for a new
  workdir: `saved` None)."""
  if saved is None:
    return []
  given = json.loads(config.to_json())
  return [f"{field}: {saved[field]!r} -> {given.get(field)!r}"
          for field in DATA_ORDER_FIELDS
          if field in saved and saved[field] != given.get(field)]


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  files.write_bytes_atomic(os.path.join(workdir, CONFIG_FILE),
                           config.to_json(indent=2).encode("utf-8"))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config a training run stored in `workdir`.

  Raises:
    FileNotFoundError: `workdir` has no config.json.
    WorkdirError: config.json is not a readable JSON object (names it).
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not files.exists(path):
    raise FileNotFoundError(f"{path} does not exist: is {workdir} a workdir "
                            "written by train.py?")
  return ml_collections.ConfigDict(_read_json(path))


def _process_start(pid: int) -> str | None:
  """When process `pid` started, in clock ticks since boot (Linux), so a
  reused pid is not taken for the process that wrote a lock."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      stat = f.read()
  except OSError:
    return None
  return stat.rsplit(")", 1)[-1].split()[19]


def _boot_id() -> str | None:
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      return f.read().strip()
  except OSError:
    return None


def _is_running(holder: dict) -> bool:
  """Whether the process that wrote `holder` (on this host) still runs."""
  pid = holder.get("pid")
  if not isinstance(pid, int) or pid <= 0:
    return False
  boot = holder.get("boot_id")
  if boot and _boot_id() and boot != _boot_id():
    return False  # the host rebooted since
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # it runs, as another user
  start = holder.get("process_start")
  return not start or _process_start(pid) in (None, start)


def is_workdir(path: str) -> bool:
  """Whether the local folder `path` is a training run's workdir: a
  config.json and a checkpoints/ folder or a vocabulary."""
  return (os.path.isfile(os.path.join(path, CONFIG_FILE)) and (
      os.path.isdir(os.path.join(path, CHECKPOINTS_DIR)) or
      os.path.isfile(os.path.join(path, VOCABULARY_FILE)) or
      os.path.isfile(os.path.join(path, tokenizer.ID_TABLE_FILENAME))))


class WorkdirLock:
  """`<workdir>/lock`: one training run per workdir.

  The file holds the host, pid and start time of the run that holds it. It
  appears atomically (`files.create_new`: locally a complete temporary file
  hard-linked to the name, or O_CREAT|O_EXCL; on gs:// an upload with
  `ifGenerationMatch=0`), so two runs cannot both take it, on one host or
  on several sharing a bucket. A lock whose process no longer runs on this
  host (killed with -9, or the host rebooted) is taken over with a warning,
  by replacing it only if it is still the one read
  (`files.replace_if_unchanged`); a lock of a running process, or of
  another host (whose processes cannot be seen from here), refuses the run.
  """

  def __init__(self, workdir: str, path: str | None = None):
    """A lock of `workdir`, the file `path` (default `<workdir>/lock`)."""
    self.workdir = workdir
    self.path = path or os.path.join(workdir, LOCK_FILE)
    self.info = {
        "host": socket.gethostname(), "pid": os.getpid(),
        "started": datetime.datetime.now().astimezone().isoformat(
            timespec="seconds"),
        "process_start": _process_start(os.getpid()), "boot_id": _boot_id(),
    }
    self._text = (json.dumps(self.info, indent=2) + "\n").encode("utf-8")
    self.held = False

  def acquire(self) -> None:
    """Takes the lock.

    Raises:
      WorkdirError: another run holds it, naming that run and the file, or
        the file cannot be written.
    """
    try:
      self.held = self._acquire()
    except OSError as e:
      raise WorkdirError(
          f"Cannot take the lock {self.path}: {os_reason(e)}. Free space or "
          "make the folder writable, or use another --workdir.") from None

  def _acquire(self) -> bool:
    for _ in range(5):
      if files.create_new(self.path, self._text):
        return True
      read = self._read()
      if read is None:
        continue  # released meanwhile: try again
      holder, raw = read
      if holder.get("host") != self.info["host"]:
        raise self.busy(holder, same_host=False)
      if _is_running(holder):
        raise self.busy(holder, same_host=True)
      if files.replace_if_unchanged(self.path, raw, self._text):
        logging.warning(
            "Taking over the stale lock %s of process %s on %s (started %s), "
            "which no longer runs.", self.path, holder.get("pid"),
            holder.get("host"), holder.get("started"))
        return True
      # another run took it over, or released it, meanwhile: look again
    raise WorkdirError(f"Could not take {self.path}: other runs keep taking "
                       "and releasing it. Start one run per workdir.")

  def busy(self, holder: dict, same_host: bool) -> UserError:
    """The error for a lock that `holder` holds (on this host or not)."""
    if not same_host:
      return WorkdirError(
          f"{self.workdir} is locked by process {holder.get('pid')} on host "
          f"{holder.get('host')} (started {holder.get('started')}); one "
          f"training run per workdir. If that run is gone, delete "
          f"{self.path}.")
    return WorkdirError(
        f"{self.workdir} is in use by process {holder.get('pid')} on "
        f"{holder.get('host')} (started {holder.get('started')}; lock "
        f"{self.path}): one training run per workdir. Wait for it or "
        "stop it, or use another --workdir.")

  def _read(self) -> tuple[dict, bytes] | None:
    """The lock's content and its bytes; None if it does not exist."""
    try:
      raw = files.read_bytes(self.path)
    except FileNotFoundError:
      return None
    try:
      holder = json.loads(raw)
    except ValueError:
      holder = None
    if not isinstance(holder, dict):
      raise WorkdirError(
          f"{self.path} is not a lock written by train.py. If no run uses "
          f"{self.workdir}, delete {self.path}.")
    return holder, raw

  def release(self) -> None:
    """Deletes the lock file if it is still ours."""
    if self.held:
      self.held = False
      with contextlib.suppress(OSError):
        files.remove_if_unchanged(self.path, self._text)


class Workdir:
  """The paths of a training workdir and its lock.

  Attributes:
    path: the workdir.
    config_path, lock_path, vocabulary_path, tokenized_path, metrics_path,
      checkpoints_path, eval_root: the files and folders of its layout;
      `checkpoints_path` is absolute (Orbax refuses a relative path).
  """

  def __init__(self, path: str | os.PathLike[str]):
    self.path = os.fspath(path)
    self.config_path = os.path.join(self.path, CONFIG_FILE)
    self.lock_path = os.path.join(self.path, LOCK_FILE)
    self.vocabulary_path = os.path.join(self.path, VOCABULARY_FILE)
    self.tokenized_path = os.path.join(self.path, TOKENIZED_DIR)
    self.metrics_path = os.path.join(self.path, RUN_METRICS_FILE)
    self.checkpoints_path = os.path.join(
        self.path if os.path.isabs(self.path) or files.has_scheme(self.path)
        else os.path.abspath(self.path), CHECKPOINTS_DIR)
    self.eval_root = os.path.join(self.path, EVAL_DIR)
    # jax.profiler traces of config.profile_steps (<time>/ folders), where
    # TensorBoard's Profile tab looks for a logdir's traces.
    self.profile_path = os.path.join(self.path, "plugins", "profile")

  def eval_path(self, split: str, step: int) -> str:
    """`<workdir>/eval/<split>_<step>`: one evaluation's outputs."""
    return os.path.join(self.eval_root, f"{split}_{step}")

  def has_vocabulary(self) -> bool:
    """The workdir holds a vocabulary: its shared `spm.model`, or a
    separate one (`vocab.json` with `source.spm` and `target.spm`)."""
    return (files.exists(self.vocabulary_path)
            or tokenizer.has_separate(self.path))

  def load_tokenizer(self, config: ml_collections.ConfigDict
                     ) -> tokenizer.Tokenizer | tokenizer.SeparateTokenizer:
    """The workdir's vocabulary (`tokenizer.workdir_tokenizer`), read
    only: never trains or writes one.

    Raises:
      WorkdirError: the workdir has no spm.model (nor vocab.json).
      DataError: it cannot be read, or is not of `config.vocab_size`
        pieces (names the file).
    """
    if not self.has_vocabulary():
      raise WorkdirError(f"{self.vocabulary_path} does not exist: the "
                         "workdir has no vocabulary.")
    return tokenizer.workdir_tokenizer(config, self.path)

  def check_not_export(self) -> None:
    """Refuses a folder mha-export wrote (it has a config.json and an
    spm.model too, of CTranslate2's and the model's).

    Raises:
      WorkdirError: naming the folder.
    """
    if files.exists(os.path.join(self.path, EXPORT_MANIFEST)):
      raise WorkdirError(
          f"{self.path} is a CTranslate2 export (it holds {EXPORT_MANIFEST}),"
          " not a training workdir: give the workdir it was exported from.")

  def check_usable(self) -> dict | None:
    """Refuses, without writing, a workdir that training cannot use: a path
    with a glob character (`check_path_characters`), a path that is not a
    folder, a folder it cannot write, a bucket that does not
    exist or cannot be listed, a config.json that is not a readable JSON
    object.

    Returns:
      The config.json read (a dict), None if the workdir has none: what
      the other checks of the run look at.

    Raises:
      ConfigError: a URL of another scheme than gs://.
      WorkdirError: naming the path at fault.
    """
    check_path_characters(self.path)
    if files.is_gcs(self.path):
      try:
        files.check_bucket(self.path)
        is_file = files.isfile(self.path)
      except OSError as e:
        raise WorkdirError(f"--workdir={self.path}: {e}") from None
      if is_file:
        raise WorkdirError(f"--workdir={self.path} is an object, not a "
                           "folder: pass a new or existing workdir.")
    else:
      self._check_local_folder()
    self.check_not_export()
    return read_saved_config(self.path)

  def _check_local_folder(self) -> None:
    if os.path.lexists(self.path) and not os.path.isdir(self.path):
      raise WorkdirError(f"--workdir={self.path} is not a folder: pass a new "
                         "or existing workdir folder.")
    self._check_not_nested()
    existing = self.path
    while existing and not os.path.exists(existing):
      existing = os.path.dirname(existing.rstrip(os.sep))
    existing = existing or "."
    if not os.path.isdir(existing):
      raise WorkdirError(f"--workdir={self.path}: {existing} is not a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
      raise WorkdirError(f"--workdir={self.path}: {existing} is not writable.")

  def _check_not_nested(self) -> None:
    """Refuses a local workdir inside another run's workdir (e.g.
    `old_run/checkpoints`), or a new one that holds one in a folder of its
    own (e.g. `runs` holding `runs/old_run`): their files would mix. A
    symbolic link is followed: it is where the files go."""
    full = os.path.realpath(self.path)
    parent = os.path.dirname(full)
    while parent != os.path.dirname(parent):
      if is_workdir(parent):
        raise WorkdirError(
            f"--workdir={self.path} lies inside {parent}, the workdir of "
            "another run (it holds config.json and its checkpoints or "
            "vocabulary): use a folder outside it.")
      parent = os.path.dirname(parent)
    if os.path.isdir(full) and not is_workdir(full):
      for name in sorted(os.listdir(full)):
        if is_workdir(os.path.join(full, name)):
          raise WorkdirError(
              f"--workdir={self.path} holds {os.path.join(full, name)}, the "
              "workdir of another run: give that folder to resume it, or a "
              "new folder outside it.")

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    check_config(config, self.path)

  def write_config(self, config: ml_collections.ConfigDict) -> None:
    write_config(config, self.path)

  def load_config(self) -> ml_collections.ConfigDict:
    return load_config(self.path)

  def snapshot(self) -> "Snapshot":
    """The workdir's top level as it is now, to put back (`Snapshot`)."""
    return Snapshot(self)

  @contextlib.contextmanager
  def restored_on(self, errors: tuple[type[BaseException], ...]
                  ) -> Iterator[None]:
    """Leaves the workdir as it was if the block raises one of `errors`
    (`Snapshot.restore`).

    For a run's set-up (vocabulary, tokenized data, config.json, batch
    plan): bad data found there must not leave a half-made workdir.
    """
    snapshot = self.snapshot()
    try:
      yield
    except errors:
      snapshot.restore()
      raise

  @contextlib.contextmanager
  def lock(self) -> Iterator[WorkdirLock]:
    """Creates the folder, holds `<workdir>/lock` while the block runs.

    A local folder created here is removed again if the block fails before
    writing anything in it (gs:// has no folders to remove).

    Raises:
      WorkdirError: another run holds the lock.
    """
    created = not files.exists(self.path)
    files.makedirs(self.path)
    lock = WorkdirLock(self.path)
    try:
      lock.acquire()
      try:
        yield lock
      finally:
        lock.release()
    except BaseException:
      if created:  # a run that wrote nothing leaves no empty folder behind
        files.rmdir_if_empty(self.path)
      raise


class Snapshot:
  """A workdir's top level as it was when taken, to put back after a run
  that fails before it saves anything.

  `restore` removes the entries created since at the top of the workdir,
  and gives config.json and metrics.jsonl their earlier bytes back (locally
  their times too; an object store sets its own). What another process
  wrote meanwhile stays: an evaluation beside the run (`eval.py --follow`
  never takes the lock) writes `eval/`, an event file named by its own
  host and process, and lines of metrics.jsonl, which are appended again
  after the earlier bytes. The run's own lines of metrics.jsonl are those
  it names (`own_lines`); every other line added is another process's (a
  metrics.jsonl that was not there before and holds none of the run's
  lines is the evaluation's and stays as it is). The lock is its holder's
  to release.
  """

  def __init__(self, folder: Workdir):
    self._folder = folder
    self._local = not files.is_gcs(folder.path)
    self._entries = set(files.listdir(folder.path))
    self._saved = {}  # path -> (bytes, (atime_ns, mtime_ns) or None)
    for path in (folder.config_path, folder.metrics_path):
      if files.isfile(path):
        times = None
        if self._local:
          stat = os.stat(path)
          times = (stat.st_atime_ns, stat.st_mtime_ns)
        self._saved[path] = (files.read_bytes(path), times)

  def restore(self, own_lines: Iterable[bytes] = ()) -> None:
    """Puts the workdir's top level back; `own_lines`: the lines of
    metrics.jsonl the failed run itself wrote."""
    folder, own = self._folder, set(own_lines)
    metrics = folder.metrics_path
    created = set(files.listdir(folder.path)) - self._entries
    kept = {LOCK_FILE, EVAL_DIR, os.path.basename(metrics)}
    for name in created - kept:
      if event_files.written_by_another_process(name):
        continue
      path = os.path.join(folder.path, name)
      if files.isdir(path) and not (self._local and os.path.islink(path)):
        files.rmtree(path)
      else:
        with contextlib.suppress(FileNotFoundError):
          files.remove(path)
    saved = dict(self._saved)
    if files.isfile(metrics):
      others = _without_lines(files.read_bytes(metrics), own)
      if metrics in saved:
        data, times = saved[metrics]
        saved[metrics] = (data + _lines_added(data, others), times)
      elif own and others:
        files.write_bytes_atomic(metrics, others)
      elif own:
        files.remove(metrics)
    for path, (data, times) in saved.items():
      files.write_bytes_atomic(path, data)
      if times is not None:
        os.utime(path, ns=times)


def _lines_added(before: bytes, now: bytes) -> bytes:
  """The whole lines of `now` that `before` does not hold, in order."""
  known = set(before.splitlines(keepends=True))
  return b"".join(line for line in now.splitlines(keepends=True)
                  if line.endswith(b"\n") and line not in known)


def _without_lines(data: bytes, lines: set[bytes]) -> bytes:
  """`data` without the whole lines in `lines`."""
  if not lines:
    return data
  return b"".join(line for line in data.splitlines(keepends=True)
                  if line not in lines)
