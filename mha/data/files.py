"""Reading and atomically writing small files in a workdir (local or gs://).

Local paths use the standard library; paths with a scheme (`gs://...`) go
through `tf.io.gfile`, imported only when needed.
"""
import os
import uuid


def has_scheme(path: str) -> bool:
  """Whether `path` is a URL (`gs://...`) rather than a local path."""
  return "://" in str(path)


def exists(path: str) -> bool:
  """Whether `path` exists."""
  if has_scheme(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.exists(path)
  return os.path.exists(path)


def read_bytes(path: str) -> bytes:
  """The content of the file `path`."""
  if has_scheme(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  with open(path, "rb") as f:
    return f.read()


def write_bytes_atomic(path: str, data: bytes) -> None:
  """Writes `data` to `path` through a temporary file and a rename.

  Readers never see a partial file, and several processes writing the same
  content (multi-host runs sharing a workdir) do not corrupt each other.
  """
  path = str(path)
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  if has_scheme(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(tmp, "wb") as f:
      f.write(data)
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)
