"""An evaluation's output folder on gs:// (mha.evaluation.output through the
file layer), against the Cloud Storage emulator of tests/test_gcs.py."""
import json
import pathlib

import pytest

from mha.evaluation import output as eval_output
from mha.runtime import files


def test_outputs_in_a_bucket(gcs_dir, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  out = f"{gcs_dir}/eval/test_6"
  settings = {"split": "test", "checkpoint_step": 6}
  eval_output.check_output_dir(out, settings)  # nothing there yet
  eval_output.write_outputs(out, ["a"], dict(settings, bleu=1.0))
  files.write_bytes_atomic(f"{out}/notes.txt", b"mine")

  # Written again: the same names replaced, one upload each, metrics.json
  # last; other files stay.
  uploads = []
  upload = files.write_bytes_atomic

  def recorded(path, data):
    uploads.append(path)
    upload(path, data)

  def draw(folder):
    path = pathlib.Path(folder, "attention", "x.png")
    path.parent.mkdir()
    path.write_bytes(b"png")
    return [str(path)]

  monkeypatch.setattr(files, "write_bytes_atomic", recorded)
  eval_output.check_output_dir(out, settings)  # the same settings
  maps = eval_output.write_outputs(out, ["b", "c"], dict(settings, bleu=2.0),
                                   draw)
  assert maps == [f"{out}/attention/x.png"]
  assert sorted(uploads[:-1]) == [f"{out}/attention/x.png",
                                  f"{out}/translations.txt"]
  assert uploads[-1] == f"{out}/metrics.json"
  assert files.read_bytes(f"{out}/translations.txt") == b"b\nc\n"
  assert files.read_bytes(f"{out}/attention/x.png") == b"png"
  assert json.loads(files.read_bytes(f"{out}/metrics.json")) == dict(
      settings, bleu=2.0)
  assert files.read_bytes(f"{out}/notes.txt") == b"mine"
  assert files.listdir(out) == ["attention", "metrics.json", "notes.txt",
                                "translations.txt"]

  # A NaN score uploads nothing; other settings and a file are refused.
  uploads.clear()
  with pytest.raises(ValueError, match="Out of range float"):
    eval_output.write_outputs(out, ["d"], {"bleu": float("nan")})
  assert not uploads
  with pytest.raises(eval_output.EvalError, match=(
      r"holds the results of another evaluation \(split 'test', not "
      r"'val'\)")):
    eval_output.check_output_dir(out, dict(settings, split="val"))
  with pytest.raises(eval_output.EvalError, match="notes.txt is a file"):
    eval_output.check_output_dir(f"{out}/notes.txt", settings)
  assert not list(tmp_path.iterdir())  # nothing local: no 'gs:' folder
