"""Faults of mha-translate's and mha-export's outputs (issue 58), made to
happen for real where the machine allows: a read-only bind mount, a full
tmpfs, real symbolic links and named pipes, a real SIGTERM. Each case
checks the one line naming the flag, the exit status, and that nothing of
the user's was lost or left behind. The helpers that mount are
tests/test_faults.py's (they skip where the machine does not allow it).
"""
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading

import pytest

import mha
from configs import quickstart
from conftest import file_hashes
from mha import data
from mha import validation
from mha.errors import DamagedCheckpointError
from mha.huggingface import export as hf_export
from test_faults import _fill
from test_faults import read_only
from test_faults import small_disk


REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sources():
  return data.load_text_pairs(quickstart.get_config(), "test[:3]")[0]


@pytest.fixture(scope="module")
def want(random_workdir, sources):
  """The translations of `sources`, one line each, as mha-translate writes
  them."""
  return "".join(text + "\n" for text in mha.load(
      str(random_workdir)).translate(sources))


@pytest.fixture
def source(tmp_path, sources) -> pathlib.Path:
  path = tmp_path / "src.txt"
  path.write_text("\n".join(sources) + "\n", encoding="utf-8")
  return path


def _read_all(fd: int) -> bytes:
  with os.fdopen(fd, "rb") as f:
    return f.read()


def _one_line(capsys, pattern: str) -> str:
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("mha-")]
  assert len(lines) == 1 and "Traceback" not in err, err
  assert re.fullmatch(pattern, lines[0]), lines[0]
  return lines[0]


# ------------------------------------------------------ mha-translate --output


def test_output_into_a_read_only_file_system_is_one_line(
    random_workdir, source, tmp_path, translate_main, capsys):
  """Case 2: the one line names --output and the file system, not the
  hidden temporary file; the file there is as it was."""
  folder = tmp_path / "ro"
  folder.mkdir()
  (folder / "out.txt").write_text("earlier\n")
  with read_only(folder):
    capsys.readouterr()
    assert translate_main(f"--workdir={random_workdir}", f"--input={source}",
                          f"--output={folder / 'out.txt'}") == 1
    _one_line(capsys, re.escape(
        f"mha-translate: --output={folder / 'out.txt'}: cannot write in "
        f"{folder}: the file system is read-only; nothing was written; the "
        "existing file is as it was."))
  assert os.listdir(folder) == ["out.txt"]
  assert (folder / "out.txt").read_text() == "earlier\n"


def test_output_onto_a_full_disk_is_one_line_and_keeps_the_file(
    random_workdir, source, tmp_path, translate_main, capsys):
  """Case 2 (a full disk): the translations do not fit; the earlier file is
  whole and no temporary file is left."""
  with small_disk(tmp_path / "disk", 1) as disk:
    (disk / "out.txt").write_text("earlier\n")
    _fill(disk, leave=0)
    capsys.readouterr()
    assert translate_main(f"--workdir={random_workdir}", f"--input={source}",
                          f"--output={disk / 'out.txt'}") == 1
    _one_line(capsys, re.escape(
        f"mha-translate: --output={disk / 'out.txt'}: cannot write in {disk}"
        ": the disk is full; nothing was written; the existing file is as it "
        "was."))
    assert sorted(os.listdir(disk)) == ["filler", "out.txt"]
    assert (disk / "out.txt").read_text() == "earlier\n"


# Run as another user: `output_file` into `sys.argv[1]`, printing the one
# line of its DiskError (or what else it raised).
_WRITE_AS_ANOTHER_USER = """
import sys
from mha.cli import output
from mha.errors import DiskError
try:
  with output.output_file(sys.argv[1]) as write:
    write("text\\n")
  print("no error")
except DiskError as e:
  print(e)
"""


