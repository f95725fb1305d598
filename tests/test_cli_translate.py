"""mha-translate (`python -m mha.cli.translate`) in a subprocess: line by
line with standard input held open, files, and bad input as one line. The
expected outputs come from `mha.load` in this process (the same layer; one
sentence at a time where the command gets one at a time). n-best lines and
samples of the command's line functions: tests/test_translator.py."""
import os
import pty
import queue
import re
import subprocess
import sys
import threading

import pytest

import mha
from configs import quickstart
from mha import data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300  # generous: the first translation compiles the search


@pytest.fixture(scope="module")
def translator(random_workdir):
  return mha.load(str(random_workdir))


@pytest.fixture(scope="module")
def sources():
  return data.load_text_pairs(quickstart.get_config(), "test[:6]")[0]


def command(workdir, *args):
  return [sys.executable, "-m", "mha.cli.translate", f"--workdir={workdir}",
          *args]


def test_prints_each_translation_before_more_input_comes(
    random_workdir, translator, sources):
  inputs = [sources[0], "", sources[1]]
  # Computed first: the command then finds the compiled searches in the
  # session's compilation cache (tests/conftest.py).
  want = [translator.translate([text])[0] for text in inputs + sources[2:3]]
  assert all(want[:1] + want[2:]) and not want[1]
  process = subprocess.Popen(command(random_workdir), cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
  lines = queue.Queue()
  threading.Thread(target=lambda: [lines.put(l) for l in process.stdout],
                   daemon=True).start()
  try:
    for i, text in enumerate(inputs):
      # Stdin stays open: the answer must come before any more input.
      process.stdin.write(text.encode("utf-8") + b"\n")
      process.stdin.flush()
      assert lines.get(timeout=TIMEOUT).decode("utf-8") == want[i] + "\n"
    process.stdin.write(sources[2].encode("utf-8"))  # no final newline
    process.stdin.close()
    assert lines.get(timeout=TIMEOUT).decode("utf-8") == want[3] + "\n"
    assert process.wait(timeout=TIMEOUT) == 0
  finally:
    process.kill()
    process.wait()
  assert lines.empty()
  stderr = process.stderr.read().decode("utf-8")
  assert "Loaded" in stderr and "Translated 4 line(s)" in stderr
  assert "Preparing the search" not in stderr  # not a terminal: no warm-up


def test_at_a_terminal_the_search_is_prepared_while_the_line_is_typed(
    random_workdir, translator, sources):
  # Standard input a terminal (a pseudo-terminal here): the warm-up starts
  # (its log line), and the lines typed are translated as from a pipe;
  # Ctrl-D after a partial line sends it, a second one ends the input.
  want = translator.translate(sources[:2])
  leader, follower = pty.openpty()
  process = subprocess.Popen(command(random_workdir), cwd=REPO,
                             stdin=follower, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
  os.close(follower)
  lines = queue.Queue()
  threading.Thread(target=lambda: [lines.put(l) for l in process.stdout],
                   daemon=True).start()
  try:
    os.write(leader, sources[0].encode("utf-8") + b"\n")
    assert lines.get(timeout=TIMEOUT).decode("utf-8") == want[0] + "\n"
    # A partial line is the last line once the input ends.
    os.write(leader, sources[1].encode("utf-8") + b"\x04")
    os.write(leader, b"\x04")
    assert lines.get(timeout=TIMEOUT).decode("utf-8") == want[1] + "\n"
    assert process.wait(timeout=TIMEOUT) == 0
  finally:
    process.kill()
    process.wait()
    os.close(leader)
  stderr = process.stderr.read().decode("utf-8")
  assert "Preparing the search for typed lines (source buckets 8, 16, 24)" in (
      stderr) and "Translated 2 line(s)" in stderr, stderr[-3000:]


def test_files_and_bad_input(random_workdir, translator, sources, tmp_path,
                             translate_main, capsys):
  lines = sources[:2] + [""] + sources[2:]
  want = translator.translate(lines)
  source = tmp_path / "src.txt"
  source.write_text("\n".join(lines) + "\n", encoding="utf-8")
  output = tmp_path / "out.txt"
  # On 2 CPU devices (the tests' XLA_FLAGS make 4: the flag wins), the
  # translations of this process's 4.
  result = subprocess.run(
      command(random_workdir, f"--input={source}", f"--output={output}",
              "--cpu_devices=2"),
      cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == ""
  assert "Searching on 2 CPU device(s)" in result.stderr
  assert output.read_text(encoding="utf-8").split("\n") == want + [""]
  # Bad input: one line, status 1, the output file left as it was (the
  # command's main in this process: the flags and checks are the same).
  before = output.read_bytes()
  capsys.readouterr()
  for args, message in [
      ([f"--input={tmp_path / 'none.txt'}", f"--output={output}"],
       "--input=.*none.txt: no such"),
      ([f"--input={source}", f"--output={source}"], "is the input file"),
      ([f"--input={source}", f"--output={output}", "--beam_stop=fast"],
       "beam_stop must be one of exact, early, got 'fast'"),
      ([f"--input={source}", f"--output={output}", "--matmul_dtype=fp8"],
       "matmul_dtype must be one of float32, bfloat16, got 'fp8'"),
      ([f"--input={source}", f"--output={output}", "--cpu_devices=0"],
       "--cpu_devices must be >= 1, got 0"),
      ([f"--input={source}", f"--output={tmp_path}"], "is a folder"),
      ([f"--input={tmp_path}", f"--output={output}"],
       "--input=.* is a folder: give the file to translate"),
      ([f"--input={source}", "--nbest=-1"], "--nbest must be >= 0"),
      ([f"--input={source}", f"--output={output}", "--temperature=0.5",
        "--top_k=3"], "--temperature, --top_k: sampling settings, used "
       "only with --sample")]:
    assert translate_main(f"--workdir={random_workdir}", *args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert re.fullmatch(f"mha-translate: .*{message}.*\n", err), err
  assert output.read_bytes() == before
  assert sorted(os.listdir(tmp_path)) == ["out.txt", "src.txt"]


def test_a_sigterm_while_writing_the_output_leaves_it_as_it_was(
    random_workdir, tmp_path):
  """Standard input stays open, so the command is still translating when
  the signal comes, wherever it is (importing, loading, compiling,
  reading): one line, status 143, the earlier file and no temporary one."""
  output = tmp_path / "out.txt"
  output.write_text("earlier\n")
  process = subprocess.Popen(command(random_workdir, f"--output={output}"),
                             cwd=REPO, stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE)
  process.stdin.write(b"ein satz\n")
  process.stdin.flush()
  # The temporary file is made before the model is loaded.
  while len(os.listdir(tmp_path)) < 2 and process.poll() is None:
    threading.Event().wait(0.05)
  process.terminate()
  stderr = process.communicate(timeout=TIMEOUT)[1].decode("utf-8")
  assert process.returncode == 143, stderr[-3000:]
  assert stderr.strip().split("\n")[-1] == (
      f"mha-translate: Stopped by SIGTERM: --output={output} was not "
      "written.")
  assert output.read_text() == "earlier\n"
  assert os.listdir(tmp_path) == ["out.txt"]


def test_output_dash_is_standard_output_and_a_closed_pipe_stops_quietly(
    random_workdir, translator, sources, tmp_path):
  """`--output=-` writes to standard output (no file named '-'); a reader
  that closes it early (`| head -1`) stops the command with SIGPIPE's
  status, 141, and no stack."""
  process = subprocess.Popen(command(random_workdir, "--output=-"),
                             cwd=tmp_path, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  lines = queue.Queue()
  threading.Thread(target=lambda: lines.put(process.stdout.readline()),
                   daemon=True).start()
  try:
    process.stdin.write(sources[0].encode("utf-8") + b"\n")
    process.stdin.flush()
    first = lines.get(timeout=TIMEOUT).decode("utf-8")
    assert first == translator.translate(sources[:1])[0] + "\n"
    process.stdout.close()  # the reader goes
    process.stdin.write(sources[1].encode("utf-8") + b"\n")
    process.stdin.close()
    assert process.wait(timeout=TIMEOUT) == 141
  finally:
    process.kill()
    process.wait()
  stderr = process.stderr.read().decode("utf-8")
  assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
  assert not (tmp_path / "-").exists()
