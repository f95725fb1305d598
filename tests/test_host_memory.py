"""mha.host_memory: the process restarts once with glibc's huge-page tunable."""
import os
import subprocess
import sys
import time

import pytest

from mha import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = ("import os, sys; sys.path.insert(0, sys.argv[1]); "
          "print('start', flush=True); "
          "from mha import host_memory; host_memory.reexec_with_huge_pages(); "
          "print(os.environ.get('GLIBC_TUNABLES', ''))")


def _run(**env_changes):
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", "MHA_NO_HUGE_PAGES")}
  env.update(env_changes)
  out = subprocess.run([sys.executable, "-c", SCRIPT, ROOT], env=env,
                       capture_output=True, text=True, check=True).stdout
  return out.splitlines()


@pytest.mark.skipif(not host_memory._kernel_allows_huge_pages(),  # pylint: disable=protected-access
                    reason="no transparent huge pages on this machine")
def test_restarts_once_with_the_tunable_kept_alongside_others():
  # Runs twice from the start (the restart), then carries on with the
  # tunable added to the ones already set.
  lines = _run(GLIBC_TUNABLES="glibc.malloc.arena_max=4")
  assert lines == ["start", "start",
                   "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1"]


def test_no_restart_when_set_or_refused():
  assert _run(GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == [
      "start", "glibc.malloc.hugetlb=0"]
  assert _run(MHA_NO_HUGE_PAGES="1") == ["start", ""]


# Records $GLIBC_TUNABLES at every interpreter start (site imports it).
_SITECUSTOMIZE = """import os
with open(os.environ["MHA_TEST_STARTS"], "a") as f:
  f.write(os.environ.get("GLIBC_TUNABLES", "") + "\\n")
"""


@pytest.mark.skipif(not host_memory._kernel_allows_huge_pages(),  # pylint: disable=protected-access
                    reason="no transparent huge pages on this machine")
@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_entry_points_restart_with_huge_pages(tmp_path, script):
  (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
  starts = tmp_path / "starts"
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", "MHA_NO_HUGE_PAGES")}
  env.update(PYTHONPATH=str(tmp_path), MHA_TEST_STARTS=str(starts))
  process = subprocess.Popen([sys.executable, script, "--workdir=unused"],
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  try:  # the restart comes first: no need to wait for the imports after it
    deadline = time.monotonic() + 60
    while (not starts.exists() or len(starts.read_text().splitlines()) < 2
           ) and process.poll() is None and time.monotonic() < deadline:
      time.sleep(0.02)
  finally:
    process.kill()
    process.wait()
  assert starts.read_text().splitlines() == ["", "glibc.malloc.hugetlb=1"]


# Run in a fresh interpreter (a test process's other threads allocate too):
# 256 MiB in 64 KiB malloc blocks (from the heap, not mmap), touched, each
# followed by a small block that stays: the freed blocks are holes glibc
# keeps resident (free() returns only the heap's top) until malloc_trim hands
# their pages back. Prints the bytes freed and the bytes released.
_HOLES = """import ctypes, sys
sys.path.insert(0, sys.argv[1])
from mha import host_memory

def resident():
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) * 1024 for line in f
                if line.startswith("RssAnon:"))

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size, count = 64 * 1024, 4096
blocks, pins = [], []
for _ in range(count):
  blocks.append(libc.malloc(size))
  pins.append(libc.malloc(64))
  ctypes.memset(blocks[-1], 1, size)
for block in blocks:
  libc.free(block)
held = resident()
assert host_memory.release_free_heap()
print(size * count, held - resident())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_release_free_heap_returns_freed_blocks_to_the_kernel():
  out = subprocess.run([sys.executable, "-c", _HOLES, ROOT],
                       capture_output=True, text=True, check=True).stdout
  freed, released = map(int, out.split())
  assert released > freed // 2, (freed, released)
