"""Transparent huge pages for the host memory XLA:CPU allocates per step.

XLA:CPU takes each compiled step's temporary buffer (about 1.2 GB for the
Multi30k train step) from glibc's malloc, which maps it afresh with mmap and
unmaps it when the step ends; the kernel then faults and zeroes it again in
4 KiB pages at every step (about 300,000 page faults, a quarter of the
step's CPU time in the kernel). glibc's `glibc.malloc.hugetlb=1` tunable
makes malloc ask for transparent huge pages (`madvise`), so the same buffer
faults in 2 MiB pages. The resident memory is the same.

glibc reads its tunables once, at process start, so the setting needs the
process to be started again with `GLIBC_TUNABLES` set: `reexec_with_huge_pages`
does that, once, before anything else runs. Elsewhere than Linux, with an
older glibc (< 2.35, which ignores the tunable) or with transparent huge
pages disabled in the kernel it changes nothing.

`release_free_heap` hands the heap's free pages back to the kernel: what
the compilation of a step or of the evaluation's searches freed stays in
glibc's heaps otherwise, and adds to the next train step's peak.
"""
import ctypes
import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_enabled() -> bool:
  """Whether this process was started with the tunable set."""
  return f"{TUNABLE}=" in os.environ.get("GLIBC_TUNABLES", "")


def _kernel_allows_huge_pages() -> bool:
  try:
    with open(_THP_SETTING) as f:
      return "[never]" not in f.read()
  except OSError:
    return False


def reexec_with_huge_pages() -> None:
  """Restarts this Python process with `glibc.malloc.hugetlb=1`, unless it
  has it already, is not on Linux, the kernel has transparent huge pages
  disabled, or `MHA_NO_HUGE_PAGES=1` is set. Call it first thing in an
  entry point's `main()`: it replaces the process, which runs again from the
  start with the same arguments."""
  if (not sys.platform.startswith("linux") or huge_pages_enabled()
      or os.environ.get("MHA_NO_HUGE_PAGES") == "1"
      or not _kernel_allows_huge_pages()):
    return
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  env = dict(os.environ,
             GLIBC_TUNABLES=":".join(t for t in (tunables, f"{TUNABLE}=1")
                                     if t))
  sys.stdout.flush()
  sys.stderr.flush()
  # sys.orig_argv: the command line as given (`-m module`, `-c code`, flags).
  os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)


def release_free_heap() -> bool:
  """glibc's `malloc_trim(0)`: returns the free pages of every malloc heap
  to the kernel (the resident memory drops; nothing in use moves). Returns
  whether libc has it (False elsewhere than glibc: nothing done)."""
  try:
    trim = ctypes.CDLL(None).malloc_trim
  except (OSError, AttributeError):
    return False
  trim.argtypes = [ctypes.c_size_t]
  trim(0)
  return True
