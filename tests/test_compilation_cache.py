"""train.py / eval.py's persistent compilation cache: where, and off."""
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from mha.runtime import compilation_cache
from mha.search import trace_cache as search_cache

REPO = pathlib.Path(__file__).resolve().parents[1]

# The flag set-up of train.py and eval.py, then one compile, in a fresh
# process (jax reads the cache settings once, before its first compile).
PROBE = """\
import sys, jax, jax.numpy as jnp
from absl import flags
from mha.runtime import compilation_cache
compilation_cache.define_flag()
flags.FLAGS(['probe', *sys.argv[1:]])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
print(compilation_cache.enable(flags.FLAGS.compilation_cache_dir))
jax.jit(lambda x: jnp.tanh(x @ x).sum())(jnp.ones((8, 8))).block_until_ready()
"""


def probe(home: pathlib.Path, *flags: str, **env_vars: str) -> str:
  """Runs PROBE with HOME=home; returns the cache directory it printed."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_COMPILATION_CACHE_DIR", "MHA_COMPILATION_CACHE_DIR",
                      "XDG_CACHE_HOME")}
  env.update(HOME=str(home), **env_vars)
  out = subprocess.run([sys.executable, "-c", PROBE, *flags], cwd=REPO,
                       env=env, capture_output=True, text=True, check=True)
  return out.stdout.strip().splitlines()[-1]


def test_flag_directory_receives_the_compiled_program(tmp_path):
  cache = tmp_path / "cache"
  assert probe(tmp_path / "home", f"--compilation_cache_dir={cache}") == str(
      cache)
  assert any(cache.iterdir())
  assert not (tmp_path / "home").exists()  # nothing in the default place


def test_default_directory_and_environment(tmp_path):
  home = tmp_path / "home"
  default = home / ".cache" / "mha" / "jax"
  assert probe(home) == str(default)
  assert any(default.iterdir())
  from_env = tmp_path / "env"
  assert probe(tmp_path / "home2",
               MHA_COMPILATION_CACHE_DIR=str(from_env)) == str(from_env)
  assert any(from_env.iterdir())


def test_empty_flag_turns_the_cache_off(tmp_path):
  home = tmp_path / "home"
  assert probe(home, "--compilation_cache_dir=") == "None"
  assert not (home / ".cache").exists()


def test_mha_variable_comes_first_and_empty_it_turns_the_cache_off(
    monkeypatch):
  """$MHA_COMPILATION_CACHE_DIR wins over $JAX_COMPILATION_CACHE_DIR, and
  set to '' it means off (not: look at jax's variable)."""
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/jax/cache")
  monkeypatch.setenv(compilation_cache.ENV, "/mha/cache")
  assert compilation_cache.default_dir() == "/mha/cache"
  monkeypatch.setenv(compilation_cache.ENV, "")
  assert compilation_cache.default_dir() == ""
  monkeypatch.delenv(compilation_cache.ENV)
  assert compilation_cache.default_dir() == "/jax/cache"


@pytest.fixture
def jax_cache_settings():
  """jax's cache settings, put back after the test."""
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_enable_compilation_cache)
  yield
  jax.config.update("jax_compilation_cache_dir", before[0])
  jax.config.update("jax_enable_compilation_cache", before[1])


def test_a_home_relative_directory_is_expanded(tmp_path, monkeypatch,
                                               jax_cache_settings):
  """`--compilation_cache_dir=~/cache` is the home's cache folder, not a
  folder named `~` where the command runs."""
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  want = str(tmp_path / "home" / "cache")
  assert compilation_cache.enable("~/cache") == want
  assert jax.config.jax_compilation_cache_dir == want
  assert os.path.isdir(want) and not (tmp_path / "~").exists()


def test_a_directory_that_cannot_be_made_turns_the_cache_off(
    tmp_path, jax_cache_settings):
  """A folder that cannot be created: None, and the cache off (so also the
  searches kept beside it), not left on in another folder."""
  (tmp_path / "file").write_text("")
  assert compilation_cache.enable(str(tmp_path / "file" / "cache")) is None
  assert not jax.config.jax_enable_compilation_cache
  assert search_cache.folder() is None
