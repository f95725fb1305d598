r"""bench/decode.py's CTranslate2 rows and its end-to-end rows.

Steady state (`--ctranslate2`): CTranslate2 in a process of its own
(`bench/ct2_process.py steady`, started here once this process's JAX
passes have ended, and waited for: nothing of JAX runs beside it), as its
users run it: the workdir's latest checkpoint exported with `mha.export`
(float32 and int8), the whole job in one `translate_batch` call
(`max_batch_size` = `--batch_size`: CTranslate2 sorts by length and cuts
the batches itself), the same sentences (mha's source ids as pieces), beam
size, α (as CTranslate2's length penalty, |Y|^α, not GNMT's) and output
limit (one per call: the longest source + EOS + the config's
`max_decode_extra`; mha's is per sentence) as mha's search; as one
translator of all `--ct2_threads` threads and as `--ct2_inter_threads`
translators sharing those threads (equal cores). The model is loaded and
one untimed call made first, then `--repeats` timed calls: the fastest is
reported.

End to end (`--end_to_end`): from a fresh process to the last output,
model loading included, each engine as its users run it on the same
sentences (written to text files here): mha's `python eval.py
--workdir=W --source_file=S --reference_file=R --beam_size=B
--batch_size=N` (which also scores BLEU and chrF, well under a second of
its run), first with a new empty `--compilation_cache_dir` (cold), then
with the same folder again (warm); CTranslate2 float32 in each mode
(`bench/ct2_process.py end_to_end`: imports, tokenizing, model loading,
translation, detokenizing, the file written). Each run is timed from its
start to its exit; `--repeats` rounds (cold, warm, CTranslate2, in turn),
the fastest of each reported, with eval.py's compile seconds (its
metrics.json) and their share of its cold run.

Ratios mha/CTranslate2 are of speeds (sentences/s) against CTranslate2
float32 in its faster mode: mha's steady state (`_timed`'s best pass) and
its end-to-end runs (warm cache, and cold).
"""
import collections
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import numpy as np

from bench import common
from mha import data
from mha import export
from mha.scoring import metric_table

REPO = pathlib.Path(__file__).resolve().parents[1]
CT2_SCRIPT = REPO / "bench" / "ct2_process.py"
QUANTIZATIONS = ("float32", "int8")
# The end-to-end runs of mha: eval.py with an empty cache, then again.
CACHES = ("cold", "warm")


@dataclasses.dataclass(frozen=True)
class Mode:
  """CTranslate2 as `translators` translators of `threads` threads each."""
  quantization: str
  translators: int
  threads: int

  @property
  def name(self) -> str:
    return f"ct2 {self.quantization} {self.translators}x{self.threads}"


