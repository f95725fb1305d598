"""Test set-up: several fake CPU devices so that `pmap` code runs for real.

The flag must be set before jax is imported anywhere, hence at conftest import.
"""
import os
import pathlib
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests compile the same tiny train step, in this process and in the
# subprocesses they start (which inherit the environment): a persistent
# compilation cache for this session saves most of those compiles.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      tempfile.mkdtemp(prefix="mha_jax_cache_"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def multi30k_dir() -> pathlib.Path | None:
  """The Multi30k folder: $MHA_MULTI30K_DIR, else ../shared/data/multi30k."""
  env = os.environ.get("MHA_MULTI30K_DIR")
  candidates = [pathlib.Path(env)] if env else []
  candidates.append(REPO_ROOT.parent / "shared" / "data" / "multi30k")
  for path in candidates:
    if (path / "train.de.gz").exists():
      return path
  return None


@pytest.fixture
def multi30k():
  path = multi30k_dir()
  if path is None:
    pytest.skip("Multi30k not found: set MHA_MULTI30K_DIR or place it at "
                "../shared/data/multi30k")
  return path
