r"""Decoding speed: greedy and beam search, sentences/s and tokens/s.

    python bench/decode.py                            # random model, no workdir
    python bench/decode.py --workdir=/tmp/m30k        # a trained workdir
    python bench/decode.py --workdir=/tmp/m30k --split=val --num_sentences=200
    python bench/decode.py --workdir=/tmp/m30k --baseline=none \
        --ctranslate2 --end_to_end           # both engines as users run them

Two modes, and the output says which one ran:

* `--workdir=DIR`: the workdir's latest checkpoint, config and vocabulary on
  `--split` (default: the config's `test_split`, `test_2016_flickr` for
  configs/multi30k.py). Real search: outputs end at EOS (or at input + the
  config's `max_decode_extra`). Reports BLEU too.
* no workdir: nothing is trained. A randomly initialised model of the
  Multi30k reference shape (configs/multi30k.py: 3+3 layers, d_model 256,
  4 heads, d_ff 1024, vocabulary 8,000) translates the Multi30k
  `test_2016_flickr` German sources ($MHA_MULTI30K_DIR, else
  ../shared/data/multi30k), tokenized with an 8,000-piece BPE SentencePiece
  trained here on the Multi30k training text (a few seconds). Without the
  corpus, random ids with Multi30k-like lengths are used. A random model does
  not stop at a sensible length, so EOS is disabled (eos_id=-1) and every
  output is forced to exactly its source's length (German sources and English
  references have similar token counts, both are printed), while the decode
  cache keeps eval.py's size (padded source + max_decode_extra 50 positions:
  the cost of beam search grows with it); tokens/s counts the forced tokens.

Before and after, in one run: `--baseline=REV` (default: the commit
before issue 20's decoding work) loads `mha/decoding.py`,
`mha/batch_search.py` (where REV has it) and `mha/translate.py` as they
were at REV (`git show`: their paths before the folders of 2026-11) beside
the current ones,
both running on the current model code (attention, Transformer) with the
same parameters, and times the two searches on the same sentences, taking
turns chunk by chunk (a chunk: the batches the current search searches as
one, its slots refilled with the next batches' sentences; each search gets
a chunk's batches in one call). `--baseline=none` times the
current search alone.

CTranslate2 beside it, as its users run it: `--ctranslate2` (with
`--workdir`; needs the optional `ctranslate2` package) exports the same
checkpoint with `mha.export` (float32 and int8, into a temporary folder)
and, once mha's passes are done, runs CTranslate2 in a process of its own
(bench/ct2_process.py: no JAX there, none running here), the whole job in
one `translate_batch` call (`max_batch_size` = `--batch_size`), the same
sentences, beam size, α and output limit, as one translator of
`--ct2_threads` threads (default: all cores) and as `--ct2_inter_threads`
translators (default 2) sharing them; steady state: the model loaded and
one call made first, then `--repeats` timed calls. Prints its
sentences/s, BLEU, how many outputs equal mha's, and the mha/CTranslate2
speed ratios, against float32's faster mode (bench/decode_ct2.py has the
details). The former mode, CTranslate2 in this process given mha's batches
one call each, interleaved batch by batch with JAX, is gone: it measured
CTranslate2 sharing the process and the cores with JAX, not as it is run.

End to end: `--end_to_end` (with `--workdir`) times, from a fresh process
to the last output, `python eval.py` on the same sentences (a text file)
with a new empty `--compilation_cache_dir` (cold), then the same folder
again (warm), with its compile seconds and their share of the cold run;
with `--ctranslate2`, CTranslate2 float32's own script in each mode too
(imports, tokenizing, model loading, translation, the file written), and
the mha/CTranslate2 ratios. The run ends with the figures as Markdown
tables.

Where the time goes: `--profile` traces the compiled search of one batch
by category (bench/decode_profile.py), the baseline's and the current
one's, instead of timing the passes.

mha runs on one JAX CPU device a core, as eval.py does
(`mha.use_cpu_cores`; `--cpu_devices=1`: one device for all cores), and
the header says how many.

Every path runs one untimed pass first (compiling its searches), then
`--repeats` full passes are timed (the fastest is reported); the first
pass's extra time over a timed pass is printed as the compile time. Sentences
are decoded as `eval.py` does (`translate_ids`'s steps: length-sorted batches of
`--batch_size`, bucketed padding), each path with its own batching. Prints
sentences/s and tokens/s of greedy and beam search for each path, the
new/old speed ratios and how many sentences' outputs are identical.

`--beam_stop=early`: the current search with the early stopping rule
(`mha.search.decoding.beam_search`'s `stop`); the baseline keeps its default,
the exact rule, so `--baseline=HEAD --beam_stop=early` times the two rules
of the same code side by side. `--matmul_dtype=bfloat16` likewise: the
current search with its weight products in bfloat16 (float32 results), the
baseline's in float32.
"""
import argparse
import gzip
import importlib
import io
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import types
from typing import Any, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from bench import common
from bench import decode_ct2
from bench import decode_profile
from bench.decode_ct2 import bleu
from configs import multi30k
import mha
from mha import data
from mha.store import trained
from mha.search import texts as translate
from mha import validation
from mha.errors import UserError
from mha.model.transformer import TransformerConfig
from mha.model.transformer import create_model
# pylint: enable=g-import-not-at-top,wrong-import-position

