"""mha.runtime.host_memory: the process restarts once with glibc's huge-page
tunable on CPU hosts, says so, and never where the restart cannot be made."""
import os
import subprocess
import sys
import time

import pytest

from mha.runtime import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A script file of its own: the restart runs the command line again, which a
# `python -c` string is not (tests of the refusal below).
SCRIPT = ("import os, sys; sys.path.insert(0, sys.argv[1]); "
          "print('start', flush=True); "
          "from mha import host_memory; host_memory.start(); "
          "print(os.environ.get('GLIBC_TUNABLES', '')); "
          "print(host_memory.status())")
_SWITCHES = ("GLIBC_TUNABLES", "MHA_NO_HUGE_PAGES", "MHA_HUGE_PAGES",
             "JAX_PLATFORMS")
needs_thp = pytest.mark.skipif(
    not host_memory._kernel_allows_huge_pages(),  # pylint: disable=protected-access
    reason="no transparent huge pages on this machine")


def _run(tmp_path, *python_args, **env_changes):
  script = tmp_path / "script.py"
  script.write_text(SCRIPT)
  env = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
  env.update({"JAX_PLATFORMS": "cpu", **env_changes})
  out = subprocess.run([sys.executable, *python_args, str(script), ROOT],
                       env=env, capture_output=True, text=True, check=True,
                       stdin=subprocess.DEVNULL).stdout
  return out.splitlines()


@needs_thp
def test_restarts_once_with_the_tunable_kept_alongside_others(tmp_path):
  # Runs twice from the start (the restart), then carries on with the
  # tunable added to the ones already set, and says so.
  lines = _run(tmp_path, GLIBC_TUNABLES="glibc.malloc.arena_max=4")
  tunables = "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1"
  assert lines == ["start", "start", tunables,
                   f"Huge pages for host memory: on (GLIBC_TUNABLES="
                   f"{tunables})."]


def test_no_restart_when_set_or_refused(tmp_path):
  assert _run(tmp_path, GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == [
      "start", "glibc.malloc.hugetlb=0",
      "Huge pages for host memory: off (GLIBC_TUNABLES="
      "glibc.malloc.hugetlb=0)."]
  for switch in (dict(MHA_HUGE_PAGES="0"), dict(MHA_NO_HUGE_PAGES="1")):
    lines = _run(tmp_path, **switch)
    (name, value), = switch.items()
    assert lines[:2] == ["start", ""]
    assert lines[2] == f"Huge pages for host memory: off ({name}={value})."


@needs_thp
def test_accelerator_host_is_off_unless_asked(tmp_path):
  lines = _run(tmp_path, JAX_PLATFORMS="tpu")
  assert lines[:2] == ["start", ""]
  assert lines[2] == ("Huge pages for host memory: off (an accelerator host "
                      "(JAX_PLATFORMS=tpu); MHA_HUGE_PAGES=1 asks for them).")
  lines = _run(tmp_path, JAX_PLATFORMS="cuda", MHA_HUGE_PAGES="1")
  assert lines[:3] == ["start", "start", "glibc.malloc.hugetlb=1"]


@needs_thp
def test_no_restart_inside_an_interactive_interpreter(tmp_path):
  # `python -i script.py`: running the command line again would start a
  # second interactive session; the process goes on without, and says why.
  lines = _run(tmp_path, "-i")
  assert lines[:2] == ["start", ""], lines
  assert lines[2].startswith("Huge pages for host memory: off (started "
                             "from an interactive interpreter, which "), lines


@needs_thp
def test_no_restart_for_a_script_not_on_the_command_line(tmp_path,
                                                         monkeypatch):
  # In this process (pytest's): `start` is called from code that the
  # command line does not run from the start.
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  monkeypatch.delenv("MHA_HUGE_PAGES", raising=False)
  monkeypatch.delenv("MHA_NO_HUGE_PAGES", raising=False)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setattr(sys, "argv", [str(tmp_path / "train.py")])
  monkeypatch.setattr(host_memory.os, "execve", _no_exec)
  host_memory.start()
  assert host_memory.status() == (
      "Huge pages for host memory: off (started from a script other than "
      "the command line's, which cannot be restarted with "
      "GLIBC_TUNABLES=glibc.malloc.hugetlb=1).")


def _no_exec(*args):
  raise AssertionError(f"restarted: {args}")


@pytest.mark.parametrize("environ, files, libtpu, expected", [
    ({"JAX_PLATFORMS": "cpu"}, ["/dev/accel0"], True, None),
    ({"JAX_PLATFORMS": "cpu,tpu"}, [], False, "JAX_PLATFORMS=cpu,tpu"),
    ({}, ["/dev/accel0", "/dev/accel1"], False, "/dev/accel0 exists"),
    ({}, ["/dev/vfio/0"], False, "/dev/vfio/0 exists"),
    ({}, ["/dev/nvidia0"], False, "/dev/nvidia0 exists"),
    ({}, ["/dev/kfd"], False, "/dev/kfd exists"),
    ({}, ["/dev/vfio/vfio", "/dev/nvidiactl"], False, None),
    ({}, [], True, "libtpu is installed"),
    ({}, [], False, None),
])
def test_accelerator_host_detection(monkeypatch, environ, files, libtpu,
                                    expected):
  import fnmatch  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(host_memory.glob, "glob", lambda pattern: [
      f for f in files if fnmatch.fnmatch(f, pattern)])
  monkeypatch.setattr(host_memory.importlib.util, "find_spec",
                      lambda name: object() if libtpu and name == "libtpu"
                      else None)
  assert host_memory.accelerator_host(environ) == expected


# Records $GLIBC_TUNABLES at every interpreter start (site imports it).
_SITECUSTOMIZE = """import os
with open(os.environ["MHA_TEST_STARTS"], "a") as f:
  f.write(os.environ.get("GLIBC_TUNABLES", "") + "\\n")
"""


@needs_thp
@pytest.mark.parametrize("command", [["train.py"], ["eval.py"],
                                     ["-m", "mha.cli.eval"]])
def test_entry_points_restart_with_huge_pages(tmp_path, command):
  (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
  starts = tmp_path / "starts"
  env = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
  env.update(PYTHONPATH=f"{tmp_path}:{ROOT}", MHA_TEST_STARTS=str(starts),
             JAX_PLATFORMS="cpu")
  process = subprocess.Popen([sys.executable, *command, "--workdir=unused"],
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  try:  # the restart comes first: no need to wait for the imports after it
    while (not starts.exists() or len(starts.read_text().splitlines()) < 2
           ) and process.poll() is None:
      time.sleep(0.02)
  finally:
    process.kill()
    process.wait()
  assert starts.read_text().splitlines() == ["", "glibc.malloc.hugetlb=1"]
