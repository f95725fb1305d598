"""mha.runtime.cpu_devices: the host's cores as JAX CPU devices for the
searches, left as they are where the user chose a number or the host has
accelerators; set before JAX starts (a fresh process), refused after."""
import os
import re
import subprocess
import sys

import jax
import pytest

import mha
from mha.runtime import cpu_devices
from mha.errors import UserError

CPU_HOST = {"JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize("cores, want", [(2, 2), (6, 6), (16, 8), (1, None)])
def test_one_device_a_core_up_to_eight(monkeypatch, cores, want):
  monkeypatch.setattr(cpu_devices, "host_cores", lambda: cores)
  assert cpu_devices.default_count(CPU_HOST) == want


def _cgroups(tmp_path, proc: str, files: dict[str, str]):
  """A fake /sys/fs/cgroup (files under it) and /proc/self/cgroup."""
  for name, text in files.items():
    (tmp_path / "cg" / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cg" / name).write_text(text)
  (tmp_path / "proc").write_text(proc)
  return str(tmp_path / "cg"), str(tmp_path / "proc")


@pytest.mark.parametrize("proc, files, limit, cores", [
    # cgroup v2: the smallest quota along the group and those above it.
    ("0::/user.slice/job\n", {"user.slice/cpu.max": "150000 100000\n",
                              "user.slice/job/cpu.max": "300000 100000\n",
                              "cpu.max": "max 100000\n"}, 1.5, 2),
    ("0::/\n", {"cpu.max": "400000 100000\n"}, 4.0, 4),
    # v1, the group's path not under the mount (a container's view): the
    # mount's own group.
    ("5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
     {"cpu,cpuacct/cpu.cfs_quota_us": "300000\n",
      "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 3.0, 3),
    # Half a CPU is still one core.
    ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "50000",
                   "cpu/cpu.cfs_period_us": "100000"}, 0.5, 1),
    # No quota, or nothing readable: the affinity's 16 cores.
    ("1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1",
                          "cpu/cpu.cfs_period_us": "100000",
                          "cpu.max": "max 100000"}, None, 16),
    ("garbage\n0::/\n", {"cpu.max": "many 0"}, None, 16),
    ("0::/\n", {"cpu.max": "100000 0"}, None, 16),
])
def test_a_cpu_quota_limits_the_cores(monkeypatch, tmp_path, proc, files,
                                      limit, cores):
  root, proc_file = _cgroups(tmp_path, proc, files)
  assert cpu_devices.cgroup_cpu_limit(root, proc_file) == limit
  monkeypatch.setattr(cpu_devices.os, "sched_getaffinity",
                      lambda pid: set(range(16)), raising=False)
  assert cpu_devices.host_cores(root, proc_file) == cores


def test_no_cgroup_file_is_no_limit(tmp_path):
  assert cpu_devices.cgroup_cpu_limit(str(tmp_path),
                                      str(tmp_path / "absent")) is None


@pytest.mark.parametrize("environ", [
    {"JAX_PLATFORMS": "tpu"},
    {"JAX_PLATFORMS": "cuda,cpu"},
    dict(CPU_HOST, XLA_FLAGS="--xla_cpu_use_thunk_runtime=true "
         "--xla_force_host_platform_device_count=3"),
    dict(CPU_HOST, JAX_NUM_CPU_DEVICES="3")])
def test_an_accelerator_host_or_the_users_count_is_left(monkeypatch,
                                                        environ):
  monkeypatch.setattr(cpu_devices, "host_cores", lambda: 4)
  assert cpu_devices.default_count(environ) is None
  assert cpu_devices.use_cpu_cores(environ=environ) is None


def test_after_jax_started_only_its_own_count_is_accepted():
  started = jax.local_device_count()  # 4: tests/conftest.py
  assert cpu_devices.use_cpu_cores(environ=CPU_HOST) is None  # left
  assert cpu_devices.use_cpu_cores(started) == started
  with pytest.raises(UserError, match=(
      f"cpu_devices=2: JAX has started already, with {started} CPU devices")):
    cpu_devices.use_cpu_cores(2)
  for bad, allowed in ((0, ">= 1"), (-1, ">= 1"), (True, "an integer >= 1"),
                      (2.0, "an integer >= 1"), ("2", "an integer >= 1")):
    with pytest.raises(UserError, match="^" + re.escape(
        f"cpu_devices must be {allowed}, got {bad!r}.")):
      cpu_devices.use_cpu_cores(bad)
  assert jax.local_device_count() == started


def _devices_in_a_fresh_process(call: str, **environ) -> str:
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  env.update(JAX_PLATFORMS="cpu", **environ)
  result = subprocess.run(
      [sys.executable, "-c", f"import mha, jax; print({call}, "
       "jax.local_device_count())"],
      capture_output=True, text=True, env=env, timeout=300, check=True)
  return result.stdout.split()


def test_set_before_jax_starts():
  # A count given, and the default: one device a core (this host's).
  assert _devices_in_a_fresh_process("mha.use_cpu_cores(3)") == ["3", "3"]
  cores = min(cpu_devices.host_cores(), cpu_devices.MAX_DEVICES)
  want = [str(cores), str(cores)] if cores > 1 else ["None", "1"]
  assert _devices_in_a_fresh_process("mha.use_cpu_cores()") == want
  # The user's XLA flag is kept, and a count set in Python.
  assert _devices_in_a_fresh_process(
      "mha.use_cpu_cores()",
      XLA_FLAGS="--xla_force_host_platform_device_count=3") == ["None", "3"]
  assert _devices_in_a_fresh_process(
      "(jax.config.update('jax_num_cpu_devices', 3), mha.use_cpu_cores())[1]"
  ) == ["None", "3"]


def test_the_public_name():
  assert mha.use_cpu_cores is cpu_devices.use_cpu_cores