REPO = pathlib.Path(__file__).resolve().parents[1]
TEST_SPLIT = "test_2016_flickr"
# google/flax examples/wmt at the configs/multi30k.py shape on this project's
# 2-core machine decoded Multi30k test at beam 4 at about 9 sentences/s; the
# target (issue 7) is twice that.
REFERENCE_BEAM_SENTENCES_PER_SEC = 9.0
# The search before issue 20's decoding changes (encoder-decoder keys and
# values per beam row, cache transposed every step, rows padded to 8).
BASELINE = "48992a4"


def multi30k_dir() -> pathlib.Path | None:
  """$MHA_MULTI30K_DIR, else ../shared/data/multi30k, if it holds the files."""
  env = os.environ.get("MHA_MULTI30K_DIR")
  candidates = [pathlib.Path(env)] if env else []
  candidates.append(REPO.parent / "shared" / "data" / "multi30k")
  for path in candidates:
    if (path / f"{TEST_SPLIT}.de.gz").exists():
      return path
  return None


def _read_gz(path: pathlib.Path) -> list[str]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return f.read().rstrip("\n").split("\n")


def _train_tokenizer(folder: pathlib.Path, vocab_size: int) -> data.Tokenizer:
  """A BPE SentencePiece on Multi30k's training text, the project's ids."""
  lines = _read_gz(folder / "train.de.gz") + _read_gz(folder / "train.en.gz")
  writer = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=writer,
      vocab_size=vocab_size, model_type="bpe", pad_id=data.PAD_ID,
      eos_id=data.EOS_ID, unk_id=2, bos_id=-1, character_coverage=1.0,
      num_threads=os.cpu_count() or 1, minloglevel=2)
  return data.Tokenizer(writer.getvalue())


def load_baseline(rev: str) -> types.ModuleType:
  """`mha/translate.py` of commit `rev` (a commit before the folders of
  2026-11), with the `mha/decoding.py` and (at commits since it exists)
  the `mha/batch_search.py` it imports, loaded from git as separate
  modules on the current model code (its `from mha import transformer`
  finds the model's new home through `mha.MOVED`)."""
  modules = {}
  own = ("decoding", "batch_search")  # the modules translate imports
  saved = {name: (importlib.import_module(f"mha.{name}"), getattr(mha, name))
           for name in own}
  try:
    for name in own + ("translate",):
      shown = subprocess.run(
          ["git", "-C", str(REPO), "show", f"{rev}:mha/{name}.py"],
          capture_output=True, text=True)
      if shown.returncode and name == "batch_search":
        continue  # before the search of a batch had its own module
      shown.check_returncode()
      module = types.ModuleType(f"baseline_{rev}_{name}")
      sys.modules[module.__name__] = module  # dataclasses look it up
      for old_name, old in modules.items():  # its imports: the old ones
        sys.modules[f"mha.{old_name}"] = old
        setattr(mha, old_name, old)
      exec(compile(shown.stdout, f"{rev}:mha/{name}.py", "exec"),  # pylint: disable=exec-used
           module.__dict__)
      modules[name] = module
  finally:
    for name, (module, attribute) in saved.items():
      sys.modules[f"mha.{name}"] = module
      setattr(mha, name, attribute)
  return modules["translate"]


