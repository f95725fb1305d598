"""The one file layer: every file of a workdir, on a local path or gs://.

Local paths use the standard library. `gs://bucket/key` URLs use the
Cloud Storage client (`google-cloud-storage`, imported only when needed),
which reads its credentials the usual way (application default
credentials; on a TPU VM, the VM's service account) and honours
$STORAGE_EMULATOR_HOST, so the same code runs against a local emulator in
the tests. Other URL schemes are refused with one line.

What an object store changes, and what this layer does about it:

- Folders do not exist: `makedirs` does nothing on gs://, a "folder" exists
  when an object's name starts with it (`isdir`), and `listdir` lists the
  next level of names.
- An upload is all or nothing, so `write_bytes_atomic` is one upload
  (locally: a temporary file renamed).
- Objects cannot be appended to: `append_bytes` downloads the object and
  uploads it whole again, on the condition that nobody changed it meanwhile
  (generation precondition), so its cost grows with the file. metrics.jsonl,
  the one file appended to, gets one line per logged step and stays small.
- `rename` is a copy and a delete on gs:// (not atomic).
- `create_new` (create-if-absent) is an upload with `ifGenerationMatch=0`
  (locally: a complete temporary file hard-linked to the name, or O_EXCL):
  of several writers exactly one succeeds. `replace_if_unchanged` swaps the
  content only if the object is still the one read (its generation): the
  workdir lock is built on these two.

`read_lines` reads a local text file (plain or gzip) as the data layer and
the evaluation's source and reference files need it.
"""
import codecs
import contextlib
import functools
import gzip
import os
import re
import shutil
import uuid
import zlib

from mha.errors import ConfigError
from mha.errors import DataError

GCS_SCHEME = "gs://"


def has_scheme(path: str | os.PathLike[str]) -> bool:
  """Whether `path` is a URL (`gs://...`) rather than a local path."""
  return "://" in os.fspath(path)


def is_gcs(path: str | os.PathLike[str]) -> bool:
  """Whether `path` is a Cloud Storage URL (`gs://bucket/...`).

  Raises:
    ConfigError: a URL of another scheme (s3://, http://, ...).
  """
  path = os.fspath(path)
  if not has_scheme(path):
    return False
  if not path.startswith(GCS_SCHEME) or len(path) == len(GCS_SCHEME):
    raise ConfigError(f"{path}: only local paths and gs://BUCKET/... URLs "
                      "are supported.")
  return True


# ------------------------------------------------------------ Cloud Storage


@functools.lru_cache(maxsize=None)
def _client_for(emulator: str | None):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  del emulator  # the client reads it from the environment itself
  return storage.Client()


def _client():
  """One client per $STORAGE_EMULATOR_HOST (tests start an emulator)."""
  return _client_for(os.environ.get("STORAGE_EMULATOR_HOST"))


def _split(path: str) -> tuple[str, str]:
  """('bucket', 'key') of 'gs://bucket/key' (no trailing slash on key)."""
  bucket, _, key = path[len(GCS_SCHEME):].partition("/")
  return bucket, key.rstrip("/")


def _blob(path: str):
  bucket, key = _split(path)
  return _client().bucket(bucket).blob(key)


def _exceptions():
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  return exceptions


@contextlib.contextmanager
def _as_os_errors(path: str):
  """Cloud Storage errors as the OSError a local file would raise."""
  exceptions = _exceptions()
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  try:
    yield
  except auth.GoogleAuthError as e:
    raise PermissionError(
        f"{path}: no usable Cloud Storage credentials ({e}). A TPU or "
        "Compute Engine VM uses its service account; elsewhere run `gcloud "
        "auth application-default login`.") from None
  except exceptions.NotFound as e:
    raise FileNotFoundError(f"{path} does not exist (or its bucket does "
                            f"not): {e.message}") from None
  except exceptions.Forbidden as e:
    raise PermissionError(f"{path}: access denied ({e.message}).") from None
  except exceptions.GoogleAPIError as e:
    raise OSError(f"{path}: {e}") from None


def _gcs_children(path: str) -> list[str]:
  """Names directly under the "folder" `path`."""
  bucket, key = _split(path)
  prefix = f"{key}/" if key else ""
  with _as_os_errors(path):
    pages = _client().list_blobs(bucket, prefix=prefix, delimiter="/")
    names = [blob.name[len(prefix):] for blob in pages]
    names += [p[len(prefix):].rstrip("/") for p in pages.prefixes]
  return sorted(name for name in set(names) if name)


def _gcs_read_versioned(path: str) -> tuple[bytes, int] | None:
  """(content, generation) of the object `path`; None if it does not exist."""
  try:
    with _as_os_errors(path):
      blob = _blob(path)
      data = blob.download_as_bytes()
  except FileNotFoundError:
    return None
  if blob.generation is None:
    raise OSError(f"{path}: the storage service sent no generation.")
  return data, blob.generation


