"""A refused run writes nothing; one trainer per workdir; one line per error.

Each refusal is checked for its error type, its message (which names the
field or file) and for leaving the workdir as it was: every file's bytes and
modification time, or no folder at all where there was none.
"""
import hashlib
import json
import math
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from configs import base
from mha.train import config_check
from mha import data
from mha import errors
from mha.store import metrics as metrics_lib
from mha.data import batching
from mha.train import actions as train_actions
from mha.train import setup as train_setup
from mha.train import trainer
from mha import validation
from mha.store import workdir as workdir_lib
from conftest import TINY_OVERRIDES
from conftest import tiny_config
from conftest import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]


def snapshot(path: pathlib.Path) -> dict[str, tuple[str, int]] | None:
  """{relative path: (sha256, mtime_ns)} of every file and folder under
  `path`; None if `path` does not exist."""
  if not os.path.lexists(path):
    return None
  if path.is_file():
    return {".": (hashlib.sha256(path.read_bytes()).hexdigest(),
                  path.stat().st_mtime_ns)}
  result = {}
  for p in sorted(path.rglob("*")):
    digest = (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file()
              else "folder")
    result[str(p.relative_to(path))] = (digest, p.stat().st_mtime_ns)
  return result


@pytest.fixture(scope="module")
def existing(tmp_path_factory) -> pathlib.Path:
  """A workdir as a first start leaves it: config.json, spm.model, metrics.
  Tests only read it (the refusals) or copy it."""
  workdir = tmp_path_factory.mktemp("existing") / "run"
  workdir.mkdir()
  config = tiny_config()
  workdir_lib.write_config(config, str(workdir))
  data.get_tokenizer(config, str(workdir))
  (workdir / "metrics.jsonl").write_text('{"step": 5, "loss": 4.0}\n')
  return workdir


@pytest.fixture
def copy(existing, tmp_path) -> pathlib.Path:
  target = tmp_path / "copy"
  shutil.copytree(existing, target)
  return target


def _refused(error_type, message, config, workdir: pathlib.Path):
  before = snapshot(workdir)
  with pytest.raises(error_type, match=message) as error:
    trainer.train_and_evaluate(config, str(workdir))
  assert snapshot(workdir) == before
  return str(error.value)


def test_bad_data_found_in_set_up_leaves_the_workdir_as_it_was(copy,
                                                              tmp_path):
  """max_source_length=1 holds EOS alone: no example fits, which only the
  batch plan finds, after the vocabulary, tokenized data and config.json
  were written."""
  config = tiny_config(max_source_length=1)
  message = r"No example of split 'train' fits config.max_source_length=1"
  _refused(data.DataError, message, config, copy)
  new = tmp_path / "new"
  with pytest.raises(data.DataError, match=message):
    trainer.train_and_evaluate(config, str(new))
  assert not new.exists()


def test_failed_set_up_keeps_what_an_evaluation_beside_it_wrote(tmp_path):
  """eval.py --follow takes no lock: what it writes while a resumed run's
  set-up fails (its eval/ folder, its own event file, its metrics.jsonl
  lines) survives the set-up's rollback; what the set-up wrote does not."""
  folder = workdir_lib.Workdir(str(tmp_path))
  old_lines = b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'
  (tmp_path / "metrics.jsonl").write_bytes(old_lines)
  (tmp_path / "config.json").write_text("{}")
  ours = f"events.out.tfevents.1.{socket.gethostname()}.{os.getpid()}.0.v2"
  theirs = f"events.out.tfevents.1.{socket.gethostname()}.1.0.v2"
  follower_line = b'{"step": 1, "val/bleu": 3.0}\n'
  with pytest.raises(errors.DataError, match="bad data"):
    with folder.restored_on((errors.UserError,)):
      (tmp_path / "metrics.jsonl").write_bytes(old_lines[:25])  # truncated
      (tmp_path / "spm.model").write_bytes(b"set-up")
      (tmp_path / ours).write_bytes(b"set-up")
      (tmp_path / "eval").mkdir()
      (tmp_path / "eval" / "follow_val.json").write_text("{}")
      (tmp_path / theirs).write_bytes(b"follower")
      with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(follower_line + b'{"step": 1, "val')  # a line half-written
      raise errors.DataError("bad data")
  assert sorted(os.listdir(tmp_path)) == sorted(
      ["config.json", "eval", "metrics.jsonl", theirs])
  assert (tmp_path / "metrics.jsonl").read_bytes() == old_lines + follower_line
  assert (tmp_path / "eval" / "follow_val.json").exists()