class Path:
  """One search implementation (a translate module) on the sentences."""

  def __init__(self, name, module, model_config, encoded, batch_size,
               cache_extra, options=None):
    self.name, self.module, self.encoded = name, module, encoded
    # decode_batches' keywords of this path (the current one's: search
    # settings, matmul_dtype among them).
    self.options = options or {}
    self.batches = module.make_batches(
        encoded, batch_size=batch_size, max_len=model_config.max_len,
        max_decode_extra=cache_extra)

  def run(self, model_config, params, batches, **kwargs) -> list[np.ndarray]:
    return self.module.decode_batches(model_config, params, batches,
                                      **kwargs, **self.options)

  def outputs(self, raw: list[np.ndarray]) -> list[np.ndarray]:
    """Per sentence, in input order: its output tokens, trailing 0s cut."""
    result = [None] * len(self.encoded)
    for batch, out in zip(self.batches, raw):
      for row, i in enumerate(batch.indices):
        tokens = np.asarray(out[row])
        result[i] = tokens[:np.flatnonzero(tokens).max() + 1] if tokens.any(
        ) else tokens[:0]
    return result


def _count_tokens(outputs: list[np.ndarray], eos_id: int) -> int:
  """Output tokens up to and including EOS (all of them without EOS)."""
  tokens = 0
  for out in outputs:
    if eos_id >= 0 and (out == eos_id).any():
      tokens += int((out == eos_id).argmax()) + 1
    else:
      tokens += int((out != data.PAD_ID).sum())
  return tokens


def _chunks(batches, beam_size) -> list[list[int]]:
  """The batches (indices) timed as one turn: the groups that the current
  search searches as one (`translate._refill_groups`: runs of batches
  whose slots take the next batches' sentences as theirs end); each path
  gets a turn's batches in one call."""
  return translate._refill_groups(batches, tuple(jax.local_devices()[:1]),  # pylint: disable=protected-access
                                  beam_size)


def _timed(paths, model_config, params, num_sentences, *, repeats,
           **kwargs):
  """Runs every path once untimed (its compilations and one pass), then
  times `repeats` passes of each. The paths take turns chunk by chunk
  (`_chunks`; at chunk i the order is rotated by i: old, new, then new,
  old, ...), each chunk waited for, so that the load of a shared machine,
  which changes within a pass, hits every path alike; a pass's time is
  the sum of its chunks'."""
  chunks = _chunks(paths[0].batches, kwargs["beam_size"])
  results = {}
  for path in paths:
    start = time.perf_counter()
    for chunk in chunks:
      path.run(model_config, params, [path.batches[i] for i in chunk],
               **kwargs)
    results[path.name] = {"warmup_seconds": time.perf_counter() - start,
                          "times": []}
  for _ in range(repeats):
    seconds = {path.name: 0.0 for path in paths}
    raw = {path.name: [] for path in paths}
    for i, chunk in enumerate(chunks):
      k = i % len(paths)
      for path in paths[k:] + paths[:k]:
        start = time.perf_counter()
        raw[path.name] += path.run(model_config, params,
                                   [path.batches[j] for j in chunk], **kwargs)
        seconds[path.name] += time.perf_counter() - start
    for path in paths:
      results[path.name]["times"].append(seconds[path.name])
      results[path.name]["outputs"] = path.outputs(raw[path.name])
  for r in results.values():
    r["seconds"] = min(r["times"])
    r["compile_seconds"] = r["warmup_seconds"] - r["seconds"]
    r["tokens"] = _count_tokens(r["outputs"], kwargs["eos_id"])
    r["sentences_per_sec"] = num_sentences / r["seconds"]
    r["tokens_per_sec"] = r["tokens"] / r["seconds"]
  return results