def _gcs_upload(path: str, data: bytes, generation: int | None) -> bool:
  """Uploads `data`; False if `generation` (0 = absent) no longer holds."""
  exceptions = _exceptions()
  with _as_os_errors(path):
    try:
      _blob(path).upload_from_string(data, if_generation_match=generation)
    except exceptions.PreconditionFailed:
      return False
  return True


# ------------------------------------------------------------- operations


def exists(path: str) -> bool:
  """Whether `path` exists (a file, a folder, or on gs:// a prefix)."""
  path = os.fspath(path)
  if is_gcs(path):
    with _as_os_errors(path):
      if _blob(path).exists():
        return True
    return isdir(path)
  return os.path.exists(path)


def _gcs_is(path: str, folder: bool) -> bool:
  """Whether the gs:// `path` is a folder (objects are named under it; a
  bucket's root always is) or, not `folder`, a file (an object of that
  exact name; never a bucket's root)."""
  bucket, key = _split(path)
  if not key:
    return folder
  with _as_os_errors(path):
    if folder:
      return any(True for _ in _client().list_blobs(
          bucket, prefix=f"{key}/", max_results=1))
    return _blob(path).exists()


def isdir(path: str) -> bool:
  """Whether `path` is a folder (on gs://: objects are named under it; a
  bucket's root always is)."""
  path = os.fspath(path)
  return _gcs_is(path, True) if is_gcs(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  """Whether `path` is a file (on gs://: an object of that exact name)."""
  path = os.fspath(path)
  return _gcs_is(path, False) if is_gcs(path) else os.path.isfile(path)


def check_bucket(path: str) -> None:
  """Raises FileNotFoundError / PermissionError if the bucket of gs://
  `path` does not exist or cannot be listed; nothing for a local path."""
  path = os.fspath(path)
  if is_gcs(path):
    bucket, _ = _split(path)
    try:
      with _as_os_errors(f"{GCS_SCHEME}{bucket}"):
        list(_client().list_blobs(bucket, max_results=1))
    except FileNotFoundError:
      raise FileNotFoundError(f"The bucket {GCS_SCHEME}{bucket} does not "
                              "exist: create it first.") from None


def read_bytes(path: str) -> bytes:
  """The content of the file `path`.

  Raises:
    FileNotFoundError: it does not exist.
  """
  path = os.fspath(path)
  if is_gcs(path):
    read = _gcs_read_versioned(path)
    if read is None:
      raise FileNotFoundError(f"{path} does not exist.")
    return read[0]
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def write_bytes_atomic(path: str, data: bytes) -> None:
  """Writes `data` to `path`; readers never see a partial file.

  Several processes writing the same content (multi-host runs sharing a
  workdir) do not corrupt each other. Locally: a temporary file and a
  rename; on gs://: one upload (objects appear whole).
  """
  path = os.fspath(path)
  if is_gcs(path):
    _gcs_upload(path, data, None)
    return
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)


def append_bytes(path: str, data: bytes) -> None:
  """Adds `data` at the end of `path` (created if absent).

  Locally an append. On gs:// the object is read and uploaded whole again
  on the condition that its generation is still the one read (retried if
  another writer changed it meanwhile): a reader sees the old or the new
  content, never a part.
  """
  path = os.fspath(path)
  if is_gcs(path):
    for _ in range(10):
      read = _gcs_read_versioned(path)
      old, generation = read if read is not None else (b"", 0)
      if _gcs_upload(path, old + data, generation):
        return
    raise OSError(f"{path}: could not append, other writers keep changing "
                  "it.")
  with open(path, "ab") as f:
    f.write(data)


def makedirs(path: str) -> None:
  """Creates the folder `path` and its parents (nothing to do on gs://)."""
  path = os.fspath(path)
  if not is_gcs(path):
    os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
  """The names in the folder `path`, sorted (on gs://: the next level of
  the object names under it; [] for a prefix with no object)."""
  path = os.fspath(path)
  if is_gcs(path):
    return _gcs_children(path)
  return sorted(os.listdir(path))


def remove(path: str) -> None:
  """Deletes the file `path`.

  Raises:
    FileNotFoundError: it does not exist.
  """
  path = os.fspath(path)
  if is_gcs(path):
    with _as_os_errors(path):
      _blob(path).delete()
    return
  os.remove(path)


def rmtree(path: str) -> None:
  """Deletes the folder `path` and everything in it (no error if absent)."""
  path = os.fspath(path)
  if is_gcs(path):
    bucket, key = _split(path)
    with _as_os_errors(path):
      for blob in _client().list_blobs(bucket, prefix=f"{key}/"):
        with contextlib.suppress(_exceptions().NotFound):
          blob.delete()
    return
  shutil.rmtree(path, ignore_errors=True)


def rmdir_if_empty(path: str) -> None:
  """Removes the empty local folder `path` (gs:// has no folders)."""
  path = os.fspath(path)
  if not is_gcs(path):
    with contextlib.suppress(OSError):
      os.rmdir(path)


