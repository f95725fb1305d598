r"""A line-by-line session's first line: how long its translation takes.

    python bench/first_line.py --workdir=/tmp/m30k --typing_seconds=5

Starts `mha-translate --workdir=WORKDIR` (`python -m mha.cli.translate`)
with standard input a pseudo-terminal (as a user at a terminal: the search
for typed lines is prepared in the background, `mha.cli.lines.WarmedUp`) or
a pipe (no warm-up), the two alternating `--repeats` times. After the
command's "Loaded" log line, it waits `--typing_seconds` (the user
typing), sends `--line` and measures the time until its translation is
printed. The compilation cache is the command's default (so after the
first run, the searches are loaded from it, not compiled: the usual case
on a machine that has run the command before); `--compilation_cache_dir=`
(empty) measures without it. Nothing is asserted: the figures go to
bench/README.md.
"""
import argparse
import os
import pty
import queue
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def session(args: argparse.Namespace, terminal: bool) -> float:
  """Seconds from the line sent to its translation printed."""
  command = [sys.executable, "-m", "mha.cli.translate",
             f"--workdir={args.workdir}"]
  if args.compilation_cache_dir is not None:
    command.append(f"--compilation_cache_dir={args.compilation_cache_dir}")
  leader = follower = None
  if terminal:
    leader, follower = pty.openpty()
  process = subprocess.Popen(
      command, cwd=ROOT, stdin=follower if terminal else subprocess.PIPE,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  if terminal:
    os.close(follower)
  events = queue.Queue()
  for stream, name in ((process.stdout, "out"), (process.stderr, "err")):
    threading.Thread(target=lambda s=stream, n=name: [
        events.put((n, line)) for line in s], daemon=True).start()
  try:
    while True:  # the model is loaded: the user starts typing
      name, line = events.get(timeout=600)
      if name == "err" and b"Loaded" in line:
        break
    time.sleep(args.typing_seconds)
    text = args.line.encode("utf-8") + b"\n"
    start = time.perf_counter()
    if terminal:
      os.write(leader, text)
    else:
      process.stdin.write(text)
      process.stdin.flush()
    while True:
      name, line = events.get(timeout=600)
      if name == "out":
        return time.perf_counter() - start
  finally:
    process.kill()
    process.wait()
    if leader is not None:
      os.close(leader)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--line", default="Ein Hund läuft über eine Wiese.")
  parser.add_argument("--typing_seconds", type=float, default=5.0)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--compilation_cache_dir", default=None)
  args = parser.parse_args()
  print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}; "
        f"typing {args.typing_seconds} s; line {args.line!r}")
  found = {"terminal (warm-up)": [], "pipe (none)": []}
  for _ in range(args.repeats):
    for name in found:
      seconds = session(args, terminal=name.startswith("terminal"))
      found[name].append(seconds)
      print(f"  {name}: {seconds:.2f} s (load {os.getloadavg()[0]:.2f})",
            flush=True)
  for name, times in found.items():
    print(f"{name}: median {statistics.median(times):.2f} s from the line "
          "sent to its translation")


if __name__ == "__main__":
  main()