class Setup(NamedTuple):
  """What the passes decode, with which model and settings.

  Attributes:
    model_config, params: the model.
    encoded: the source ids, EOS included.
    tokenizer: the vocabulary (None: a random model's bench).
    references: the reference texts (None: as tokenizer).
    alpha: the length penalty's α.
    cache_extra: sizes the decode cache (`batch.max_decode_len`).
    extra: each output's limit: its source's length + `extra`.
    eos_id: the end of an output (-1: none, the random model's).
    sources: the source texts (None: a random model's bench).
  """
  model_config: TransformerConfig
  params: Any
  encoded: list[list[int]]
  tokenizer: data.Tokenizer | None
  references: list[str] | None
  alpha: float
  cache_extra: int
  extra: int
  eos_id: int
  sources: list[str] | None


def _random_setup(args) -> Setup:
  """Random multi30k-shaped model and Multi30k test sources (or random ids)."""
  config = multi30k.get_config()
  model_config = TransformerConfig.from_config(config, deterministic=True)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(create_model(model_config).init)(
      jax.random.PRNGKey(0), dummy, dummy)["params"]
  folder = multi30k_dir()
  rng = np.random.default_rng(0)
  if folder is not None:
    start = time.perf_counter()
    tokenizer = _train_tokenizer(folder, config.vocab_size)
    sources = _read_gz(folder / f"{TEST_SPLIT}.de.gz")
    references = _read_gz(folder / f"{TEST_SPLIT}.en.gz")
    if args.num_sentences:
      sources = sources[:args.num_sentences]
      references = references[:args.num_sentences]
    encoded = translate.encode_sources(tokenizer, sources, model_config.max_len)
    ref_tokens = np.mean([len(tokenizer.encode(r)) + 1 for r in references])
    what = (f"Multi30k {TEST_SPLIT} German sources from {folder}, tokenized "
            f"with a {config.vocab_size}-piece BPE SentencePiece trained on "
            f"Multi30k train ({time.perf_counter() - start:.1f} s); English "
            f"references average {ref_tokens:.1f} tokens with EOS")
  else:
    n = args.num_sentences or 1000
    lengths = np.clip(np.round(rng.normal(15.0, 5.0, n)), 3, 40).astype(int)
    encoded = [list(rng.integers(3, config.vocab_size, k - 1)) + [data.EOS_ID]
               for k in lengths]
    what = ("random ids with Multi30k-like lengths (normal, mean 15, sd 5, "
            "3..40 tokens): Multi30k not found (set MHA_MULTI30K_DIR)")
  print(f"Random model (nothing trained): configs/multi30k.py shape, "
        f"{config.num_layers}+{config.num_layers} layers, d_model "
        f"{config.d_model}, {config.num_heads} heads, d_ff {config.d_ff}, "
        f"vocab {config.vocab_size}.")
  print(f"Data: {len(encoded)} sentences, {what}; sources average "
        f"{np.mean([len(e) for e in encoded]):.1f} tokens with EOS.")
  print("Outputs: EOS disabled (eos_id=-1), every output forced to exactly "
        "its source's token count; decode cache of padded source + "
        f"{config.max_decode_extra} positions as in eval.py.")
  return Setup(model_config, params, encoded, None, None, config.alpha,
               config.max_decode_extra, 0, -1, None)


