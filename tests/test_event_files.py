"""TensorBoard event files without TensorFlow, read back by TensorFlow's and
TensorBoard's own readers."""
import logging
import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from mha.store import event_files
from mha.store import metrics as metrics_lib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _events(path) -> list:
  """The events of one file, through TensorFlow's TFRecord reader (which
  checks both checksums of every record)."""
  return list(tf.compat.v1.train.summary_iterator(str(path)))


def test_scalars_and_hparams_as_tensorflow_and_tensorboard_read_them(
    tmp_path):
  writer = event_files.EventFileWriter(str(tmp_path))
  writer.write_scalars(1, {"loss": 2.5, "bleu": 0.0})
  writer.write_scalars(5, {"loss": 1.25})
  assert len(_events(writer.path)) == 3  # in the file already, not buffered
  writer.write_hparams({"d_model": 32, "dropout": 0.1, "name": "x",
                        "share": True})
  writer.close()
  writer.close()  # again: nothing
  writer.flush()  # after close: nothing
  (path,) = tmp_path.glob("events.out.tfevents.*")
  assert path == pathlib.Path(writer.path)
  events = _events(path)
  assert events[0].file_version == "brain.Event:2"
  scalars = [(e.step, v.tag, float(tf.make_ndarray(v.tensor)))
             for e in events[1:3] for v in e.summary.value]
  assert scalars == [(1, "loss", 2.5), (1, "bleu", 0.0), (5, "loss", 1.25)]
  (hparams,) = events[3].summary.value
  data = plugin_data_pb2.HParamsPluginData.FromString(
      hparams.metadata.plugin_data.content)
  assert {k: getattr(v, v.WhichOneof("kind")) for k, v in
          data.session_start_info.hparams.items()} == {
              "d_model": 32, "dropout": 0.1, "name": "x", "share": True}
  # What TensorBoard's scalar dashboard reads: tensors of the scalars plugin.
  accumulator = plugin_event_accumulator.EventAccumulator(str(tmp_path))
  accumulator.Reload()
  assert accumulator.PluginTagToContent("scalars").keys() == {"loss", "bleu"}
  loss = accumulator.Tensors("loss")
  assert [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in loss] == [
      (1, 2.5), (5, 1.25)]
  assert accumulator.PluginTagToContent("hparams")


def test_writers_one_after_another_write_files_of_their_own(tmp_path,
                                                            monkeypatch):
  # In one second, each writer closed and freed before the next starts (as
  # a run resumed in the same process): one file each, none appended to
  # (on gs://: none replaced).
  monkeypatch.setattr(event_files.time, "time", lambda: 1795563533.0)
  for step in (1, 2, 3):
    writer = event_files.EventFileWriter(str(tmp_path))
    writer.write_scalars(step, {"loss": 1.0})
    writer.close()
    del writer
  assert sorted([e.step for e in _events(path)[1:]]
                for path in tmp_path.glob("events.out.tfevents.*")) == [
                    [1], [2], [3]]


@pytest.mark.parametrize("offset", [3, 9, 14, -2])
def test_a_damaged_byte_fails_tensorflows_checksums(tmp_path, offset):
  # In the length, its checksum, the event, the event's checksum.
  writer = event_files.EventFileWriter(str(tmp_path))
  writer.close()
  path = pathlib.Path(writer.path)
  data = bytearray(path.read_bytes())
  assert len(_events(path)) == 1
  data[offset] ^= 0x01
  path.write_bytes(bytes(data))
  with pytest.raises(tf.errors.DataLossError):
    _events(path)


def test_masked_crc32c_against_a_known_value():
  # TFRecord's masking of CRC-32C (crc32c(b"123456789") = 0xE3069283, the
  # standard check value): rotate right by 15, add 0xA282EAD8, mod 2**32.
  crc = 0xE3069283
  expected = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32
  assert event_files.masked_crc32c(b"123456789") == expected


def test_metrics_writer_logs_clus_line_and_writes_events(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  writer.write(3, {"loss": 1 / 3, "accuracy": 0.5, "tokens_per_sec": 8226.26})
  writer.close()
  assert "[3] accuracy=0.5, loss=0.333333, tokens_per_sec=8226.26" in [
      r.getMessage() for r in caplog.records]
  (path,) = tmp_path.glob("events.out.tfevents.*")
  (event,) = _events(path)[1:]
  assert event.step == 3 and [v.tag for v in event.summary.value] == [
      "loss", "accuracy", "tokens_per_sec"]
  # Other processes log the same line and write no file.
  other = tmp_path / "other"
  metrics_lib.MetricsWriter(str(other), is_primary=False).write(3, {"a": 1.0})
  assert not other.exists()


def test_the_training_modules_do_not_import_tensorflow(tmp_path):
  # A fresh interpreter (this one has TensorFlow and matplotlib): train.py's
  # imports, the metrics and the hparams of a run; the evaluation's modules
  # import no matplotlib either (attention maps draw only when asked).
  script = (
      "import sys, train; from mha import evaluator, metrics, train_actions; "
      "from conftest import tiny_config; "
      f"w = metrics.MetricsWriter({str(tmp_path)!r}); "
      "train_actions.write_hparams(tiny_config(), w); "
      "w.write(1, {'loss': 1.0}); w.close(); "
      "print('tensorflow' in sys.modules, 'matplotlib' in sys.modules)")
  result = subprocess.run(
      [sys.executable, "-c", script], cwd=REPO, capture_output=True,
      text=True, timeout=120, check=True,
      env=dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'tests'}"))
  assert result.stdout.strip() == "False False", result.stderr
  # The hparams go into the run's own event file: one file.
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


def test_event_files_on_a_bucket(gcs_dir, tmp_path, monkeypatch):
  """gs://: the file's bytes are uploaded whole at a write UPLOAD_SECONDS
  after the last upload, at flush and at close."""
  from mha.runtime import files  # pylint: disable=g-import-not-at-top
  clock = [1000.0]
  monkeypatch.setattr(event_files.time, "monotonic", lambda: clock[0])
  writer = metrics_lib.MetricsWriter(gcs_dir)

  def uploaded():
    (name,) = [n for n in files.listdir(gcs_dir)
               if n.startswith("events.out.tfevents.")] or [None]
    if name is None:
      return []
    local = tmp_path / name
    local.write_bytes(files.read_bytes(f"{gcs_dir}/{name}"))
    return [(e.step, float(tf.make_ndarray(v.tensor)))
            for e in _events(local)[1:] for v in e.summary.value]

  writer.write(1, {"loss": 3.0})
  clock[0] += event_files.UPLOAD_SECONDS - 1
  writer.write(2, {"loss": 2.0})
  assert uploaded() == []  # metrics.jsonl only
  clock[0] += 1
  writer.write(3, {"loss": 1.5})
  assert uploaded() == [(1, 3.0), (2, 2.0), (3, 1.5)]
  writer.write(4, {"loss": 1.0})
  writer.flush()
  assert uploaded()[-1] == (4, 1.0)
  writer.write(5, {"loss": 0.5})
  writer.close()
  assert uploaded()[-1] == (5, 0.5)
