"""train.py / eval.py's persistent compilation cache: where, and off."""
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

# The flag set-up of train.py and eval.py, then one compile, in a fresh
# process (jax reads the cache settings once, before its first compile).
PROBE = """\
import sys, jax, jax.numpy as jnp
from absl import flags
from mha import compilation_cache
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
