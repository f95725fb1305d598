"""The README's two commands: the test command is what CI runs, and the
quickstart command, shortened, runs end to end (train, then evaluate)."""
import pathlib
import re
import shlex
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def readme_command(marker: str) -> str:
  text = (REPO / "README.md").read_text()
  match = re.search(rf"<!-- {marker} -->\s*```bash\n(.+?)\n```", text,
                    re.DOTALL)
  assert match, f"README.md has no command after <!-- {marker} -->"
  return match.group(1).strip()


def test_ci_runs_the_readme_test_command():
  command = readme_command("test-command")
  assert "pip install" in command and "pytest" in command
  ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
  assert command in ci_lines  # .ci/run runs this very line


def test_quickstart_command_shortened(tmp_path):
  command = readme_command("quickstart-command")
  steps = [shlex.split(part) for part in command.split("&&")]
  programs = [s for s in steps if s and s[0].endswith("python") and
              s[1].endswith(".py")]
  assert [p[1] for p in programs] == ["train.py", "eval.py"]
  assert steps[0][:3] == ["python3", "-m", "venv"]
  # Run from another folder, keeping the README's relative workdir (and so
  # checking relative paths), with the scripts and configs made absolute.
  shorten = ["--config.num_train_steps=30", "--config.eval_every_steps=30",
             "--config.checkpoint_every_steps=30"]
  outputs = []
  workdir = None
  for program in programs:
    args = [a.replace("--config=configs/", f"--config={REPO}/configs/")
            for a in program[2:]]
    workdir = tmp_path / [a for a in args if a.startswith("--workdir=")][0][
        len("--workdir="):]
    if program[1] == "train.py":
      args += shorten
    else:
      args += ["--split=test[:40]"]
    result = subprocess.run([sys.executable, str(REPO / program[1]), *args],
                            cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs.append(result.stdout + result.stderr)
  assert re.search(r"BLEU", outputs[-1])
  assert list((workdir / "eval").glob("*/metrics.json"))