def _workdir_setup(args) -> Setup:
  """A trained workdir's latest checkpoint on a split."""
  try:
    config, tokenizer = trained.load_workdir(args.workdir)
    params, step, _ = trained.load_params(args.workdir)
  except UserError as e:
    sys.exit(f"bench/decode.py: {e}")
  split = args.split or config.test_split
  sources, references = data.load_text_pairs(config, split)
  if args.num_sentences:
    sources = sources[:args.num_sentences]
    references = references[:args.num_sentences]
  model_config = TransformerConfig.from_config(config, deterministic=True)
  encoded = translate.encode_sources(tokenizer, sources, model_config.max_len)
  print(f"Trained model: {args.workdir} step {step} "
        f"({config.num_layers} layers, d_model {config.d_model}, vocab "
        f"{config.vocab_size}); split {split}: {len(sources)} sentences, "
        f"sources average {np.mean([len(e) for e in encoded]):.1f} tokens "
        f"with EOS.")
  print(f"Outputs: real search, ending at EOS or at input + "
        f"{config.max_decode_extra} tokens; tokens/s counts output tokens up "
        "to and including EOS.")
  return Setup(model_config, params, encoded, tokenizer, references,
               config.alpha, config.max_decode_extra, config.max_decode_extra,
               data.EOS_ID, sources)


def make_parser() -> argparse.ArgumentParser:
  """The command's flags (bench/accelerator.py takes their defaults too)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default=None,
                      help="a trained workdir; default: a random model")
  parser.add_argument("--split", default=None,
                      help="with --workdir; default: its config's test_split")
  parser.add_argument("--num_sentences", type=int, default=0,
                      help="0 = the whole split (Multi30k test: 1,000)")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--no_greedy", action="store_true",
                      help="time beam search alone (greedy is not timed)")
  parser.add_argument("--ctranslate2", action="store_true",
                      help="with --workdir: CTranslate2 (float32, int8) on "
                      "the same checkpoint and sentences, in a process of "
                      "its own, the whole job per call")
  parser.add_argument("--end_to_end", action="store_true",
                      help="with --workdir: fresh processes to the last "
                      "output, mha's eval.py with a cold and a warm "
                      "compilation cache (and CTranslate2 float32 with "
                      "--ctranslate2)")
  parser.add_argument("--ct2_threads", type=int, default=os.cpu_count(),
                      help="CTranslate2's threads in all (default: all "
                      "cores)")
  parser.add_argument("--ct2_inter_threads", type=int, default=None,
                      help="N > 1: CTranslate2 also as N translators "
                      "sharing --ct2_threads (inter_threads N, "
                      "intra_threads --ct2_threads / N); 1: one only "
                      "(default: 2, 1 on one core)")
  parser.add_argument("--cpu_devices", type=int, default=None,
                      help="JAX CPU devices (mha.use_cpu_cores; default: "
                      "one a core, as eval.py; 1: one for all cores)")
  parser.add_argument("--profile", action="store_true",
                      help="trace the current search on one batch of the "
                      "most frequent shape (greedy and beam) and print XLA's "
                      "op time by category instead of timing the passes")
  parser.add_argument("--baseline", default=BASELINE,
                      help="a git revision whose search is timed beside the "
                      "current one; 'none': the current search alone")
  parser.add_argument("--beam_stop", default="exact",
                      choices=validation.BEAM_STOPS,
                      help="the current search's stopping rule (the "
                      "baseline's: its default, exact)")
  parser.add_argument("--matmul_dtype", default="float32",
                      choices=validation.MATMUL_DTYPES,
                      help="the current search's weight products (the "
                      "baseline's: float32)")
  return parser


def parse_flags(argv: list[str] | None = None) -> argparse.Namespace:
  """The flags, a combination the bench cannot run refused with one error
  naming its flags (exit status 2)."""
  parser = make_parser()
  args = parser.parse_args(argv)
  for flag in ("ctranslate2", "end_to_end"):
    if getattr(args, flag) and not args.workdir:
      parser.error(f"--{flag} needs --workdir (a trained model)")
    if getattr(args, flag) and args.profile:
      parser.error(f"--profile times no passes: it takes no --{flag}")
  if args.ct2_threads < 1:
    parser.error(f"--ct2_threads={args.ct2_threads}: at least 1")
  if args.ct2_inter_threads is None:
    args.ct2_inter_threads = min(2, args.ct2_threads)
  if args.ct2_inter_threads < 1 or args.ct2_threads < args.ct2_inter_threads:
    parser.error(f"--ct2_inter_threads={args.ct2_inter_threads}: from 1 to "
                 f"--ct2_threads={args.ct2_threads}")
  if args.ct2_threads % args.ct2_inter_threads:
    parser.error(f"--ct2_inter_threads={args.ct2_inter_threads} does not "
                 f"divide --ct2_threads={args.ct2_threads}: its translators "
                 "share those threads equally")
  return args


def _print_header() -> None:
  """The date, the machine and its float32 matmul peak."""
  print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{common.machine_line()}.")
  best, median = common.matmul_peak_flops()
  print(f"float32 matmul peak (2048 x 2048 jnp.dot, 9 runs): best "
        f"{common.fmt_si(best, 'FLOP/s')}, median "
        f"{common.fmt_si(median, 'FLOP/s')}.", flush=True)


def _profile(args: argparse.Namespace, setup: Setup) -> None:
  """--profile: `decode_profile.run` on the current search's batches."""
  batches = Path("new", translate, setup.model_config, setup.encoded,
                 args.batch_size, setup.cache_extra).batches
  baseline = None if args.baseline == "none" else (
      f"old ({args.baseline})", load_baseline(args.baseline))
  decode_profile.run(
      batches, baseline, model_config=setup.model_config,
      params=setup.params, beam_sizes=[1] * (not args.no_greedy)
      + [args.beam_size], alpha=setup.alpha, extra=setup.extra,
      eos_id=setup.eos_id, repeats=args.repeats, beam_stop=args.beam_stop)