def test_output_into_a_folder_the_user_cannot_write_is_one_line():
  """Case 2 (no permission): a process of another user (uid 65534, started
  by root with setpriv) writes `output_file` into a root's folder of mode 0755:
  the one line names --output, the folder and the reason, not the hidden
  temporary file."""
  if os.geteuid() != 0 or not shutil.which("setpriv"):
    pytest.skip("another user's process needs root and setpriv to start")
  as_another_user = ["setpriv", "--reuid=65534", "--regid=65534",
                     "--clear-groups", sys.executable]
  if subprocess.run(as_another_user + ["-c", "pass"], capture_output=True,
                    timeout=120, check=False).returncode:
    pytest.skip(f"{sys.executable} cannot be run by another user (its "
                "files are private to root: a pyenv Python in /root)")
  folder = pathlib.Path("/tmp") / f"mha-not-yours-{os.getpid()}"
  folder.mkdir(mode=0o755)
  try:
    (folder / "out.txt").write_text("earlier\n")
    done = subprocess.run(
        as_another_user + ["-c", _WRITE_AS_ANOTHER_USER,
                           str(folder / "out.txt")], cwd=REPO, capture_output=True, text=True,
        timeout=120, check=False)
    assert done.stdout == (
        f"--output={folder / 'out.txt'}: cannot write in {folder}: "
        "permission denied; nothing was written; the existing file is as it "
        "was.\n"), done.stderr[-2000:]
    assert os.listdir(folder) == ["out.txt"]
    assert (folder / "out.txt").read_text() == "earlier\n"
  finally:
    shutil.rmtree(folder)


def test_an_existing_file_keeps_its_mode_and_is_said_replaced(
    random_workdir, source, tmp_path, translate_main, capsys, caplog, want):
  """Case 7: a private file (0600) stays private; a log line says it was
  replaced. A new file gets 0666 less the umask, as `>` makes it."""
  output = tmp_path / "out.txt"
  output.write_text("earlier\n")
  output.chmod(0o600)
  with caplog.at_level(logging.INFO):  # and absl's INFO lines:
    assert translate_main(f"--workdir={random_workdir}", "--verbosity=0",
                          f"--input={source}", f"--output={output}") == 0
  assert output.read_text(encoding="utf-8") == want
  assert stat.S_IMODE(output.stat().st_mode) == 0o600
  assert f"Replaced the existing file {output} (its mode 0600 kept)." in (
      caplog.text)
  umask = os.umask(0o027)
  try:
    assert translate_main(f"--workdir={random_workdir}", f"--input={source}",
                          f"--output={tmp_path / 'new.txt'}") == 0
  finally:
    os.umask(umask)
  assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640
  assert sorted(os.listdir(tmp_path)) == ["new.txt", "out.txt", "src.txt"]


def test_a_link_is_written_through_and_a_pipe_directly(
    random_workdir, source, tmp_path, translate_main, capsys, caplog, want):
  """Case 7: a symbolic link stays a link and its target gets the
  translations (a dangling one: the target is made); a named pipe stays a
  pipe and its reader gets them; a link to the input is the input."""
  target = tmp_path / "kept" / "target.txt"
  target.parent.mkdir()
  target.write_text("earlier\n")
  target.chmod(0o640)
  link = tmp_path / "link.txt"
  link.symlink_to(target)
  with caplog.at_level(logging.INFO):
    assert translate_main(f"--workdir={random_workdir}", "--verbosity=0",
                          f"--input={source}", f"--output={link}") == 0
  assert link.is_symlink() and os.readlink(link) == str(target)
  assert target.read_text(encoding="utf-8") == want
  assert stat.S_IMODE(target.stat().st_mode) == 0o640
  assert f"(through the link {link})" in caplog.text
  dangling = tmp_path / "dangling.txt"
  dangling.symlink_to(tmp_path / "kept" / "made.txt")
  assert translate_main(f"--workdir={random_workdir}", f"--input={source}",
                        f"--output={dangling}") == 0
  assert dangling.is_symlink()
  assert (tmp_path / "kept" / "made.txt").read_text(encoding="utf-8") == want
  assert sorted(os.listdir(tmp_path / "kept")) == ["made.txt", "target.txt"]

  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  got = []
  reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()),
                            daemon=True)
  reader.start()
  assert translate_main(f"--workdir={random_workdir}", f"--input={source}",
                        f"--output={fifo}") == 0
  reader.join(timeout=60)
  assert got == [want.encode("utf-8")]
  assert stat.S_ISFIFO(fifo.lstat().st_mode)

  # /dev/stdout with standard output a pipe: the pipe's reader gets them
  # (the link /dev/stdout is not replaced by a file).
  read_end, write_end = os.pipe()
  got, saved = [], os.dup(1)
  reader = threading.Thread(target=lambda: got.append(_read_all(read_end)),
                            daemon=True)
  reader.start()
  os.dup2(write_end, 1)
  os.close(write_end)
  try:
    status = translate_main(f"--workdir={random_workdir}",
                            f"--input={source}", "--output=/dev/stdout")
  finally:
    os.dup2(saved, 1)
    os.close(saved)
  reader.join(timeout=60)
  assert status == 0 and got == [want.encode("utf-8")]
  assert os.path.islink("/dev/stdout")

  to_input = tmp_path / "to_input.txt"
  to_input.symlink_to(source)
  before = source.read_bytes()
  capsys.readouterr()
  assert translate_main(f"--workdir={random_workdir}", f"--input={source}",
                        f"--output={to_input}") == 1
  _one_line(capsys, f"mha-translate: --output={re.escape(str(to_input))} is "
            "the input file.")
  assert source.read_bytes() == before