def test_a_metrics_file_an_evaluation_made_during_a_failed_set_up_stays(
    tmp_path):
  # A workdir without metrics.jsonl (e.g. checkpoints brought from
  # elsewhere): the set-up never writes one, so the one that appears while
  # it fails is the follower's, and the rollback leaves it as it is, a line
  # still being written included.
  folder = workdir_lib.Workdir(str(tmp_path))
  (tmp_path / "config.json").write_text("{}")
  follower = b'{"step": 6, "val/bleu": 3.0}\n{"step": 8, "val'
  with pytest.raises(errors.DataError, match="bad data"):
    with folder.restored_on((errors.UserError,)):
      (tmp_path / "spm.model").write_bytes(b"set-up")
      (tmp_path / "metrics.jsonl").write_bytes(follower)
      raise errors.DataError("bad data")
  assert sorted(os.listdir(tmp_path)) == ["config.json", "metrics.jsonl"]
  assert (tmp_path / "metrics.jsonl").read_bytes() == follower


BAD_FIELDS = [
    (dict(num_heads=0), r"config.num_heads must be >= 1, got 0\."),
    (dict(num_heads=3), r"config.d_model=32 is not divisible by "
     r"config.num_heads=3"),
    (dict(dropout_rate=1.5), r"config.dropout_rate must be in \[0, 1\), got "
     r"1.5\."),
    (dict(attention_dropout_rate=1.0), r"attention_dropout_rate must be in"),
    (dict(label_smoothing=-0.1), r"config.label_smoothing must be in"),
    (dict(learning_rate_scale=-1.0), r"config.learning_rate_scale must be "
     r"a finite number > 0, got -1.0\."),
    (dict(warmup_steps=0), r"config.warmup_steps must be >= 1"),
    (dict(adam_b1=1.0), r"config.adam_b1 must be in \[0, 1\)"),
    (dict(adam_b2=math.nan), r"config.adam_b2 must be in \[0, 1\), got nan"),
    (dict(adam_eps=0.0), r"config.adam_eps must be a finite number > 0"),
    (dict(grad_clip_norm=-1.0), r"config.grad_clip_norm must be a finite "
     r"number >= 0"),
    (dict(vocab_size=3), r"config.vocab_size must be >= 4"),
    (dict(num_layers=0), r"config.num_layers must be >= 1"),
    (dict(num_decoder_layers=0), r"config.num_decoder_layers must be an "
     r"integer >= 1, or None"),
    (dict(d_ff=0), r"config.d_ff must be >= 1"),
    (dict(d_k=0), r"config.d_k must be an integer >= 1, or None"),
    (dict(max_source_length=0), r"config.max_source_length must be >= 1"),
    (dict(max_target_length=72), r"config.max_target_length must be <= "
     r"config.max_len=64"),
    (dict(beam_size=0), r"config.beam_size must be >= 1"),
    (dict(beam_size=513), r"config.beam_size must be <= "
     r"config.vocab_size=512, got 513\."),
    (dict(alpha=math.inf), r"config.alpha must be a finite number >= 0 "
     r"\(the length penalty; the paper: 0.6\), got inf"),
    (dict(alpha=-5.0), r"config.alpha must be a finite number >= 0 .*, "
     r"got -5.0"),
    (dict(max_decode_extra=-1), r"config.max_decode_extra must be >= 0"),
    (dict(eval_bleu_sentences=-1), r"config.eval_bleu_sentences must be >= 0"),
    (dict(keep_checkpoints=0), r"config.keep_checkpoints must be >= 1"),
    (dict(seed=-1), r"config.seed must be >= 0"),
    (dict(layer_norm="mid"), r"config.layer_norm must be one of post, pre"),
    (dict(dtype="int8"), r"config.dtype must be one of float32"),
    (dict(attention_impl="xla", attention_dropout_rate=0.1),
     r"attention_dropout_rate must be 0 with config.attention_impl='xla'"),
    (dict(eval_split=" "), r"config.eval_split must be a non-empty string"),
]


