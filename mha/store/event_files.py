"""TensorBoard event files, written without TensorFlow.

An event file is a TFRecord file of `Event` protos: each record is its
length (uint64, little-endian), the masked CRC-32C of those 8 bytes, the
serialized event, and the masked CRC-32C of the event. The first event names
the file format (`brain.Event:2`); then one event per write. Scalars are
written as TensorFlow 2's `tf.summary.scalar` writes them (a 0-d float
tensor, the `scalars` plugin) and hyperparameters as the HParams tab reads
them (TensorBoard's own `hparams_pb`).

Files go through the file layer (`mha/runtime/files.py`), so a gs:// log dir
works: locally each record is appended and flushed to the file at once; an
object cannot be appended to, so on gs:// the writer keeps the file's bytes
and uploads them whole at a write at least `UPLOAD_SECONDS` after the last
upload (as TensorFlow's writer flushes every two minutes), at `flush` and at
`close` (a few hundred bytes per logged step).

TensorBoard's and clu's writers import TensorFlow when it is installed,
which would add TensorFlow's whole resident memory to the training process
(bench/README.md).
"""
import itertools
import os
import socket
import struct
import time
from typing import Any, Mapping

import google_crc32c
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import tensor_shape_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar import metadata as scalar_metadata

from mha.runtime import files

FILE_VERSION = "brain.Event:2"
UPLOAD_SECONDS = 120.0
_CRC_MASK_DELTA = 0xA282EAD8
# The files of one process, numbered as TensorFlow numbers them: an id() of
# the writer would repeat once a closed writer is freed.
_FILE_NUMBERS = itertools.count()


def masked_crc32c(data: bytes) -> int:
  """TFRecord's checksum: CRC-32C rotated right by 15 bits, plus a constant."""
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
  """`data` framed as one TFRecord record."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", masked_crc32c(length)) + data
          + struct.pack("<I", masked_crc32c(data)))


def scalar_value(tag: str, value: float) -> summary_pb2.Summary.Value:
  """A summary value as `tf.summary.scalar` writes it."""
  return summary_pb2.Summary.Value(
      tag=tag,
      tensor=tensor_pb2.TensorProto(
          dtype=types_pb2.DT_FLOAT,
          tensor_shape=tensor_shape_pb2.TensorShapeProto(),
          float_val=[value]),
      metadata=scalar_metadata.create_summary_metadata(display_name="",
                                                       description=""))


_PREFIX = "events.out.tfevents."


def _writer_part() -> str:
  """The part of an event file's name that names its writer's host and
  process."""
  return f".{socket.gethostname()}.{os.getpid()}."


def written_by_another_process(name: str) -> bool:
  """Whether `name` is an event file that another process (another host or
  process id) writes, going by the name `EventFileWriter` gives it."""
  return name.startswith(_PREFIX) and _writer_part() not in name


class EventFileWriter:
  """Writes one new event file in `logdir` (a local folder or gs://).

  Attributes:
    path: the event file.
  """

  def __init__(self, logdir: str):
    logdir = os.fspath(logdir)
    files.makedirs(logdir)
    self._gcs = files.is_gcs(logdir)
    # TensorFlow's name: time, host, process and a number that keeps two
    # writers of one process apart.
    name = (f"{_PREFIX}{int(time.time()):010d}{_writer_part()}"
            f"{next(_FILE_NUMBERS)}.v2")
    self.path = f"{logdir.rstrip('/')}/{name}"
    self._pending = bytearray()  # gs://: the whole file
    self._closed = False
    self._uploaded = time.monotonic()
    self._file = None if self._gcs else open(self.path, "ab")  # pylint: disable=consider-using-with
    self._write(event_pb2.Event(wall_time=time.time(),
                                file_version=FILE_VERSION))

  def _write(self, event: event_pb2.Event) -> None:
    data = record(event.SerializeToString())
    if self._gcs:
      self._pending += data
      if time.monotonic() - self._uploaded >= UPLOAD_SECONDS:
        self.flush()
    else:
      self._file.write(data)
      self._file.flush()

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """One event at `step` holding every scalar of `scalars`."""
    self._write(event_pb2.Event(
        wall_time=time.time(), step=int(step),
        summary=summary_pb2.Summary(value=[
            scalar_value(tag, float(value))
            for tag, value in scalars.items()])))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """The hyperparameters of the run (numbers, strings, booleans), for
    TensorBoard's HParams tab."""
    self._write(event_pb2.Event(wall_time=time.time(), step=0,
                                summary=hparams_summary.hparams_pb(
                                    dict(hparams))))

  def flush(self) -> None:
    """Writes out what was written (nothing once closed)."""
    if self._closed:
      return
    if self._gcs:
      files.write_bytes_atomic(self.path, bytes(self._pending))
      self._uploaded = time.monotonic()
    else:
      self._file.flush()

  def close(self) -> None:
    """Flushes and closes the file; closing again does nothing."""
    if self._closed:
      return
    self.flush()
    if self._file is not None:
      self._file.close()
    self._closed = True