def _paths(args: argparse.Namespace, setup: Setup) -> list[Path]:
  """The baseline's search (unless --baseline=none), then the current one."""
  paths = []
  if args.baseline != "none":
    paths.append(Path(f"old ({args.baseline})", load_baseline(args.baseline),
                      setup.model_config, setup.encoded, args.batch_size,
                      setup.cache_extra))
  paths.append(Path("new", translate, setup.model_config, setup.encoded,
                    args.batch_size, setup.cache_extra,
                    dict(beam_stop=args.beam_stop,
                         matmul_dtype=args.matmul_dtype)))
  print(f"{len(paths[-1].batches)} batches of up to {args.batch_size} "
        f"sentences; {jax.device_count()} {jax.default_backend()} device(s), "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.")
  return paths


def _print_pass(search: str, name: str, r: dict[str, Any],
                setup: Setup) -> None:
  """One path's line: speeds, its passes' seconds, compiling, BLEU."""
  line = (f"{search:>7} {name:>14}: {r['sentences_per_sec']:7.1f} "
          f"sentences/s {r['tokens_per_sec']:8.1f} tokens/s "
          f"({r['tokens']} tokens, {r['seconds']:.2f} s per pass; "
          f"first pass {r['warmup_seconds']:.1f} s with its "
          f"compilations: ~{r['compile_seconds']:.1f} s more than a "
          f"timed pass)")
  if setup.tokenizer is not None:
    line += "  BLEU %.2f" % bleu(
        [setup.tokenizer.decode(out) for out in r["outputs"]],
        setup.references)
  print(line, flush=True)


def _time_searches(args: argparse.Namespace, setup: Setup,
                   searches: list[tuple[str, int]]
                   ) -> dict[str, dict[str, dict[str, Any]]]:
  """`_timed` passes of every path for each search, printed with the
  new/old ratio: {search: {path's name: its result}}."""
  paths = _paths(args, setup)
  n = len(setup.encoded)
  found = {}
  for search, beam in searches:
    results = _timed(paths, setup.model_config, setup.params, n,
                     repeats=args.repeats, beam_size=beam, alpha=setup.alpha,
                     max_decode_extra=setup.extra, eos_id=setup.eos_id)
    for path in paths:
      _print_pass(search, path.name, results[path.name], setup)
    if len(paths) == 2:
      old, new = (results[p.name] for p in paths)
      same = sum(np.array_equal(a, b) for a, b in zip(old["outputs"],
                                                      new["outputs"]))
      print(f"{search:>7} new/old speed ratio: "
            f"{old['seconds'] / new['seconds']:.2f}x; outputs "
            + (f"of all {n} sentences identical" if same == n else
               f"DIFFER: {same} of {n} sentences identical") + ".",
            flush=True)
    found[search] = results
  return found


def _engines(args: argparse.Namespace, setup: Setup,
             searches: list[tuple[str, int]],
             results: dict[str, dict[str, dict[str, Any]]]) -> None:
  """--ctranslate2 and --end_to_end (`bench/decode_ct2.py`), after mha's
  passes: their lines, then the tables of both."""
  ct2_modes = decode_ct2.modes(args.ct2_threads, args.ct2_inter_threads
                               ) if args.ctranslate2 else []
  float32 = [m for m in ct2_modes if m.quantization == "float32"]
  beams = [beam for _, beam in searches]
  steady = e2e = None
  with tempfile.TemporaryDirectory(prefix="decode_ct2_") as folder:
    job = decode_ct2.Job(
        args.workdir, setup.tokenizer, setup.encoded, setup.sources,
        setup.references, setup.alpha, setup.extra, args.batch_size,
        args.repeats, folder)
    models = decode_ct2.export_models(
        job, {m.quantization for m in ct2_modes})
    if args.ctranslate2:
      print(f"CTranslate2: the same checkpoint exported, in a process of "
            f"its own, the whole job per call; 'AxB': A translators "
            f"(inter_threads) of B threads each.", flush=True)
      steady = decode_ct2.steady(job, models, ct2_modes, beams)
      for search, beam in searches:
        decode_ct2.report_steady(search, beam, results[search]["new"],
                                 steady, job, ct2_modes)
    if args.end_to_end:
      e2e = decode_ct2.end_to_end(job, models, float32, beams, [
          f"--beam_stop={args.beam_stop}",
          f"--matmul_dtype={args.matmul_dtype}"] + (
              [f"--cpu_devices={args.cpu_devices}"] if args.cpu_devices
              else []))
      for search, beam in searches:
        decode_ct2.report_end_to_end(search, beam, e2e, len(setup.encoded),
                                     float32)
  decode_ct2.print_tables(
      searches, {search: r["new"]["sentences_per_sec"]
                 for search, r in results.items()}, steady, e2e, ct2_modes,
      len(setup.encoded))


def _print_summary(args: argparse.Namespace,
                   results: dict[str, dict[str, dict[str, Any]]],
                   total_start: float) -> None:
  """The greedy/beam ratio, the run's time, and the reference point."""
  beam_name = f"beam {args.beam_size}"
  speed = results[beam_name]["new"]["sentences_per_sec"]
  if not args.no_greedy:
    print(f"greedy/beam {args.beam_size} speed ratio (new): "
          f"{results['greedy']['new']['sentences_per_sec'] / speed:.2f}x.")
  print(f"Total {time.perf_counter() - total_start:.0f} s; load average "
        f"{os.getloadavg()[0]:.2f}.")
  print(f"{beam_name} (new): {speed:.1f} sentences/s = "
        f"{speed / REFERENCE_BEAM_SENTENCES_PER_SEC:.2f}x the reference "
        f"point's {REFERENCE_BEAM_SENTENCES_PER_SEC:g} (google/flax "
        f"examples/wmt, beam 4, same shape and machine)"
        + ("" if args.workdir else
           " (the reference is for a trained model: run with --workdir)")
        + ".")


def main(argv: list[str] | None = None) -> None:
  args = parse_flags(argv)
  mha.use_cpu_cores(args.cpu_devices)
  total_start = time.perf_counter()
  _print_header()
  setup = (_workdir_setup if args.workdir else _random_setup)(args)
  if args.profile:
    _profile(args, setup)
    return
  searches = [("greedy", 1)] * (not args.no_greedy) + [
      (f"beam {args.beam_size}", args.beam_size)]
  results = _time_searches(args, setup, searches)
  if args.ctranslate2 or args.end_to_end:
    _engines(args, setup, searches, results)
  _print_summary(args, results, total_start)


if __name__ == "__main__":
  main()