@pytest.mark.parametrize("changes, message", BAD_FIELDS)
def test_bad_field_is_refused_before_anything_is_written(
    changes, message, existing, tmp_path):
  config = tiny_config(**changes)
  with pytest.raises(errors.ConfigError, match=message):
    config_check.validate(config)
  fresh = tmp_path / "fresh"
  _refused(errors.ConfigError, message, config, fresh)
  assert not fresh.exists()
  _refused(errors.ConfigError, message, config, existing)


def test_every_numeric_field_of_base_has_a_range():
  config = base.base_config()
  # Every numeric field, and the optional sizes (None here), has a rule in
  # the one table.
  numeric = {k for k, v in config.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
  numeric |= {"d_k", "d_v", "num_encoder_layers", "num_decoder_layers"}
  assert numeric - set(validation.FIELDS) == set()
  config_check.validate(config, 8)  # the paper's config on 8 devices passes
  for arg in ("tiny", "A1", "B2", "C4", "location", "multires"):
    config_check.validate(base.get_config(arg))


def test_max_tokens_names_the_real_minimum_once(existing, tmp_path):
  num_devices = 4  # conftest
  # 24-token limits: one 24-token row per device.
  message = _refused(errors.ConfigError, r"config.max_tokens must be >= 96",
                     tiny_config(max_tokens=95), tmp_path / "fresh")
  assert "got 95: one row" in message and "on each of 4 device(s)" in message
  assert not (tmp_path / "fresh").exists()
  _refused(errors.ConfigError, "max_tokens", tiny_config(max_tokens=8),
           existing)
  # The minimum serves every training batch, whatever the sentence lengths.
  config = tiny_config(max_tokens=96)
  config_check.validate(config, num_devices)
  tok = data.get_tokenizer(config, str(existing))
  batches = data.train_batches(config, tok, num_global_devices=num_devices,
                               process_index=0, process_count=1)
  assert next(batches)["inputs"].shape[0] % num_devices == 0


def test_batch_plan_names_the_minimum_of_its_longest_bucket():
  lengths = np.array([5, 12, 20])  # buckets 8, 16 and 24
  with pytest.raises(data.DataError, match="raise max_tokens to at least 48"):
    batching.BucketPlan(np.arange(3), lengths, lengths, max_tokens=8,
                        inputs_cap=24, targets_cap=24, num_devices=2, seed=0)


def test_evaluation_serves_sentences_longer_than_the_training_limits(
    existing):
  # The smallest budget for 8-token training limits on 4 devices (8 x 4):
  # validation sentences of up to 16 pieces get one row per device.
  config = tiny_config(max_source_length=8, max_target_length=8,
                       max_tokens=32)
  config_check.validate(config, 4)
  tok = data.get_tokenizer(config, str(existing))
  batches = data.eval_batches(config, tok, "validation[:40]",
                              num_global_devices=4, process_index=0,
                              process_count=1)
  assert max(b["inputs"].shape[1] for b in batches) > 8
  assert {b["inputs"].shape[0] for b in batches} == {4}
  assert sum(int((b["inputs"] > 0).any(1).sum()) for b in batches) == 40


def test_workdir_that_is_a_file_is_refused(tmp_path):
  path = tmp_path / "file"
  path.write_text("not a workdir\n")
  _refused(errors.WorkdirError, f"--workdir={path} is not a folder",
           tiny_config(), path)


@pytest.mark.parametrize("text, message", [
    ('{"vocab_size": 512,', r"config.json is not valid JSON \(Expecting"),
    ("[1, 2]", r"config.json does not hold a config"),
])
def test_unreadable_config_json_is_named(copy, text, message):
  (copy / "config.json").write_text(text)
  error = _refused(errors.WorkdirError, message, tiny_config(), copy)
  assert str(copy / "config.json") in error
  with pytest.raises(errors.WorkdirError, match=message):
    workdir_lib.load_config(str(copy))  # eval's reader names it too


def test_a_config_json_edited_into_a_bad_value_is_named_as_such(copy):
  """Not compared with the given config (whose advice would then be to
  pass the bad value back, `--config.num_heads='four'`)."""
  config = json.loads((copy / "config.json").read_text())
  (copy / "config.json").write_text(json.dumps(dict(config, num_heads="four")))
  error = _refused(errors.WorkdirError, re.escape(
      f"{copy / 'config.json'}: config.num_heads must be an integer >= 1, "
      "got 'four'. The file was edited or damaged"), tiny_config(), copy)
  assert "--config.num_heads" not in error


def test_other_model_in_the_workdir_is_refused(existing):
  _refused(errors.ConfigError, r"num_heads=4 .* num_heads=2",
           tiny_config(num_heads=2), existing)


@pytest.mark.parametrize("field", ["eval_split", "test_split", "train_split"])
def test_every_split_is_opened_before_the_first_step(field, existing,
                                                     tmp_path):
  config = tiny_config(**{field: "nonexistent"})
  message = rf"config.{field}='nonexistent': The synthetic dataset has no"
  _refused(data.DataError, message, config, tmp_path / "fresh")
  assert not (tmp_path / "fresh").exists()
  _refused(data.DataError, message, config, existing)


def _lock(workdir: pathlib.Path, **holder) -> None:
  info = dict(host=socket.gethostname(), pid=1,
              started="2026-11-23T10:00:00+00:00")
  info.update(holder)
  (workdir / "lock").write_text(json.dumps(info))


def test_a_lock_of_a_running_process_refuses_the_run(copy):
  sleeper = subprocess.Popen(["sleep", "60"])
  try:
    _lock(copy, pid=sleeper.pid)
    message = _refused(errors.WorkdirError, "is in use by process",
                       tiny_config(), copy)
  finally:
    sleeper.kill()
    sleeper.wait()
  assert (f"process {sleeper.pid} on {socket.gethostname()} (started "
          f"2026-11-23T10:00:00+00:00; lock {copy / 'lock'})") in message


def test_a_lock_of_another_host_names_it_and_the_file(copy):
  _lock(copy, host="tpu-vm-7", pid=4242)
  message = _refused(errors.WorkdirError, "locked by process 4242 on host "
                     r"tpu-vm-7 \(started 2026-11-23T10:00:00\+00:00\)",
                     tiny_config(), copy)
  assert message.endswith(f"If that run is gone, delete {copy / 'lock'}.")


def test_two_locks_on_one_workdir_exactly_one_holds(tmp_path):
  first = workdir_lib.WorkdirLock(str(tmp_path))
  second = workdir_lib.WorkdirLock(str(tmp_path))
  first.acquire()
  with pytest.raises(errors.WorkdirError,
                     match=f"in use by process {os.getpid()}"):
    second.acquire()
  assert json.loads((tmp_path / "lock").read_text()) == first.info
  first.release()
  assert not (tmp_path / "lock").exists()
  second.acquire()  # free again
  second.release()
  assert list(tmp_path.iterdir()) == []


def test_stale_lock_is_taken_over_and_unlogged_steps_dropped(copy, caplog):
  dead = subprocess.Popen(["true"])
  dead.wait()
  _lock(copy, pid=dead.pid)
  seen = []
  write_config = workdir_lib.Workdir.write_config

  def recording(folder, config):
    seen.append(json.loads((copy / "lock").read_text()))
    return write_config(folder, config)

  workdir_lib.Workdir.write_config = recording
  try:
    trainer.train_and_evaluate(tiny_config(num_train_steps=0), str(copy))
  finally:
    workdir_lib.Workdir.write_config = write_config
  assert "Taking over the stale lock" in caplog.text
  assert f"of process {dead.pid}" in caplog.text
  assert seen[-1]["pid"] == os.getpid()  # held while the run wrote
  assert not (copy / "lock").exists()  # released at the end
  # No checkpoint: the step 5 logged by the killed run is dropped.
  assert metrics_lib.read_metrics(str(copy)) == []


def test_lock_is_released_and_new_folder_removed_on_a_bug(tmp_path,
                                                         monkeypatch):
  workdir = tmp_path / "run"
  held = []

  def failing(config, folder, inputs):
    del inputs  # what the checks loaded
    held.append(json.loads(pathlib.Path(folder.lock_path).read_text()))
    raise RuntimeError("a bug")

  monkeypatch.setattr(trainer, "_train", failing)
  with pytest.raises(RuntimeError, match="a bug"):  # keeps its type
    trainer.train_and_evaluate(tiny_config(), str(workdir))
  assert held[0]["pid"] == os.getpid()
  assert not workdir.exists()


def test_non_finite_loss_is_training_diverged():
  with pytest.raises(errors.TrainingDiverged, match="at step 7"):
    train_actions.check_finite(7, {"loss": np.nan})
  assert issubclass(errors.TrainingDiverged, errors.UserError)


# Runs train.py's flag parser and main in one process for several command
# lines (one jax import), then the last one through absl's app.run.
_DRIVER = r"""
import contextlib, io, json, sys
from absl import app, flags
import train

results = []
cases = json.loads(sys.argv[1])
for i, argv in enumerate(cases):
  argv = ["train.py"] + argv
  sys.argv = argv
  flags.FLAGS.unparse_flags()
  for name in [n for n in flags.FLAGS if n.startswith("config.")]:
    delattr(flags.FLAGS, name)  # config_flags defines them at each parse
  err = io.StringIO()
  code = 0
  with contextlib.redirect_stderr(err):
    try:
      if i == len(cases) - 1:
        app.run(train.main, argv=argv, flags_parser=train.parse_flags)
      else:
        train.main(train.parse_flags(argv))
    except SystemExit as e:
      code = e.code
  results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def test_train_py_bad_input_is_one_line_and_exit_1(existing, tmp_path):
  regular = tmp_path / "file"
  regular.write_text("x\n")
  bad_json = tmp_path / "bad_json"
  shutil.copytree(existing, bad_json)
  (bad_json / "config.json").write_text("{")
  locked = tmp_path / "locked"
  shutil.copytree(existing, locked)
  _lock(locked, pid=os.getpid())  # this test's process: running
  tiny = ["--config=configs/quickstart.py:tiny"] + [
      f"--config.{k}={v}" for k, v in TINY_OVERRIDES.items()]
  fresh = str(tmp_path / "fresh")
  # Config files of the user's that fail to load: where they fail, named.
  configs = tmp_path / "configs"
  configs.mkdir()
  (configs / "syntax.py").write_text("def get_config(:\n")
  (configs / "no_get.py").write_text("x = 1\n")
  (configs / "helper.py").write_text("def sizes():\n  return {}['d']\n")
  (configs / "raises.py").write_text(
      "import sys\nsys.path.insert(0, %r)\nimport helper\n"
      "def get_config():\n  return helper.sizes()\n" % str(configs))
  cases = [
      # First: ml_collections loads every config file as one module name,
      # so in one process a file without get_config would keep the
      # previous file's.
      ([f"--config={configs / 'no_get.py'}", f"--workdir={fresh}"],
       f"train.py: --config: the config file {configs / 'no_get.py'} "
       "defines no get_config() function."),
      ([f"--config={configs / 'syntax.py'}", f"--workdir={fresh}"],
       f"train.py: --config: {configs / 'syntax.py'}, line 1: invalid "
       "syntax (the config file "),
      ([f"--config={configs / 'raises.py'}", "--config.x=1",
        f"--workdir={fresh}"],
       f"train.py: --config: {configs / 'helper.py'}, line 2: KeyError: "
       f"'d' (the config file {configs / 'raises.py'} does not load)."),
      (["--config=configs/nonexistent.py", f"--workdir={fresh}"],
       "train.py: --config: the config file configs/nonexistent.py does not "
       "exist (relative paths start in "),
      ([*tiny, "--config.num_heads=0", f"--workdir={fresh}"],
       "train.py: config.num_heads must be >= 1, got 0."),
      ([*tiny, f"--workdir={regular}"],
       f"train.py: --workdir={regular} is not a folder"),
      ([*tiny, f"--workdir={bad_json}"],
       f"train.py: {bad_json / 'config.json'} is not valid JSON"),
      ([*tiny, "--config.eval_split=nonexistent", f"--workdir={fresh}"],
       "train.py: config.eval_split='nonexistent': The synthetic dataset has "
       "no split"),
      ([*tiny, f"--workdir={locked}"],
       f"train.py: {locked} is in use by process {os.getpid()} on "),
      ([*tiny, "--workdir="],
       "train.py: flag --workdir=: empty: give the workdir's path"),
      (["--config=configs/base.py:Z9", f"--workdir={fresh}"],
       "train.py: --config=configs/base.py:Z9: Unknown config argument 'Z9'; "
       "known: tiny, A1,"),
  ]
  before = {p: snapshot(p) for p in (regular, bad_json, locked)}
  env = dict(os.environ, XLA_FLAGS=xla_flags(1),
             JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-c", _DRIVER, json.dumps([c for c, _ in cases])],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  outputs = json.loads(result.stdout.strip().splitlines()[-1])
  for (argv, expected), (code, stderr) in zip(cases, outputs):
    lines = [line for line in stderr.splitlines()
             if line.startswith("train.py:")]
    assert code == 1, (argv, stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(expected), (argv, stderr)
    assert "Traceback" not in stderr, (argv, stderr)
  assert {p: snapshot(p) for p in before} == before
  assert not os.path.exists(fresh)


def test_a_finished_run_and_a_checkpoint_of_other_shapes_keep_the_config(
    tiny_workdir, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  config_path = workdir / "config.json"
  trained = config_path.read_bytes()
  saved = json.loads(trained)
  # Finished (step 6 of 6): other settings train nothing, so config.json
  # stays the one the checkpoints were trained with.
  result = trainer.train_and_evaluate(ml_collections.ConfigDict(
      dict(saved, dropout_rate=0.5, beam_size=1)), str(workdir))
  assert result["step"] == 6 and config_path.read_bytes() == trained
  # A config.json without d_model (edited, or older than the field) and
  # another d_model: the checkpoint's arrays name the misfit, and the
  # refused resume leaves the workdir as it was.
  del saved["d_model"]
  config_path.write_text(json.dumps(saved))
  message = (r"Checkpoint 6 in .* does not fit the config's model: "
             r"parameter params/\S+ has shape \(.*32.*\) in the checkpoint "
             r"but \(.*64.*\) in the model")
  _refused(errors.ConfigError, message, ml_collections.ConfigDict(
      dict(saved, d_model=64, num_train_steps=8)), workdir)


def test_a_run_finished_between_the_checks_and_the_lock_trains_nothing(
    tiny_workdir, tmp_path, monkeypatch, caplog, train_batches_starts):
  """Another run saves the last step (6 of 6) after this one's checks saw
  no checkpoint: under the lock the set-up finds the run finished, keeps
  config.json and reads no training data."""
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  aside = tmp_path / "checkpoints"
  (workdir / "checkpoints").rename(aside)
  trained = (workdir / "config.json").read_bytes()
  check_inputs = train_setup.check_inputs

  def finished_meanwhile(config, folder):
    inputs = check_inputs(config, folder)
    aside.rename(workdir / "checkpoints")  # the other run's steps
    return inputs

  monkeypatch.setattr(train_setup, "check_inputs", finished_meanwhile)
  caplog.set_level("INFO")
  config = ml_collections.ConfigDict(dict(json.loads(trained),
                                          dropout_rate=0.5))
  assert trainer.train_and_evaluate(config, str(workdir)) == {"step": 6}
  assert (workdir / "config.json").read_bytes() == trained
  assert train_batches_starts == []
  assert "at step 6 >= num_train_steps=6: nothing to train" in caplog.text


def test_limits_up_to_max_len_pass_and_the_longer_side_sets_the_minimum():
  # A limit equal to max_len (64) is the longest the model encodes: allowed.
  config_check.validate(tiny_config(max_source_length=64,
                                    max_target_length=64, max_tokens=256), 4)
  # Targets longer than the sources: the minimum is one row of the padded
  # target limit per device, 24 x 4.
  with pytest.raises(errors.ConfigError, match="max_tokens must be >= 96"):
    config_check.validate(tiny_config(max_source_length=8,
                                      max_target_length=24, max_tokens=95), 4)
  config_check.validate(tiny_config(max_source_length=8,
                                    max_target_length=24, max_tokens=96), 4)


def _diverge(workdir: pathlib.Path, message: str, **changes) -> None:
  """Resumes `workdir` with its config.json, `changes` and a learning rate
  10^12 times the schedule's: the loss soon becomes non-finite."""
  config = dict(json.loads((workdir / "config.json").read_bytes()),
                warmup_steps=1, learning_rate_scale=1e12, **changes)
  with pytest.raises(errors.TrainingDiverged, match=message):
    trainer.train_and_evaluate(ml_collections.ConfigDict(config),
                               str(workdir))


def test_a_resume_that_diverges_before_saving_leaves_the_workdir(
    tiny_workdir, tmp_path):
  """A resumed run whose loss is non-finite before its first save: the
  workdir is as it was, byte for byte at the top (config.json, metrics.jsonl
  with the lines the resume had dropped, no event file of its own)."""
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  before = {name: (workdir / name).read_bytes()
            for name in os.listdir(workdir) if (workdir / name).is_file()}
  # Ask the resume to drop step 6's lines: a run from step 4 rewrites them.
  shutil.rmtree(workdir / "checkpoints" / "6")
  _diverge(workdir, "at step [5-8]; stopping. This run saved no "
           "checkpoint: the workdir is left as it was", num_train_steps=8)
  after = {name: (workdir / name).read_bytes()
           for name in os.listdir(workdir) if (workdir / name).is_file()}
  assert after == before
  assert b'"step": 6' in after["metrics.jsonl"]
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]


