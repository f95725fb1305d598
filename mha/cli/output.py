"""mha-translate's `--output` file: `output_file`, the rules of
docs/evaluation.md ("What mha-translate --output and mha-export
--output_dir do to what is there").

Imports neither JAX nor TensorFlow: mha-translate makes its temporary file
first thing, before the model is loaded.
"""
import contextlib
import functools
import os
import stat
import tempfile
from typing import Callable, Iterator

from absl import logging

from mha import errors


@contextlib.contextmanager
def output_file(path: str, flag: str = "--output"
                ) -> Iterator[Callable[[str], None]]:
  """A `write` for `translate_stream` that fills the file `path` (the user's
  `flag`) only if the block ends without an error.

  A regular file (or a new one) is written as a hidden temporary file beside
  it and renamed over it at the end: an error, a Ctrl-C or a SIGTERM leaves
  no partial file and an existing one as it was. A symbolic link is
  followed: the file it points at is replaced (made if missing) and the
  link kept. An existing file keeps its permission bits (a new one gets
  0666 less the umask, as `open` gives it), and a log line says it was
  replaced. A device or a named pipe (/dev/null, a FIFO, /dev/stdout when
  standard output is a pipe or a terminal) is written directly, as the
  shell's `>` writes it: there is no file to replace.

  Raises:
    DiskError: the machine refuses to write (a read-only file system, a
      folder the user cannot write, a full disk): one line naming `flag`
      and saying that nothing was written.
    Terminated: a SIGTERM (`SigTerm`) inside the block.
  """
  target = os.path.realpath(path)
  try:  # through the links (also /dev/stdout's, to what fd 1 is)
    mode = os.stat(path).st_mode
  except OSError:  # none yet (or unreadable: the temporary file says why)
    mode = None
  direct = mode is not None and not stat.S_ISREG(mode)
  if direct:
    tail = "the lines before it were written"
  else:
    tail = "nothing was written" + (
        "; the existing file is as it was" if mode is not None else "")
  refusals = functools.partial(
      _refusals, f"{flag}={path}: cannot write"
      + ("" if direct else f" in {os.path.dirname(target)}"), tail)
  with refusals():
    if direct:
      f = open(path, "wb", buffering=0)  # pylint: disable=consider-using-with
    else:
      f = tempfile.NamedTemporaryFile(  # pylint: disable=consider-using-with
          "wb", dir=os.path.dirname(target), prefix=".mha-translate-",
          delete=False)

  def write(text: str) -> None:
    with refusals():
      f.write(text.encode("utf-8"))

  try:
    yield write
    with refusals():
      f.close()
      if not direct:
        os.chmod(f.name, stat.S_IMODE(mode) if mode is not None
                 else 0o666 & ~_umask())
        os.replace(f.name, target)
  except BaseException as e:
    with contextlib.suppress(OSError):
      f.close()
    if not direct:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(f.name)
    if isinstance(e, errors.SigTerm):
      raise errors.Terminated(f"Stopped by SIGTERM: {flag}={path} was not "
                              "written.") from None
    raise
  if mode is not None and not direct:
    logging.info("Replaced the existing file %s%s (its mode %04o kept).",
                 target, f" (through the link {path})"
                 if os.path.islink(path) else "", stat.S_IMODE(mode))


@contextlib.contextmanager
def _refusals(head: str, tail: str) -> Iterator[None]:
  """An OSError inside as the one line of a `DiskError`: '<head>: <what the
  machine refused>; <tail>.'"""
  try:
    yield
  except OSError as e:
    raise errors.DiskError(f"{head}: {errors.os_reason(e)}; {tail}.") from None


def _umask() -> int:
  umask = os.umask(0)
  os.umask(umask)
  return umask
