"""The README and its docs pages stay true: the test command is what CI
runs, the quickstart command runs end to end (train, then evaluate) to the
BLEU the README shows, "Using a trained model" runs on a trained workdir,
every relative link points at a file (and heading) that exists, and the
README stays a guide of at most 400 lines."""
import gzip
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import unicodedata

import numpy as np
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


def python_blocks(section: str) -> list[str]:
  """The text of each ```python block of a README section."""
  return re.findall(r"```python\n(.+?)```", section, re.DOTALL)


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

  blocks = [block for block in python_blocks(section)
            if "transformers" not in block]  # test_huggingface_torch's
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


# ---------------------------------------------------------------- training

def run_command(args: list[str], cwd: pathlib.Path, **env: str
                ) -> subprocess.CompletedProcess:
  """`python <script> <args>` in `cwd` (the script: the repository's
  train.py or eval.py) with the suite's environment (its fake devices, its
  compilation cache) plus `env`; asserts that it succeeded."""
  script, *args = args
  done = subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd,
                        capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, PYTHONPATH=str(REPO), **env),
                        check=False)
  assert done.returncode == 0, (args, done.stderr[-3000:])
  return done


def bash_blocks(section: str) -> list[list[str]]:
  """The lines of each ```bash block of a README section."""
  return [block.strip().splitlines()
          for block in re.findall(r"```bash\n(.+?)```", section, re.DOTALL)]


def last_params(workdir: pathlib.Path) -> list:
  """The leaves of the parameters of the workdir's latest checkpoint."""
  import jax  # pylint: disable=import-outside-toplevel
  from mha.store import trained  # pylint: disable=import-outside-toplevel
  params, _, _ = trained.load_params(str(workdir))
  return jax.tree_util.tree_leaves(params)


@pytest.mark.slow
def test_first_run_commands_continue_a_finished_workdir(tmp_path):
  # "A first real run": N steps of a config, an evaluation, then the same
  # command without the override of num_train_steps, which continues the
  # finished workdir to the config's steps and "reaches the parameters of
  # one run" of them. Run as written but on configs/quickstart.py:tiny (the
  # synthetic pair: 3 steps, then its 6), against one straight 6-step run.
  section = readme_section("Training")
  export, *lines = bash_blocks(section)[0]
  fetch_out = re.search(r"fetch_multi30k\.py --out=(\S+)`", section)[1]
  assert export == f"export MHA_MULTI30K_DIR=$PWD/{fetch_out}"
  commands = [shlex.split(line) for line in lines]
  assert [c[:2] for c in commands] == [[".venv/bin/python", "train.py"],
                                       [".venv/bin/python", "eval.py"],
                                       [".venv/bin/python", "train.py"]]
  first, evaluate, second = (c[2:] for c in commands)
  (shorter,) = [a for a in first if a.startswith("--config.num_train_steps=")]
  assert [a for a in first if a != shorter] == second
  from configs import multi30k  # pylint: disable=import-outside-toplevel
  assert int(shorter.split("=")[1]) < multi30k.get_config().num_train_steps
  workdir_flag = [a for a in second if a.startswith("--workdir=")]
  assert workdir_flag and evaluate == workdir_flag

  tiny = f"--config={REPO}/configs/quickstart.py:tiny"
  continued, straight = tmp_path / "continued", tmp_path / "straight"
  run_command(["train.py", tiny, "--config.num_train_steps=3",
               f"--workdir={continued}"], REPO)
  done = run_command(["eval.py", f"--workdir={continued}"], REPO)
  assert f"Wrote {continued}/eval/test_3" in done.stdout + done.stderr
  done = run_command(["train.py", tiny, f"--workdir={continued}"], REPO)
  assert f"Resumed from {continued} at step 3." in done.stderr
  run_command(["train.py", tiny, f"--workdir={straight}"], REPO)
  got, want = last_params(continued), last_params(straight)
  assert len(got) == len(want) > 0
  assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.slow