def test_a_new_run_that_diverges_before_saving_leaves_no_workdir(tmp_path):
  new = tmp_path / "new"
  config = tiny_config(num_train_steps=4, warmup_steps=1,
                       learning_rate_scale=1e12, checkpoint_every_steps=100,
                       eval_every_steps=100, log_every_steps=1)
  with pytest.raises(errors.TrainingDiverged,
                     match="This run saved no checkpoint"):
    trainer.train_and_evaluate(config, str(new))
  assert not new.exists()


def test_a_run_that_diverges_after_saving_keeps_its_checkpoints(
    tiny_workdir, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  _diverge(workdir, "The checkpoints saved before this step are intact",
           num_train_steps=12, checkpoint_every_steps=1, log_every_steps=1)
  # Saved by this run before the loss went non-finite, with its config.
  assert "7" in os.listdir(workdir / "checkpoints")
  assert json.loads((workdir / "config.json").read_bytes())[
      "learning_rate_scale"] == 1e12


def _stopped_in_set_up(monkeypatch, signum: int | None,
                       where: str = "train_batches") -> None:
  """The set-up stopped by the signal `signum`, or by a Ctrl-C
  (KeyboardInterrupt) if None, in `where`: train_batches (after config.json,
  metrics.jsonl and an event file were written), or write_hparams, the last
  thing before the loop."""
  def stopped(*args):
    del args
    if signum is None:
      raise KeyboardInterrupt
    if not callable(signal.getsignal(signum)):  # the default: would kill
      raise AssertionError("the run's set-up does not handle the signal")
    os.kill(os.getpid(), signum)  # its handler runs before the next line
    raise AssertionError("the signal did not stop the set-up")
  monkeypatch.setattr(train_setup, where, stopped)


@pytest.mark.parametrize("where", ["train_batches", "write_hparams"])
@pytest.mark.parametrize("signum,error,message", [
    (signal.SIGTERM, errors.Terminated, "Stopped by SIGTERM during the "
     "set-up, before any step: the workdir is left as it was"),
    (None, errors.Interrupted, "the last checkpoint is step 4")],
    ids=["SIGTERM", "ctrl_c"])
def test_a_run_stopped_in_its_set_up_leaves_the_workdir(
    tiny_workdir, tmp_path, monkeypatch, signum, error, message, where):
  """A resume stopped before its first step (a preemption's SIGTERM, a
  Ctrl-C), in its set-up or after it, before the loop: config.json,
  metrics.jsonl (with the lines the resume dropped) and the folder's
  entries are as they were, and the lock is released. SIGTERM exits with
  status 143."""
  workdir = tmp_path / "run"
  shutil.copytree(tiny_workdir, workdir)
  shutil.rmtree(workdir / "checkpoints" / "6")  # the resume drops step 6
  before = snapshot(workdir)
  config = ml_collections.ConfigDict(
      json.loads((workdir / "config.json").read_bytes()))
  config.num_train_steps = 8
  _stopped_in_set_up(monkeypatch, signum, where)

  def handler(*args):  # the caller's, which the run must put back
    del args

  earlier = signal.signal(signal.SIGTERM, handler)
  try:
    with pytest.raises(error, match=message) as raised:
      trainer.train_and_evaluate(config, str(workdir))
    assert signal.getsignal(signal.SIGTERM) is handler
  finally:
    signal.signal(signal.SIGTERM, earlier)
  assert snapshot(workdir) == before
  assert raised.value.exit_code == (143 if signum else 130)


def test_a_snapshot_puts_back_the_runs_lines_only(tmp_path):
  """`Snapshot.restore(own_lines)`: the failed run's metrics lines go, an
  evaluation's lines written meanwhile stay; a metrics.jsonl the run made
  goes if only its lines are in it."""
  folder = workdir_lib.Workdir(str(tmp_path))
  metrics = tmp_path / "metrics.jsonl"
  old = b'{"step": 2, "loss": 2.0}\n'
  ours, theirs = b'{"step": 3, "loss": 9.0}\n', b'{"step": 2, "bleu": 1}\n'
  metrics.write_bytes(old)
  snapshot = folder.snapshot()
  metrics.write_bytes(old + ours + theirs + ours.replace(b"3", b"4"))
  snapshot.restore([ours, ours.replace(b"3", b"4")])
  assert metrics.read_bytes() == old + theirs
  metrics.unlink()
  for written, kept in ((ours, None), (ours + theirs, theirs)):
    snapshot = folder.snapshot()
    metrics.write_bytes(written)
    snapshot.restore([ours])
    assert (metrics.read_bytes() if metrics.exists() else None) == kept
    metrics.unlink(missing_ok=True)