def modes(cores: int, inter_threads: int,
          quantizations: tuple[str, ...] = QUANTIZATIONS) -> list[Mode]:
  """Each quantization as one translator of `cores` threads and, for
  `inter_threads` > 1, as that many translators sharing them."""
  found = []
  for quantization in quantizations:
    found.append(Mode(quantization, 1, cores))
    if inter_threads > 1:
      found.append(Mode(quantization, inter_threads, cores // inter_threads))
  return found


def bleu(hypotheses: list[str], references: list[str]) -> float:
  """sacreBLEU's BLEU of the texts (`metric_table.corpus_scores`)."""
  return metric_table.corpus_scores(hypotheses, references)["bleu"]


def compare(ours: list[np.ndarray], theirs: list[np.ndarray]
            ) -> tuple[int, int]:
  """(outputs equal, outputs that differ only after mha's output ended at
  its length limit without EOS: CTranslate2's limit is per call)."""
  same = capped = 0
  for a, b in zip(ours, theirs):
    if np.array_equal(a, b):
      same += 1
    elif (data.EOS_ID not in a and len(b) > len(a)
          and np.array_equal(b[:len(a)], a)):
      capped += 1
  return same, capped


@dataclasses.dataclass
class Job:
  """The sentences both engines translate, and the search's settings.

  Attributes:
    workdir: the trained workdir.
    tokenizer: its vocabulary (`data.Tokenizer`).
    encoded: mha's source ids, EOS included.
    sources, references: the texts.
    alpha, max_decode_extra, batch_size, repeats: as mha's search and the
      bench's passes.
    folder: a folder for the exports, the files and the runs' outputs.
  """
  workdir: str
  tokenizer: Any
  encoded: list[list[int]]
  sources: list[str]
  references: list[str]
  alpha: float
  max_decode_extra: int
  batch_size: int
  repeats: int
  folder: str

  def bleu_of_ids(self, outputs: list[np.ndarray]) -> float:
    return bleu([self.tokenizer.decode(out) for out in outputs],
                self.references)

  def ct2_command(self, what: str, model_dir: str, mode: Mode,
                  beam_sizes: list[int]) -> list[str]:
    """`bench/ct2_process.py`'s command line, but the mode's own files."""
    return [sys.executable, str(CT2_SCRIPT), what, f"--model_dir={model_dir}",
            "--beam_sizes=" + ",".join(map(str, beam_sizes)),
            f"--alpha={self.alpha}",
            f"--max_decode_extra={self.max_decode_extra}",
            f"--batch_size={self.batch_size}",
            f"--inter_threads={mode.translators}",
            f"--intra_threads={mode.threads}"]

  def path(self, *names: str) -> str:
    """A path under the job's folder (its parent folders made)."""
    path = os.path.join(self.folder, *names)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def export_models(job: Job, quantizations: set[str]) -> dict[str, str]:
  """The workdir's latest checkpoint exported: {quantization: folder}."""
  models = {}
  for quantization in sorted(quantizations):
    models[quantization] = job.path("export", quantization)
    export.export(job.workdir, models[quantization],
                  quantization=quantization)
  return models


def _run(command: list[str]) -> tuple[float, str]:
  """Runs `command` from the repository: its seconds from start to exit
  and its standard output. A failure ends the bench with its stderr."""
  start = time.perf_counter()
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                        check=False)
  seconds = time.perf_counter() - start
  if done.returncode:
    sys.exit(f"bench/decode.py: {os.path.basename(command[1])} failed "
             f"(exit status {done.returncode}):\n{done.stderr[-3000:]}")
  return seconds, done.stdout


def _last_json(stdout: str) -> dict[str, Any]:
  return json.loads(stdout.strip().splitlines()[-1])


def steady(job: Job, models: dict[str, str], ct2_modes: list[Mode],
           beam_sizes: list[int]) -> dict[tuple[int, str], dict[str, Any]]:
  """Each mode in a process of its own: {(beam size, mode's name): its
  seconds (the fastest call), outputs (ids, EOS included), tokens, ...}."""
  pieces_file = job.path("pieces.json")
  with open(pieces_file, "w", encoding="utf-8") as f:
    json.dump([[job.tokenizer.id_to_piece(t) for t in ids[:-1]]
               for ids in job.encoded], f)  # CTranslate2 adds the EOS
  piece_ids = {job.tokenizer.id_to_piece(i): i
               for i in range(job.tokenizer.vocab_size)}
  results = {}
  for mode in ct2_modes:
    _, stdout = _run(job.ct2_command(
        "steady", models[mode.quantization], mode, beam_sizes)
                     + [f"--pieces_file={pieces_file}",
                        f"--repeats={job.repeats}"])
    report = _last_json(stdout)
    for beam in beam_sizes:
      r = report["searches"][str(beam)]
      outputs = [np.asarray([piece_ids[p] for p in out], np.int64)
                 for out in r["outputs"]]
      seconds = min(r["times"])
      tokens = sum(map(len, outputs))  # each up to and including EOS
      results[beam, mode.name] = dict(
          seconds=seconds, warmup_seconds=r["warmup_seconds"],
          load_seconds=report["load_seconds"], outputs=outputs,
          tokens=tokens, tokens_per_sec=tokens / seconds,
          sentences_per_sec=len(outputs) / seconds)
  return results


def best_float32(results: dict[tuple[int, str], dict[str, Any]], beam: int,
                 ct2_modes: list[Mode]) -> str:
  """The name of CTranslate2 float32's faster mode at `beam`."""
  return min((m.name for m in ct2_modes if m.quantization == "float32"),
             key=lambda name: results[beam, name]["seconds"])


def report_steady(search: str, beam: int, ours: dict[str, Any],
                  results: dict[tuple[int, str], dict[str, Any]],
                  job: Job, ct2_modes: list[Mode]) -> None:
  """Prints each mode's steady state beside mha's (`ours`: `_timed`'s
  result of the current search) and mha's ratio to the best float32."""
  n = len(job.encoded)
  for mode in ct2_modes:
    r = results[beam, mode.name]
    same, capped = compare(ours["outputs"], r["outputs"])
    print(f"{search:>7} {mode.name:>17}: {r['sentences_per_sec']:7.1f} "
          f"sentences/s {r['tokens_per_sec']:8.1f} tokens/s "
          f"({r['tokens']} tokens, {r['seconds']:.2f} s a call; model "
          f"loaded in {r['load_seconds']:.2f} s, first call "
          f"{r['warmup_seconds']:.2f} s)  BLEU "
          f"{job.bleu_of_ids(r['outputs']):.2f}; {same}/{n} outputs equal "
          f"mha's, {capped} more differ only past mha's cap; mha/"
          f"{mode.name} speed ratio {r['seconds'] / ours['seconds']:.2f}x",
          flush=True)
  best = best_float32(results, beam, ct2_modes)
  print(f"{search:>7} steady state, mha/CTranslate2 float32 at its best "
        f"({best}): {results[beam, best]['seconds'] / ours['seconds']:.2f}x",
        flush=True)


def _eval_run(job: Job, beam: int, cache_dir: str, output_dir: str,
              mha_flags: list[str]) -> dict[str, Any]:
  """`python eval.py` on the job's files: its seconds from start to exit,
  and its metrics.json's compile seconds, search seconds and BLEU."""
  seconds, _ = _run([
      sys.executable, str(REPO / "eval.py"), f"--workdir={job.workdir}",
      f"--source_file={job.path('sources.txt')}",
      f"--reference_file={job.path('references.txt')}",
      f"--output_dir={output_dir}", f"--beam_size={beam}",
      f"--batch_size={job.batch_size}",
      f"--compilation_cache_dir={cache_dir}", *mha_flags])
  with open(os.path.join(output_dir, "metrics.json"), encoding="utf-8") as f:
    metrics = json.load(f)
  return dict(seconds=seconds, bleu=metrics["bleu"],
              **{k: metrics[k] for k in ("compile_seconds", "decode_seconds")})


def _ct2_run(job: Job, model_dir: str, mode: Mode, beam: int,
             output: str) -> dict[str, Any]:
  """`bench/ct2_process.py end_to_end`: its seconds from start to exit, its
  own parts' seconds, and the BLEU of the file it wrote."""
  seconds, stdout = _run(job.ct2_command("end_to_end", model_dir, mode,
                                         [beam]) + [
      f"--source_file={job.path('sources.txt')}", f"--output={output}"])
  with open(output, encoding="utf-8") as f:
    texts = f.read().splitlines()
  return dict(seconds=seconds, bleu=bleu(texts, job.references),
              **_last_json(stdout))


def end_to_end(job: Job, models: dict[str, str], ct2_modes: list[Mode],
               beam_sizes: list[int], mha_flags: list[str]
               ) -> dict[tuple[int, str], dict[str, Any]]:
  """mha's eval.py (cold and warm cache) and CTranslate2 float32 in each of
  `ct2_modes`, fresh processes, `job.repeats` rounds: {(beam size, 'mha
  cold' | 'mha warm' | mode's name): the fastest run}."""
  for name, lines in (("sources.txt", job.sources),
                      ("references.txt", job.references)):
    with open(job.path(name), "w", encoding="utf-8") as f:
      f.writelines(line + "\n" for line in lines)
  runs = collections.defaultdict(list)
  for round_ in range(job.repeats):
    for beam in beam_sizes:
      where = ("end_to_end", f"beam{beam}_round{round_}")
      for cache in CACHES:  # the same folder: new and empty, then filled
        runs[beam, f"mha {cache}"].append(_eval_run(
            job, beam, job.path(*where, "cache"),
            job.path(*where, f"eval_{cache}"), mha_flags))
      for mode in ct2_modes:
        runs[beam, mode.name].append(_ct2_run(
            job, models[mode.quantization], mode, beam,
            job.path(*where, f"{mode.name.replace(' ', '_')}.txt")))
  return {key: min(found, key=lambda r: r["seconds"])
          for key, found in runs.items()}


def report_end_to_end(search: str, beam: int,
                      results: dict[tuple[int, str], dict[str, Any]],
                      num_sentences: int, ct2_modes: list[Mode]) -> None:
  """Prints each end-to-end run and mha's ratios to CTranslate2."""
  for cache in CACHES:
    r = results[beam, f"mha {cache}"]
    print(f"{search:>7} end to end, mha eval.py, {cache} cache: "
          f"{r['seconds']:.2f} s, {num_sentences / r['seconds']:.1f} "
          f"sentences/s (its search {r['decode_seconds']:.2f} s, of it "
          f"compiling {r['compile_seconds']:.2f} s: "
          f"{r['compile_seconds'] / r['seconds']:.0%} of the run; before "
          f"and after it {r['seconds'] - r['decode_seconds']:.2f} s: "
          f"start-up, imports, checkpoint, scoring)  BLEU {r['bleu']:.2f}",
          flush=True)
  for mode in ct2_modes:
    r = results[beam, mode.name]
    print(f"{search:>7} end to end, {mode.name}: {r['seconds']:.2f} s, "
          f"{num_sentences / r['seconds']:.1f} sentences/s (imports "
          f"{r['import_seconds']:.2f} s, model loaded in "
          f"{r['load_seconds']:.2f} s, translation "
          f"{r['translate_seconds']:.2f} s)  BLEU {r['bleu']:.2f}",
          flush=True)
  if ct2_modes:
    best = best_float32(results, beam, ct2_modes)
    ratios = ", ".join(
        f"{cache} cache {_ratio(results, beam, cache, best):.2f}x"
        for cache in reversed(CACHES))
    print(f"{search:>7} end to end, mha/CTranslate2 float32 at its best "
          f"({best}): {ratios}", flush=True)


def _ratio(results: dict[tuple[int, str], dict[str, Any]], beam: int,
           cache: str, best: str) -> float:
  """mha's end-to-end speed with a `cache` cache over CTranslate2's `best`."""
  return results[beam, best]["seconds"] / results[beam, f"mha {cache}"][
      "seconds"]


def print_tables(searches: list[tuple[str, int]], mha: dict[str, float],
                 steady_results: dict[tuple[int, str], dict[str, Any]] | None,
                 e2e_results: dict[tuple[int, str], dict[str, Any]] | None,
                 ct2_modes: list[Mode], num_sentences: int) -> None:
  """The figures above as Markdown tables: sentences/s in steady state
  (`mha`: {search: mha's}), seconds and sentences/s end to end, and mha's
  ratios to CTranslate2 float32 at its best."""
  if steady_results:
    rows = []
    for search, beam in searches:
      best = best_float32(steady_results, beam, ct2_modes)
      seconds = steady_results[beam, best]["seconds"]
      rows.append([search, f"{mha[search]:.1f}"] + [
          f"{steady_results[beam, m.name]['sentences_per_sec']:.1f}"
          for m in ct2_modes] + [
              f"{mha[search] * seconds / num_sentences:.2f}x ({best})"])
    print("\nSteady state, sentences/s:\n" + common.table(
        ["search", "mha"] + [m.name for m in ct2_modes]
        + ["mha / ct2 float32 best"], rows))
  if e2e_results:
    float32 = [m for m in ct2_modes if m.quantization == "float32"]
    rows = []
    for search, beam in searches:
      cold = e2e_results[beam, "mha cold"]
      rows.append([search] + [_seconds_cell(e2e_results[beam, name],
                                            num_sentences)
                              for name in ("mha cold", "mha warm")]
                  + [f"{cold['compile_seconds'] / cold['seconds']:.0%}"]
                  + [_seconds_cell(e2e_results[beam, m.name], num_sentences)
                     for m in float32])
      if float32:
        best = best_float32(e2e_results, beam, float32)
        rows[-1] += [f"{_ratio(e2e_results, beam, cache, best):.2f}x"
                     for cache in reversed(CACHES)]
    print("\nEnd to end (a fresh process to the last output):\n"
          + common.table(
              ["search", "mha cold cache", "mha warm cache",
               "mha cold: compiling"] + [m.name for m in float32]
              + ["mha warm / ct2 float32 best",
                 "mha cold / ct2 float32 best"][:2 * bool(float32)], rows))


def _seconds_cell(r: dict[str, Any], num_sentences: int) -> str:
  return f"{r['seconds']:.2f} s, {num_sentences / r['seconds']:.1f}/s"
