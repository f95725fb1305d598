"""The README's two commands: the test command is what CI runs, and the
quickstart command runs end to end (train, then evaluate) to the BLEU the
README shows."""
import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

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


@pytest.mark.slow
def test_quickstart_command_reaches_the_readmes_bleu(tmp_path):
  command = readme_command("quickstart-command")
  steps = [shlex.split(part) for part in command.split("&&")]
  programs = [s for s in steps if s and s[0].endswith("python") and
              s[1].endswith(".py")]
  assert [p[1] for p in programs] == ["train.py", "eval.py"]
  assert steps[0][:3] == ["python3", "-m", "venv"]
  # Run from another folder, keeping the README's relative workdir (and so
  # checking relative paths), with the scripts and configs made absolute.
  # The whole run, as a new user makes it: ~1.5 minutes on 2 cores.
  outputs = []
  workdir = None
  for program in programs:
    args = [a.replace("--config=configs/", f"--config={REPO}/configs/")
            for a in program[2:]]
    workdir = tmp_path / [a for a in args if a.startswith("--workdir=")][0][
        len("--workdir="):]
    result = subprocess.run([sys.executable, str(REPO / program[1]), *args],
                            cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs.append(result.stdout + result.stderr)
  # eval.py prints what the README shows, line for line, with this run's
  # timings: the header, the folder written, BLEU and chrF with the same
  # signature, and scores within 2 points of the README's (float rounding
  # differs between CPUs: the README gives 96.97 and 96.12 on two).
  sample = readme_quickstart_output()
  header = re.escape(sample[0].split(" sentences in ")[0])
  assert re.search(header + r" sentences in [0-9.]+ s \([0-9.]+ "
                   r"sentences/s\)", outputs[-1])
  assert sample[1] in outputs[-1]
  expected = re.search(r"BLEU ([0-9.]+)  chrF ([0-9.]+)  \((nrefs:[^)]*)\)",
                       sample[-1])
  bleu, chrf, signature = (float(expected.group(1)),
                           float(expected.group(2)), expected.group(3))
  got = re.search(r"BLEU ([0-9.]+)  chrF ([0-9.]+)  \(" +
                  re.escape(signature) + r"\)", outputs[-1])
  assert got, outputs[-1][-2000:]
  assert float(got.group(1)) >= bleu - 2.0, got.group(0)
  assert float(got.group(2)) >= chrf - 2.0, got.group(0)
  metrics = json.loads((workdir / sample[1].split("Wrote workdirs/quickstart/")
                        [1] / "metrics.json").read_text())
  assert metrics["sacrebleu_signature"] == signature
  assert abs(metrics["bleu"] - float(got.group(1))) < 0.006  # printed .2f
  # The training loss falls.
  losses = [json.loads(line)["loss"] for line in
            (workdir / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]
  assert len(losses) >= 2 and losses[-1] < losses[0] - 0.5


def readme_quickstart_output() -> list[str]:
  """The sample output the README shows after the quickstart command."""
  text = (REPO / "README.md").read_text()
  after = text.split("<!-- quickstart-command -->", 1)[1]
  after = after.split("```bash", 1)[1].split("```", 1)[1]  # past the command
  blocks = re.findall(r"```\n(.+?)\n```", after, re.DOTALL)
  assert blocks, "README.md shows no output of the quickstart"
  return blocks[0].splitlines()


def test_readme_quickstart_claims_match_the_config():
  # The README's "800 steps" and its sample output are the config's.
  from configs import quickstart
  text = (REPO / "README.md").read_text()
  after = text.split("<!-- quickstart-command -->", 1)[1][:2000]
  steps = int(re.search(r"\((\d+) steps at", after).group(1))
  assert steps == quickstart.get_config().num_train_steps
  sample = readme_quickstart_output()
  assert re.match(rf"test, step {steps}, beam "
                  rf"{quickstart.get_config().beam_size}, alpha "
                  rf"{quickstart.get_config().alpha}: ", sample[0])
  assert re.search(rf"Wrote workdirs/quickstart/eval/test_{steps}$",
                   sample[1])