def test_own_text_command_trains_and_evaluates(tmp_path):
  # "Your own parallel text": the README's two commands, as written but with
  # the tiny model and loop (`:tiny`), in a folder where their data_dir
  # holds the synthetic pair's sentences under the languages and splits they
  # name (plain and .gz files). The folder is converted into $MHA_TFDS_DIR,
  # not inside itself.
  from mha.data import synthetic  # pylint: disable=import-outside-toplevel
  train, evaluate = [shlex.split(line)
                     for line in readme_command("own-text-command")
                     .splitlines()]
  assert [train[:2], evaluate[:2]] == [[".venv/bin/python", "train.py"],
                                       [".venv/bin/python", "eval.py"]]
  flags = dict(a.split("=", 1) for a in train[2:])
  assert flags.pop("--config") == "configs/multi30k.py"
  assert evaluate[2:] == [f"--workdir={flags['--workdir']}"]
  folder = tmp_path / flags["--config.data_dir"]
  folder.mkdir(parents=True)
  languages = (flags["--config.source_lang"], flags["--config.target_lang"])
  pairs = synthetic.generate(0)
  for split, name, size, suffix in (
      ("train", "train", 400, ""),
      ("validation", flags["--config.eval_split"], 40, ""),
      ("test", flags["--config.test_split"], 40, ".gz")):
    for lang, column in zip(languages, pairs[split]):
      text = "".join(line + "\n" for line in column[:size]).encode()
      path = folder / f"{name}.{lang}{suffix}"
      path.write_bytes(gzip.compress(text) if suffix else text)
  files = sorted(folder.iterdir())

  tiny = f"--config={REPO}/configs/multi30k.py:tiny"
  run_command(["train.py", tiny, *(f"{k}={v}" for k, v in flags.items())],
              tmp_path, MHA_TFDS_DIR=str(tmp_path / "tfds"))
  done = run_command(["eval.py", *evaluate[2:]], tmp_path,
                     MHA_TFDS_DIR=str(tmp_path / "tfds"))
  output = done.stdout + done.stderr
  written = f"{flags['--workdir']}/eval/{flags['--config.test_split']}_6"
  assert f"Wrote {written}" in output
  assert re.search(r"BLEU [0-9.]+  chrF [0-9.]+  \(nrefs:1", output)
  assert json.loads((tmp_path / written / "metrics.json").read_text())[
      "num_sentences"] == 40
  assert sorted(folder.iterdir()) == files
  assert len(list((tmp_path / "tfds" / "parallel_text").iterdir())) == 1


def help_text(command: list[str], flag: str) -> str:
  """What `python <command> <flag>` prints (absl exits 1 after help)."""
  done = subprocess.run([sys.executable, *command, flag], cwd=REPO,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, PYTHONPATH=str(REPO)),
                        check=False)
  return done.stdout + done.stderr


def listed_flags(text: str) -> set[str]:
  """The flags a help text lists: its `  --name:` and `  --[no]name:`."""
  return set(re.findall(r"^\s+(?:-\w,)?--(?:\[no\])?(\w+):", text,
                        re.MULTILINE))


def test_readmes_help_commands_list_the_flags_it_says():
  # "Flags": --helpfull lists every flag (the command's own and those it
  # shares); --help lists a module's own flags only under `python -m`, and
  # none for train.py, eval.py or a console script (run here as pip's
  # script runs it: `run()` from a __main__ without docs or flags).
  section = readme_section("Training")
  helpfull = re.findall(r"`([^`]+ --helpfull)`", section)
  assert len(helpfull) == 3, helpfull
  module = {"train.py": ["train.py"], "eval.py": ["eval.py"],
            "mha-translate": ["-m", "mha.cli.translate"]}
  wanted = {"train.py": {"config", "workdir", "compilation_cache_dir",
                         "traceback", "verbose_libraries"},
            "eval.py": {"split", "workdir", "beam_size", "average_last"},
            "mha-translate": {"nbest", "workdir", "beam_size"}}
  for command in helpfull:
    (name,) = [n for n in module if n in command.split()[-2]]
    assert wanted[name] <= listed_flags(help_text(module[name],
                                                  "--helpfull")), name
  assert "`.venv/bin/python -m mha.cli.train --help`" in section
  for name, own, shared in (("train", "config", "workdir"),
                            ("eval", "split", "beam_size"),
                            ("translate", "nbest", "workdir"),
                            ("export", "quantization", "workdir")):
    listed = listed_flags(help_text(["-m", f"mha.cli.{name}"], "--help"))
    assert own in listed and shared not in listed, name
    script = help_text(["-c", f"from mha.cli.{name} import run; run()"],
                       "--help")
    assert not listed_flags(script) and "--helpfull" in script, name
  for script in ("train.py", "eval.py"):
    assert not listed_flags(help_text([script], "--help")), script
