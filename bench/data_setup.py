r"""A training run's set-up at WMT size: time to the first step, peak RSS,
disk; tokenization on one core against every core, side by side.

    python bench/data_setup.py                        # 4,500,000 pairs
    python bench/data_setup.py --pairs=1000000 --processes=1,0
    python bench/data_setup.py --repo=/tmp/before --processes=default

Generates (once, into `--corpus_dir`) a local parallel_text folder of
`--pairs` German-English pairs made from Multi30k's training sentences
(`$MHA_MULTI30K_DIR`, else ../shared/data/multi30k): pair i joins two
Multi30k pairs drawn with a fixed seed, about 41 tokens per pair with the
recipe's 8,000-piece vocabulary (WMT14's 4.5M pairs are 185M tokens); its
val and test splits are Multi30k's. Then, for each `--processes` setting
in turn, a fresh `train.py --config=configs/multi30k.py` (`--repo`'s) on
it, with a fresh workdir and TFDS dir, so that each run prepares the
folder, trains the vocabulary and tokenizes the split: the seconds from
the start to the data steps' log lines and to the first step's, the peak
resident memory of its processes (the sum over the process tree, sampled
every 0.2 s), the disk it wrote, and its longest silence (seconds without
a line of output until the split is tokenized). The run is stopped after
its first step. `--processes`: values of `config.tokenize_processes` (0:
every core), `default` passes none (a revision without the field).
"""
import argparse
import gzip
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# pylint: disable=g-import-not-at-top,wrong-import-position
from configs import multi30k
# pylint: enable=g-import-not-at-top,wrong-import-position

LANGUAGES = ("de", "en")
# Log lines of the set-up's steps (the first that matches each).
EVENTS = {
    "prepared": re.compile(r"Prepared \d+ pairs of|downloaded and prepared"),
    "vocabulary": re.compile(r"Trained SentencePiece"),
    "tokenized": re.compile(r"Tokenized \d+ pairs of .* train"),
    "first step": re.compile(r"step 1/\d+ "),
}
_BLOCK = 500_000


def make_corpus(source: str, folder: str, pairs: int, seed: int = 0) -> None:
  """Writes `pairs` joined Multi30k training pairs as `train.{de,en}` and
  copies Multi30k's other splits into `folder`."""
  columns = {}
  for lang in LANGUAGES:
    with gzip.open(os.path.join(source, f"train.{lang}.gz"), "rt",
                   encoding="utf-8") as f:
      columns[lang] = np.array(f.read().splitlines(), dtype=object)
  draws = np.random.default_rng(seed).integers(
      0, len(columns["de"]), (pairs, 2))
  os.makedirs(folder, exist_ok=True)
  for lang, sentences in columns.items():
    with open(os.path.join(folder, f"train.{lang}.part"), "w",
              encoding="utf-8") as f:
      for start in range(0, pairs, _BLOCK):
        block = draws[start:start + _BLOCK]
        f.write("\n".join(sentences[block[:, 0]] + " "
                          + sentences[block[:, 1]]) + "\n")
    for name in os.listdir(source):
      if name.endswith(f".{lang}.gz") and not name.startswith("train."):
        shutil.copyfile(os.path.join(source, name),
                        os.path.join(folder, name))
  for lang in LANGUAGES:  # complete only once both are written
    os.replace(os.path.join(folder, f"train.{lang}.part"),
               os.path.join(folder, f"train.{lang}"))


def _tree_rss(process: psutil.Process) -> int:
  """Resident bytes of `process` and its descendants."""
  total = 0
  for p in [process] + process.children(recursive=True):
    try:
      total += p.memory_info().rss
    except psutil.Error:
      pass
  return total


def disk_bytes(path: str) -> int:
  total = 0
  for root, _, names in os.walk(path):
    for name in names:
      try:
        total += os.lstat(os.path.join(root, name)).st_size
      except OSError:
        pass
  return total