# --------------------------------------------- a damaged newest checkpoint


def test_a_damaged_checkpoints_advice_names_each_readers_own_setting(
    copy, translate_main, capsys):
  """Case 6: eval.py's --checkpoint_step, mha-translate's --step, the
  Python API's keyword arguments (mha.load's and export's `step=`),
  mha-export's --step in both formats."""
  (copy / "checkpoints" / "6" / "state" / "_METADATA").unlink()
  before = file_hashes(copy)
  head = re.escape(f"Checkpoint {copy}/checkpoints/6 is damaged: "
                   "state/_METADATA is missing; the newest intact "
                   "checkpoint is step 4: ")
  with pytest.raises(DamagedCheckpointError, match=head + "load it with "
                     "step=4.$"):
    mha.load(str(copy))
  capsys.readouterr()
  assert translate_main(f"--workdir={copy}") == 1
  _one_line(capsys, "mha-translate: " + head + "load it with --step=4.")
  from mha import export  # pylint: disable=import-outside-toplevel
  pytest.importorskip("ctranslate2")
  with pytest.raises(DamagedCheckpointError, match=head + "export it with "
                     "step=4.$"):
    export.export(str(copy), str(copy.parent / "ct2"))
  with pytest.raises(DamagedCheckpointError, match=head + "export it with "
                     "--step=4.$"):
    with validation.as_flags():
      export.export(str(copy), str(copy.parent / "ct2"))
  # The Hugging Face export reads the checkpoint as the CTranslate2 one.
  pytest.importorskip("safetensors")
  with pytest.raises(DamagedCheckpointError, match=head + "export it with "
                     "--step=4.$"):
    with validation.as_flags():
      hf_export.export_model(str(copy), str(copy.parent / "hf"))
  from mha.evaluation import evaluator  # pylint: disable=g-import-not-at-top
  with pytest.raises(DamagedCheckpointError, match=head + "evaluate it with "
                     "checkpoint_step=4.$"):
    evaluator.evaluate(str(copy), split="test[:2]")
  assert file_hashes(copy) == before
  assert sorted(os.listdir(copy.parent)) == ["run"]
  shutil.rmtree(copy)


# ------------------------------------------------------ mha-export --output_dir


@pytest.fixture
def export_main(monkeypatch):
  """mha-export's main in this process (conftest's `_command_main`)."""
  pytest.importorskip("ctranslate2")
  from conftest import _command_main  # pylint: disable=import-outside-toplevel
  yield from _command_main(monkeypatch, "mha.cli.export", "mha-export")


def test_export_onto_a_full_disk_or_read_only_folder_is_one_line(
    tiny_workdir, tmp_path, export_main, capsys):
  """Case 3: CTranslate2's serializer meets a full disk (or the lock a
  read-only file system): one line naming --output_dir; the earlier export
  is whole and no staging folder, set-aside export or lock is left."""
  with small_disk(tmp_path / "disk", 8) as disk:
    output = disk / "ct2"
    assert export_main(f"--workdir={tiny_workdir}", f"--output_dir={output}",
                       "--step=2") == 0
    before = file_hashes(disk)
    _fill(disk, leave=64 * 1024)  # the lock fits, the model does not
    capsys.readouterr()
    assert export_main(f"--workdir={tiny_workdir}",
                       f"--output_dir={output}") == 1
    _one_line(capsys, re.escape(
        f"mha-export: --output_dir={output}: cannot write the export in "
        f"{disk}: the disk is full; nothing was written; the earlier export "
        "there is as it was."))
    (disk / "filler").unlink()
    assert file_hashes(disk) == before
  folder = tmp_path / "ro"
  folder.mkdir()
  with read_only(folder):
    assert export_main(f"--workdir={tiny_workdir}",
                       f"--output_dir={folder / 'ct2'}") == 1
    _one_line(capsys, re.escape(
        f"mha-export: --output_dir={folder / 'ct2'}: cannot write the export "
        f"in {folder}: the file system is read-only; nothing was written."))
  assert os.listdir(folder) == []


