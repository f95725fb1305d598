"""The README and its docs pages stay true: the test command is what CI
runs, the quickstart command runs end to end (train, then evaluate) to the
BLEU the README shows, "Using a trained model" runs on a trained workdir,
every relative link points at a file (and heading) that exists, and the
README stays a guide of at most 400 lines."""
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import unicodedata

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_README_LINES = 400


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
  # The whole run, as a new user makes it: 1.1 to 2 minutes on 2 cores
  # (docs/results.md).
  # As a user's shell runs them, without the suite's settings (conftest.py):
  # the machine's one CPU device, XLA's default optimisation, and the huge
  # pages the commands turn on for themselves on CPU hosts.
  user_env = {k: v for k, v in os.environ.items()
              if k not in ("MHA_HUGE_PAGES", "XLA_FLAGS")}
  outputs = []
  workdir = None
  for program in programs:
    args = [a.replace("--config=configs/", f"--config={REPO}/configs/")
            for a in program[2:]]
    workdir = tmp_path / [a for a in args if a.startswith("--workdir=")][0][
        len("--workdir="):]
    result = subprocess.run([sys.executable, str(REPO / program[1]), *args],
                            cwd=tmp_path, capture_output=True, text=True,
                            timeout=600, env=user_env)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs.append(result.stdout + result.stderr)
  # eval.py prints what the README shows, line for line, with this run's
  # timings: the header, the folder written, BLEU and chrF with the same
  # signature, and scores within 2 points of the README's (float rounding
  # differs between CPUs: docs/results.md has runs on other CPUs).
  sample = readme_quickstart_output()
  header = re.escape(sample[0].split(" sentences in ")[0])
  # (In a new process the searches are compiled: that time is named.)
  assert re.search(header + r" sentences in [0-9.]+ s, [0-9.]+ s of it "
                   r"compiling \([0-9.]+ sentences/s\)", outputs[-1])
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
  steps = int(re.search(r"\((\d+) steps of\s+training", after).group(1))
  assert steps == quickstart.get_config().num_train_steps
  sample = readme_quickstart_output()
  assert re.match(rf"test, step {steps}, beam "
                  rf"{quickstart.get_config().beam_size}, alpha "
                  rf"{quickstart.get_config().alpha}: ", sample[0])
  assert re.search(rf"Wrote workdirs/quickstart/eval/test_{steps}$",
                   sample[1])


# ------------------------------------------------------------------- links

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")


def prose(text: str) -> str:
  """Markdown without fenced blocks and code spans, where no link is one."""
  return CODE_SPAN.sub("", FENCE.sub("", text))


def heading_anchors(text: str) -> set[str]:
  """The anchors GitHub gives a page's headings: lower case, code marks and
  punctuation dropped, spaces as hyphens, `-1`, `-2` ... for repeats."""
  anchors, seen = set(), {}
  for title in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", text),
                          re.MULTILINE):
    slug = "".join(c for c in title.strip().lower().replace("`", "")
                   if c in " -_" or unicodedata.category(c)[0] in "LN")
    slug = slug.replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    anchors.add(slug if count == 0 else f"{slug}-{count}")
  return anchors


def broken_links(page: pathlib.Path) -> list[str]:
  """The relative links of a Markdown page whose file or heading is absent."""
  broken = []
  for target in LINK.findall(prose(page.read_text())):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
      continue
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.exists():
      broken.append(f"{target} (no such file)")
    elif anchor and file.suffix == ".md" and anchor not in heading_anchors(
        file.read_text()):
      broken.append(f"{target} (no such heading)")
  return broken


def test_heading_anchors_are_githubs():
  text = ("# Reproducing the paper: WMT14 English→German\n## `eval.py` checks"
          "\n## What it costs (estimates: no accelerator has run it)\n"
          "## Notes\n## Notes\n### Résumé of d_k, ε_ls\n"
          "```\n# not a heading\n```\n")
  assert heading_anchors(text) == {
      "reproducing-the-paper-wmt14-englishgerman", "evalpy-checks",
      "what-it-costs-estimates-no-accelerator-has-run-it", "notes",
      "notes-1", "résumé-of-d_k-ε_ls"}


def test_broken_links_are_found(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "a.md").write_text("# Title\n## Some part\n")
  page = tmp_path / "README.md"
  page.write_text(
      "[ok](docs/a.md) [ok](docs/a.md#some-part) [ok](#here) "
      "![ok](docs/a.md) [web](https://example.com/x.md)\n# Here\n"
      "`[in code](missing.md)`\n```\n[in a fence](missing.md)\n```\n"
      "[gone](docs/b.md) [bad anchor](docs/a.md#other) [bad](#nowhere)\n")
  assert broken_links(page) == ["docs/b.md (no such file)",
                                "docs/a.md#other (no such heading)",
                                "#nowhere (no such heading)"]


