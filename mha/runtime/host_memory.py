"""Transparent huge pages for the host memory XLA:CPU allocates per step.

XLA:CPU takes each compiled step's temporary buffer (about 1.2 GB for the
Multi30k train step) from glibc's malloc, which maps it afresh with mmap and
unmaps it when the step ends; the kernel then faults and zeroes it again in
4 KiB pages at every step (about 300,000 page faults, a quarter of the
step's CPU time in the kernel). glibc's `glibc.malloc.hugetlb=1` tunable
makes malloc ask for transparent huge pages (`madvise`), so the same buffer
faults in 2 MiB pages. The resident memory is the same.

glibc reads its tunables once, at process start, so the setting needs the
process to be started again with `GLIBC_TUNABLES` set: `start` does that,
once, before anything else runs, where the setting helps, and `status`
says in one line whether the process runs with it. The rule:

* `MHA_HUGE_PAGES=1` asks for it, `MHA_HUGE_PAGES=0` (or the older
  `MHA_NO_HUGE_PAGES=1`) turns it off.
* Otherwise it is on for CPU hosts and off on accelerator hosts, where it
  was never measured: `JAX_PLATFORMS` naming anything but `cpu`, or (with
  `JAX_PLATFORMS` unset) a TPU or GPU device file (`/dev/accel*`,
  `/dev/vfio/<n>`, `/dev/nvidia<n>`, `/dev/kfd`) or an installed `libtpu`.
* Never elsewhere than Linux, nor with transparent huge pages disabled in
  the kernel (an older glibc, < 2.35, ignores the tunable), nor when the
  command line cannot be run again as it was: inside an interactive
  interpreter (`python -i`, IPython's `%run`) or when the running script is
  not the one on the command line (`python -c`, a test calling `run()`).

`release_free_heap` hands the heap's free pages back to the kernel: what
the compilation of a step or of the evaluation's searches freed stays in
glibc's heaps otherwise, and adds to the next train step's peak.
"""
import ctypes
import glob
import importlib.util
import os
import sys
from typing import Mapping

TUNABLE = "glibc.malloc.hugetlb"
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


ENV = "MHA_HUGE_PAGES"
OLD_ENV = "MHA_NO_HUGE_PAGES"  # =1: the switch's earlier spelling of 0
# Device files of accelerators: TPU VMs (/dev/accel<n> up to v4, /dev/vfio/<n>
# from v5e), NVIDIA and AMD GPUs.
_ACCELERATOR_FILES = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*",
                      "/dev/nvidia[0-9]*", "/dev/kfd")


def huge_pages_enabled() -> bool:
  """Whether this process was started with the tunable set."""
  return f"{TUNABLE}=" in os.environ.get("GLIBC_TUNABLES", "")


def _kernel_allows_huge_pages() -> bool:
  try:
    with open(_THP_SETTING) as f:
      return "[never]" not in f.read()
  except OSError:
    return False


def accelerator_host(environ: Mapping[str, str] = os.environ) -> str | None:
  """What makes this host an accelerator host, or None for a CPU host.

  Cheap and without importing JAX: `JAX_PLATFORMS` when set (`cpu` alone is
  a CPU host), else the accelerator device files and `libtpu`.
  """
  platforms = environ.get("JAX_PLATFORMS", "")
  if platforms:
    names = {p.strip() for p in platforms.split(",") if p.strip()}
    return None if names <= {"cpu"} else f"JAX_PLATFORMS={platforms}"
  for pattern in _ACCELERATOR_FILES:
    found = sorted(glob.glob(pattern))
    if found:
      return f"{found[0]} exists"
  if importlib.util.find_spec("libtpu") is not None:
    return "libtpu is installed"
  return None


def _restart_obstacle() -> str | None:
  """Why the command line cannot be run again as it was, or None."""
  if sys.flags.interactive or hasattr(sys, "ps1"):
    return "an interactive interpreter"
  if "IPython" in sys.modules:
    return "IPython"
  main_file = getattr(sys.modules.get("__main__"), "__file__", None)
  if (not main_file or not sys.argv or not os.path.isfile(sys.argv[0])
      or os.path.realpath(main_file) != os.path.realpath(sys.argv[0])):
    return "a script other than the command line's"
  return None


def decide(environ: Mapping[str, str] = os.environ) -> tuple[bool, str]:
  """Whether this process should run with huge pages, and why (a phrase).

  The rule of the module docstring; the restart itself is not considered.
  """
  asked = environ.get(ENV, "")
  if asked not in ("", "0", "1"):
    return False, f"{ENV}={asked} is neither 0 nor 1"
  if asked == "0" or (not asked and environ.get(OLD_ENV) == "1"):
    return False, f"{ENV}=0" if asked else f"{OLD_ENV}=1"
  if not sys.platform.startswith("linux"):
    return False, f"not Linux ({sys.platform})"
  if not _kernel_allows_huge_pages():
    return False, ("transparent huge pages are off in the kernel "
                   f"({_THP_SETTING})")
  if asked == "1":
    return True, f"{ENV}=1"
  accelerator = accelerator_host(environ)
  if accelerator:
    return False, f"an accelerator host ({accelerator}); {ENV}=1 asks for them"
  return True, "a CPU host"


# Why the process runs without them although `decide` wanted them (set by
# `start`).
_not_restarted: str | None = None


def start() -> None:
  """Restarts this Python process with `glibc.malloc.hugetlb=1` where
  `decide` says so and the process does not have it yet. Call it first
  thing in an entry point, before the heavy imports: it replaces the
  process, which runs again from the start with the same arguments. Inside
  an interactive interpreter, or when the running script is not the command
  line's, it changes nothing (`status` says so)."""
  global _not_restarted
  want, _ = decide()
  if not want or huge_pages_enabled():
    return
  _not_restarted = _restart_obstacle()
  if _not_restarted:
    return
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  env = dict(os.environ,
             GLIBC_TUNABLES=":".join(t for t in (tunables, f"{TUNABLE}=1")
                                     if t))
  sys.stdout.flush()
  sys.stderr.flush()
  # sys.orig_argv: the command line as given (`-m module`, flags).
  os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)


def status() -> str:
  """One line: whether this process runs with huge pages, and why."""
  if huge_pages_enabled():
    off = f"{TUNABLE}=0" in os.environ["GLIBC_TUNABLES"]
    return (f"Huge pages for host memory: {'off' if off else 'on'} "
            f"(GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']}).")
  want, why = decide()
  if want and _not_restarted:
    why = (f"started from {_not_restarted}, which cannot be restarted with "
           f"GLIBC_TUNABLES={TUNABLE}=1")
  elif want:
    why = ("not restarted with them (mha.runtime.host_memory.start was not "
           "called)")
  return f"Huge pages for host memory: off ({why})."


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