def test_a_linked_output_dir_is_written_through_the_link(tiny_workdir,
                                                         tmp_path):
  """Cases 4 and 10: a symbolic link to an empty folder, then to the export
  made there: the folder it points at gets the export, the link stays,
  nothing is left beside either; a dangling link: its target is made."""
  from mha import export  # pylint: disable=import-outside-toplevel
  pytest.importorskip("ctranslate2")
  target = tmp_path / "exports" / "v1"
  target.mkdir(parents=True)
  link = tmp_path / "current"
  link.symlink_to(target)
  for step in (2, 4):
    export.export(str(tiny_workdir), str(link), step=step)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads((target / export.MANIFEST_FILE).read_text())[
        "checkpoint_step"] == step
    assert sorted(os.listdir(tmp_path)) == ["current", "exports"]
    assert os.listdir(tmp_path / "exports") == ["v1"]
  dangling = tmp_path / "next"
  dangling.symlink_to(tmp_path / "exports" / "v2")
  export.export(str(tiny_workdir), str(dangling), step=6)
  assert dangling.is_symlink()
  assert json.loads((tmp_path / "exports" / "v2" / export.MANIFEST_FILE)
                    .read_text())["checkpoint_step"] == 6
  assert sorted(os.listdir(tmp_path / "exports")) == ["v1", "v2"]


def test_an_output_dir_inside_checkpoints_is_refused(copy, export_main,
                                                      capsys):
  """Case 9: an export in a workdir's checkpoints/ (by its path or through
  a link) would make the workdir's newest step a damaged checkpoint."""
  checkpoints_dir = copy / "checkpoints"
  link = copy.parent / "link"
  link.symlink_to(checkpoints_dir)
  before = file_hashes(copy)
  for output in (checkpoints_dir / "850", checkpoints_dir,
                 checkpoints_dir / "6" / "export", link / "850"):
    capsys.readouterr()
    assert export_main(f"--workdir={copy}", f"--output_dir={output}") == 1
    _one_line(capsys, re.escape(
        f"mha-export: --output_dir={output} lies inside {checkpoints_dir}, "
        f"the checkpoints of the workdir {copy}: an export there would read "
        "as a damaged checkpoint; choose a folder outside checkpoints/."))
  assert file_hashes(copy) == before
  assert sorted(os.listdir(copy.parent)) == ["link", "run"]


def _signalled_after(monkeypatch, name: str, marker: str) -> None:
  """`os.<name>` sends this process a real SIGTERM right after a call whose
  last path (the folder made, the new name) holds `marker` (the export's
  handler raises it there)."""
  function = getattr(os, name)

  def signalled(*args, **kwargs):
    function(*args, **kwargs)
    if marker in os.fspath(args[-1]):
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(os, name, signalled)


@pytest.mark.parametrize("name, marker", [
    ("makedirs", ".staging-"),  # as the staging folder is made
    ("rename", ".old-")])  # as the earlier export is set aside
def test_a_sigterm_in_the_exports_windows_leaves_the_earlier_export(
    name, marker, tiny_workdir, tmp_path, monkeypatch, export_main, capsys):
  """A SIGTERM just after the staging folder is made, or just after the
  earlier export is renamed aside: status 143, the earlier export where it
  was, whole, and nothing else left."""
  output = tmp_path / "ct2"
  assert export_main(f"--workdir={tiny_workdir}", f"--output_dir={output}",
                     "--step=2") == 0
  before = file_hashes(tmp_path)
  _signalled_after(monkeypatch, name, marker)
  capsys.readouterr()
  assert export_main(f"--workdir={tiny_workdir}",
                     f"--output_dir={output}") == 143
  _one_line(capsys, "mha-export: Stopped by SIGTERM.")
  assert file_hashes(tmp_path) == before