def run_set_up(repo: str, corpus: str, processes: str, scratch: str,
               timeout: float) -> dict:
  """One fresh train.py on `corpus` up to its first step: seconds to each
  of EVENTS, peak RSS of the process tree, disk of its workdir and TFDS
  dir."""
  workdir = os.path.join(scratch, f"work-{processes}")
  tfds_dir = os.path.join(scratch, f"tfds-{processes}")
  command = [sys.executable, "train.py", "--config=configs/multi30k.py",
             f"--workdir={workdir}", f"--config.data_dir={corpus}",
             "--config.num_train_steps=1", "--config.log_every_steps=1",
             "--config.eval_bleu_sentences=0"]
  if processes != "default":
    command.append(f"--config.tokenize_processes={processes}")
  env = dict(os.environ, MHA_TFDS_DIR=tfds_dir, PYTHONUNBUFFERED="1")
  start = time.perf_counter()
  child = subprocess.Popen(command, cwd=repo, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
  peak, done = [0], threading.Event()

  def sample():
    process = psutil.Process(child.pid)
    while not done.wait(0.2):
      peak[0] = max(peak[0], _tree_rss(process))

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  seconds, log, times = {}, [], []
  for line in child.stdout:
    log.append(line)
    times.append(time.perf_counter() - start)
    for event, pattern in EVENTS.items():
      if event not in seconds and pattern.search(line):
        seconds[event] = time.perf_counter() - start
    if "first step" in seconds or time.perf_counter() - start > timeout:
      break
  done.set()
  sampler.join()
  os.killpg(child.pid, signal.SIGKILL)
  child.wait()
  if "first step" not in seconds:
    sys.stdout.write("".join(log[-40:]))
    sys.exit(f"train.py ({processes}) did not reach its first step.")
  # The longest time without a line until the split is tokenized.
  until = sum(1 for t in times if t <= seconds.get("tokenized", 0))
  silence = float(np.max(np.diff([0.0] + times[:until]), initial=0.0))
  return dict(seconds=seconds, peak_rss=peak[0], silence=silence,
              disk=disk_bytes(workdir) + disk_bytes(tfds_dir),
              tokenize_line=next((x.strip() for x in log
                                  if EVENTS["tokenized"].search(x)), ""))


def _parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", type=int, default=4_500_000)
  parser.add_argument("--multi30k_dir", default=multi30k.default_data_dir())
  parser.add_argument("--corpus_dir", default=None,
                      help="default: <tmp>/mha_wmt_size_<pairs> (kept)")
  parser.add_argument("--processes", default="1,0",
                      help="config.tokenize_processes of each run, in turn")
  parser.add_argument("--repo", default=str(REPO),
                      help="the checkout whose train.py runs")
  parser.add_argument("--timeout", type=float, default=1800,
                      help="seconds a run may take to its first step")
  return parser.parse_args(argv)


def main(argv=None) -> None:
  args = _parse(argv)
  corpus = args.corpus_dir or os.path.join(
      tempfile.gettempdir(), f"mha_wmt_size_{args.pairs}")
  if not os.path.exists(os.path.join(corpus, "train.en")):
    start = time.perf_counter()
    make_corpus(args.multi30k_dir, corpus, args.pairs)
    print(f"generated {args.pairs:,} pairs into {corpus} in "
          f"{time.perf_counter() - start:.0f} s")
  print(f"corpus {corpus}: {disk_bytes(corpus) / 2**20:,.0f} MiB; "
        f"{os.cpu_count()} cores; repo {args.repo}")
  results = {}
  for processes in args.processes.split(","):
    with tempfile.TemporaryDirectory(prefix="mha_data_setup_") as scratch:
      load = os.getloadavg()[0]
      results[processes] = r = run_set_up(args.repo, corpus, processes,
                                          scratch, args.timeout)
      r["load"] = (load, os.getloadavg()[0])
      print(f"tokenize_processes={processes}: {r['tokenize_line']}")
  print("seconds from the start of train.py to each step's end:")
  print(f"{'tokenize_processes':>18} " + " ".join(
      f"{e:>11}" for e in EVENTS) + f" {'tokenizing':>11}"
        f" {'silence':>8} {'peak RSS GiB':>12} {'disk GiB':>9}"
        f" {'load':>10}")
  for processes, r in results.items():
    at = r["seconds"]
    print(f"{processes:>18} " + " ".join(
        f"{at.get(e, float('nan')):>11.1f}" for e in EVENTS) +
          f" {at['tokenized'] - at['vocabulary']:>11.1f}"
          f" {r['silence']:>8.1f}"
          f" {r['peak_rss'] / 2**30:>12.2f} {r['disk'] / 2**30:>9.2f} "
          f"{r['load'][0]:>4.1f}-{r['load'][1]:<4.1f}")
  if len(results) > 1:
    first, *others = results
    for other in others:
      ratio = (results[first]["seconds"]["first step"]
               / results[other]["seconds"]["first step"])
      print(f"time to the first step, {first} / {other}: {ratio:.2f}x")


if __name__ == "__main__":
  main()