def rename(source: str, target: str) -> None:
  """Moves the file `source` to `target`, replacing it.

  Locally atomic (os.replace); on gs:// a copy then a delete.
  """
  source, target = os.fspath(source), os.fspath(target)
  if is_gcs(source) or is_gcs(target):
    if not (is_gcs(source) and is_gcs(target)):
      raise ValueError(f"Cannot rename {source} to {target}: both must be "
                       "gs:// or both local.")
    src_bucket, src_key = _split(source)
    dst_bucket, dst_key = _split(target)
    client = _client()
    with _as_os_errors(source):
      client.bucket(src_bucket).copy_blob(
          client.bucket(src_bucket).blob(src_key), client.bucket(dst_bucket),
          dst_key)
      client.bucket(src_bucket).blob(src_key).delete()
    return
  os.replace(source, target)


def create_new(path: str, data: bytes) -> bool:
  """Creates the file `path` holding `data`, only if it does not exist.

  Atomic: of several processes (on several hosts) creating the same path,
  exactly one gets True, and a reader never sees a partial file. On gs://
  an upload with `ifGenerationMatch=0`; locally a complete temporary file
  hard-linked to the name (or O_CREAT|O_EXCL where links are refused).
  """
  path = os.fspath(path)
  if is_gcs(path):
    return _gcs_upload(path, data, 0)
  tmp = f"{path}.{uuid.uuid4().hex}.tmp"
  try:
    with open(tmp, "wb") as f:
      f.write(data)
  except OSError:  # a full disk: no temporary file left behind
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise
  try:
    os.link(tmp, path)
    return True
  except FileExistsError:
    return False
  except OSError:  # no hard links on this filesystem
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    return True
  finally:
    os.unlink(tmp)


def replace_if_unchanged(path: str, expected: bytes, data: bytes) -> bool:
  """Replaces the content of `path` by `data` if it still is `expected`.

  Atomic against another process doing the same: of two replacing the
  same `expected`, one gets True. On gs:// an upload conditioned on the
  generation whose content was compared. Locally the file is renamed
  aside (one process wins the rename), compared, and either put back
  (another process changed it) or replaced with `create_new`.

  Returns:
    True if `path` now holds `data` written by this call.
  """
  path = os.fspath(path)
  if is_gcs(path):
    read = _gcs_read_versioned(path)
    if read is None or read[0] != expected:
      return False
    return _gcs_upload(path, data, read[1])
  aside = f"{path}.aside.{uuid.uuid4().hex}"
  try:
    os.rename(path, aside)
  except FileNotFoundError:
    return False  # another process moved it first
  try:
    with open(aside, "rb") as f:
      moved = f.read()
    if moved != expected:  # changed meanwhile: give it back
      with contextlib.suppress(FileExistsError):
        os.link(aside, path)
      return False
    return create_new(path, data)
  finally:
    os.unlink(aside)


def remove_if_unchanged(path: str, expected: bytes) -> bool:
  """Deletes `path` if it holds `expected` (on gs://, conditioned on the
  generation compared); False if it does not exist or holds other bytes."""
  path = os.fspath(path)
  if is_gcs(path):
    read = _gcs_read_versioned(path)
    if read is None or read[0] != expected:
      return False
    exceptions = _exceptions()
    try:
      _blob(path).delete(if_generation_match=read[1])
    except (exceptions.NotFound, exceptions.PreconditionFailed):
      return False
    return True
  try:
    with open(path, "rb") as f:
      if f.read() != expected:
        return False
    os.unlink(path)
  except FileNotFoundError:
    return False
  return True


# ------------------------------------------------------------ local text


# Valid UTF-8 still, but no text: UTF-16 (ASCII text with a NUL after each
# letter decodes as UTF-8) or a binary file.
NUL_BYTE = ("a NUL byte: a UTF-16 or binary file? Text must be UTF-8 "
            "(iconv -f UTF-16 -t UTF-8 converts it).")


def read_lines(path: str) -> list[str]:
  """The lines of a UTF-8 text file (plain or gzip), without line endings.

  A byte order mark (U+FEFF) at the start of the file is dropped.

  Raises:
    DataError: the file is a directory, not valid UTF-8 or holds a NUL
      byte (naming the line), or not a readable gzip file (a damaged
      deflate stream included).
  """
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      data = f.read()
  except IsADirectoryError:
    raise DataError(f"{path} is a directory, not a text file.") from None
  except (OSError, EOFError, zlib.error) as e:
    damaged = (" The gzip file is damaged or cut short: copy or download it "
               "again." if path.endswith(".gz") and not isinstance(
                   e, (FileNotFoundError, PermissionError)) else "")
    raise DataError(f"Cannot read {path}: {e}.{damaged}") from None
  start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
  try:
    text = data[start:].decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, start + e.start) + 1
    raise DataError(f"{path}, line {line}: invalid UTF-8 "
                    f"({e.reason} at byte {start + e.start}).") from None
  nul = text.find("\0")
  if nul >= 0:
    raise DataError(f"{path}, line {text.count(chr(10), 0, nul) + 1}: "
                    f"{NUL_BYTE}")
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  return [line[:-1] if line.endswith("\r") else line for line in lines]


def safe_name(split: str) -> str:
  """`split` reduced to characters safe in a file name."""
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", split)[:60]