def test_every_relative_link_of_the_readme_and_docs_resolves():
  pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
  assert len(pages) > 1
  broken = {page.relative_to(REPO).as_posix(): broken_links(page)
            for page in pages}
  assert not {page: links for page, links in broken.items() if links}


def test_readme_is_a_guide_of_at_most_400_lines():
  lines = (REPO / "README.md").read_text().splitlines()
  assert len(lines) <= MAX_README_LINES, len(lines)
  headings = [line for line in lines if line.startswith("## ")]
  for section in ("## Set-up commands", "## Using a trained model",
                  "## Training", "## Evaluation", "## Configs", "## Results",
                  "## Layout"):
    assert section in headings, section


# ------------------------------------------------------- using a trained model

QUICKSTART_WORKDIR = "workdirs/quickstart"


def readme_section(title: str) -> str:
  text = (REPO / "README.md").read_text()
  match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text,
                    re.MULTILINE | re.DOTALL)
  assert match, f"README.md has no section {title!r}"
  return match.group(1)


def test_using_a_trained_model_runs_and_agrees_with_the_command_line(
    random_workdir, capfd):
  # The section's mha-translate line and its Python block, on a workdir
  # whose model translates to long, varied outputs (the tests' random one
  # in place of the quickstart's): the same sentence, the same translation.
  section = readme_section("Using a trained model")
  (shell_line,) = [line for block in re.findall(r"```bash\n(.+?)```",
                                                section, re.DOTALL)
                   for line in block.splitlines() if "mha-translate" in line]
  echo, command = shell_line.split("|")
  sentences = [shlex.split(echo)[1]]
  args = shlex.split(command)
  assert args[0] == ".venv/bin/mha-translate"
  args = [a.replace(QUICKSTART_WORKDIR, str(random_workdir))
          for a in args[1:]]
  assert args == [f"--workdir={random_workdir}"]
  done = subprocess.run(
      [sys.executable, "-m", "mha.cli.translate", *args],
      input="\n".join(sentences) + "\n", capture_output=True, text=True,
      cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=600,
      check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  from_command_line = done.stdout.splitlines()
  assert len(from_command_line) == len(sentences)
  assert all(from_command_line)

  blocks = re.findall(r"```python\n(.+?)```", section, re.DOTALL)
  assert blocks and all(QUICKSTART_WORKDIR in b for b in blocks)
  namespace = {}
  capfd.readouterr()
  for block in blocks:
    for sentence in sentences:
      assert sentence in block  # the same sentences as the shell line
    exec(compile(block.replace(QUICKSTART_WORKDIR, str(random_workdir)),  # pylint: disable=exec-used
                 "README.md", "exec"), namespace)
  printed = capfd.readouterr().out
  assert repr(from_command_line) in printed  # print(translations)


# ------------------------------------------------------------------- layout


def test_the_layout_and_where_to_change_what_are_true_of_the_tree():
  """Every path the Layout and its table name exists, each folder's count
  of modules is its number of .py files, each table named is defined in
  the file named, and every folder of mha/ is listed."""
  section = readme_section("Layout")
  tree = re.search(r"```\n(.*?)```", section, re.DOTALL).group(1)
  listed = {}
  for line in tree.splitlines():
    match = re.match(r"  (\w+)/\s+(\d+)\s", line)
    if match:
      listed[match.group(1)] = int(match.group(2))
  folders = {p.name for p in (REPO / "mha").iterdir()
             if (p / "__init__.py").exists()}
  assert set(listed) == folders
  for folder, count in listed.items():
    assert len(list((REPO / "mha" / folder).glob("*.py"))) == count, folder
  for path in re.findall(r"`(mha/[\w/]+\.py)`", section):
    assert (REPO / path).is_file(), path
  table = re.findall(r"^\| [^|]+ \| `(mha/[\w/]+\.py)`(?: \(`(\w+)`)?",
                     section, re.MULTILINE)
  assert len(table) >= 8
  for path, name in table:
    if name:
      assert re.search(rf"^{name}\b", (REPO / path).read_text(),
                       re.MULTILINE), (path, name)
  tops = {p.name for p in (REPO / "mha").glob("*.py")}
  for name in tops - {"__init__.py"}:
    assert name in tree, name
