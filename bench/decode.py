r"""Decoding speed: greedy and beam search, sentences/s and tokens/s.

    python bench/decode.py                            # random model, no workdir
    python bench/decode.py --workdir=/tmp/m30k        # a trained workdir
    python bench/decode.py --workdir=/tmp/m30k --split=val --num_sentences=200

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

CTranslate2 beside it: `--ctranslate2` (with `--workdir`; needs the optional
`ctranslate2` package) exports the same checkpoint with `mha.export`
(float32 and int8, into a temporary folder) and times CTranslate2's greedy
and beam search on the same sentences, in the same batches (mha's
length-sorted batches of `--batch_size`), the same beam size and α (as
CTranslate2's own length penalty, |Y|^α, not GNMT's), with
`--ct2_threads` threads (default: all cores, as XLA uses), one batch per
call, timed chunk by chunk in turn with mha's searches (as the baseline
is: the load of a shared machine hits every engine alike);
`--ct2_inter_threads=N` adds CTranslate2 float32 as N translators of one
thread each, every batch of a chunk submitted at once (its way of using
the cores for many batches). Its length
limit is per call: the batch's longest source + the config's
`max_decode_extra` (mha's is per sentence), and min_decoding_length=0 as
in mha. Prints its sentences/s, the mha/CTranslate2 speed ratios, BLEU,
and how many outputs equal mha's.

Where the time goes: `--profile` traces the compiled search (greedy, then
beam) of one batch of the most frequent shape with `jax.profiler`, for the
baseline and the current code in turn, and prints XLA's op time summed by
category (encoder, the step's output projection, feed-forward and attention
matmuls, the cache write, the cache reorder, the vocabulary's lse and top-k,
shrinking, loop control), each op placed by the jax source stack the
optimized HLO records for it (ops XLA added, without one, in a category of
their own: loop-carry copies, layout transposes); with the compile time and
the search's time.
Op time is summed over XLA's threads and inflated by the machine's load:
compare shares and the two codes within one run.

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
import collections
import glob
import gzip
import importlib
import inspect
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from bench import common
from configs import multi30k
import mha
from mha.search import batches as batch_search
from mha import data
from mha.store import trained
from mha import export
from mha.scoring import metric_table
from mha.search import texts as translate
from mha.search.settings import SearchSettings
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


def _searches(module: types.ModuleType) -> types.ModuleType:
  """The module of a translate module's compiled searches (`_translate_fn`,
  `_search_inputs`): its `batch_search`, or itself before the split."""
  return getattr(module, "batch_search", module)


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
  old, ...; with CTranslate2's paths, each goes first as often as the
  others), each chunk waited for, so that the load of a shared machine,
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


def _random_setup(args):
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
  return (model_config, params, encoded, None, None, config.alpha,
          config.max_decode_extra, 0, -1)


def _workdir_setup(args):
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
  return (model_config, params, encoded, tokenizer, references, config.alpha,
          config.max_decode_extra, config.max_decode_extra, data.EOS_ID)


class CTranslate2Path:
  """A CTranslate2 export of the workdir's checkpoint, run on mha's batches.

  `batches` are a `Path`'s (mha's length-sorted batches), so both engines
  see the same sentences together, and `_timed` runs it chunk by chunk in
  turn with mha's paths, as it runs them (the same interface as `Path`);
  outputs are mha-style id arrays (EOS included) in input order.
  """

  def __init__(self, name, model_dir, tokenizer, encoded, batches, threads,
               inter_threads=1):
    import ctranslate2  # pylint: disable=import-outside-toplevel
    self.name, self.encoded, self.batches = name, encoded, batches
    self.translator = ctranslate2.Translator(
        str(model_dir), device="cpu", inter_threads=inter_threads,
        intra_threads=threads)
    self.inter_threads = inter_threads
    self.piece_ids = {tokenizer.id_to_piece(i): i
                      for i in range(tokenizer.vocab_size)}
    self.sources = [[tokenizer.id_to_piece(t) for t in ids[:-1]]
                    for ids in encoded]  # CTranslate2 adds the EOS

  def run(self, model_config, params, batches, *, beam_size, alpha,
          max_decode_extra, eos_id) -> list[tuple[np.ndarray, list]]:
    """Per batch: (its sentence indices, their output ids)."""
    del model_config, params, eos_id  # its own model; EOS ends an output
    calls = []  # with several inter threads, every batch submitted at once
    for batch in batches:
      rows = [self.sources[i] for i in batch.indices]
      calls.append((batch.indices, self.translator.translate_batch(
          rows, beam_size=beam_size, length_penalty=alpha,
          max_decoding_length=max(len(r) for r in rows) + 1 + max_decode_extra,
          min_decoding_length=0, max_input_length=0, return_end_token=True,
          asynchronous=self.inter_threads > 1)))
    return [(indices, [np.asarray([self.piece_ids[p] for p in (
        r.result() if self.inter_threads > 1 else r).hypotheses[0]], np.int64)
                       for r in results]) for indices, results in calls]

  def outputs(self, raw) -> list[np.ndarray]:
    """Per sentence, in input order: its output ids (EOS included)."""
    result = [None] * len(self.encoded)
    for indices, outs in raw:
      for i, out in zip(indices, outs):
        result[i] = out
    return result


def _ct2_paths(args, folder, tokenizer, encoded, batches):
  """Exports the workdir's latest checkpoint (float32, int8) into `folder`."""
  paths = []
  for quantization in ("float32", "int8"):
    model_dir = os.path.join(folder, quantization)
    export.export(args.workdir, model_dir, quantization=quantization)
    paths.append(CTranslate2Path(f"ct2 {quantization}", model_dir, tokenizer,
                                 encoded, batches, args.ct2_threads))
    if quantization == "float32" and args.ct2_inter_threads > 1:
      paths.append(CTranslate2Path(
          f"ct2 f32 x{args.ct2_inter_threads}", model_dir, tokenizer,
          encoded, batches, 1, inter_threads=args.ct2_inter_threads))
  return paths


def _compare(ours: list[np.ndarray], theirs: list[np.ndarray]
             ) -> tuple[int, int]:
  """(outputs equal, outputs that differ only after mha's output ended at
  its length limit without EOS: CTranslate2's limit is per batch)."""
  same = capped = 0
  for a, b in zip(ours, theirs):
    if np.array_equal(a, b):
      same += 1
    elif (data.EOS_ID not in a and len(b) > len(a)
          and np.array_equal(b[:len(a)], a)):
      capped += 1
  return same, capped


def _bleu(hypotheses: list[str], references: list[str]) -> float:
  """sacreBLEU's BLEU of the texts (`metric_table.corpus_scores`)."""
  return metric_table.corpus_scores(hypotheses, references)["bleu"]


def _ct2_report(search, ct2_paths, results, references, tokenizer,
                num_sentences):
  """Prints each CTranslate2 path's result (timed in turn with mha's) beside
  mha's current search."""
  ours = results["new"]
  for path in ct2_paths:
    r = results[path.name]
    same, capped = _compare(ours["outputs"], r["outputs"])
    hypotheses = [tokenizer.decode(out) for out in r["outputs"]]
    print(f"{search:>7} {path.name:>14}: {r['sentences_per_sec']:7.1f} "
          f"sentences/s {r['tokens_per_sec']:8.1f} tokens/s "
          f"({r['tokens']} tokens, {r['seconds']:.2f} s per pass)  BLEU "
          f"{_bleu(hypotheses, references):.2f}; "
          f"{same}/{num_sentences} outputs equal mha's, {capped} more "
          f"differ only past mha's cap; mha/{path.name} "
          f"speed ratio {r['seconds'] / ours['seconds']:.2f}x",
          flush=True)


# ------------------------------------------------------------------ profile

# Categories of `--profile`. An op's phase is the first of _PHASES with a
# function on its jax source stack; its part, in the search, the first rule
# that a function of its stack matches, in the step, the rule of the
# innermost function that matches one (every step op is in
# Transformer.decode, the output projection alone directly).
_PHASES = (
    ("encoder", ("Transformer.encode",)),
    ("decode cache made (cross-attention K, V)", ("init_cache",)),
    ("shrink: state and cache gathered", ("gather_sentences",)),
    ("stage growth: outputs and cache padded", ("grow_cache", "_pad_axis")),
    ("step", ("tokens_to_logits",)),
    ("search", ("",)),
)
_PARTS = {
    "step": (
        ("self-attention cache write", ("_append_to_cache",)),
        ("feed-forward matmuls", ("FeedForward.__call__",)),
        ("attention Q/K/V/O projections", ("_apply_projection",
                                           "MultiHeadAttention.__call__")),
        ("attention QK, softmax, AV", ("_dot_logits", "_mix",
                                       "masked_softmax", "_heads")),
        ("layer norm, residual, embedding", (
            "_compute_stats", "_normalize", "LayerNorm", "ResidualSublayer",
            "Embed", "AddPositionEncoding", "Layer.__call__")),
        ("output projection [rows, vocab]", ("Transformer.decode",)),
    ),
    "search": (
        ("cache reorder", ("_gather_rows",)),
        ("log-softmax / lse and top-k over the vocabulary", (
            "_best_extensions", "_greedy_choice", "_step_logprobs",
            "_argmax")),
        ("candidates, finished merge, sequences", (
            "_candidates", "_merge_finished", "_take", "body")),
    ),
}
_SEARCH_REST = "stopping rule, loop control"
# Ops of the optimized HLO without a jax source stack: those XLA added (the
# copies of a loop's carried arrays, transposes for a product's layout).
_NO_SOURCE = "no jax source: copies and transposes XLA added"
# Control flow: a while or conditional op's time covers the ops it runs.
_CONTROL_FLOW = re.compile(r"\s(while|conditional|call)\(%")


def _stack_frames(hlo_text: str) -> dict[str, list[str]]:
  """Op name -> the function names of its jax source stack, innermost first
  (the optimized HLO's FileLocations and StackFrames tables); control-flow
  ops left out."""
  def table(name):
    found = re.search(r"^%s\n(.*?)\n\n" % name, hlo_text, re.M | re.S)
    return found.group(1).split("\n") if found else []
  functions = {int(l.split()[0]): l.split(None, 1)[1].strip('"')
               for l in table("FunctionNames")}
  locations = {int(l.split()[0]): functions[int(re.search(
      r"function_name_id=(\d+)", l).group(1))] for l in table("FileLocations")}
  frames = {}
  for line in table("StackFrames"):
    fields = dict(re.findall(r"(\w+)=(\d+)", line))
    # The parent is the frame listed at parent_frame_id - 1 (0: none).
    frames[int(line.split()[0])] = (int(fields["file_location_id"]),
                                    int(fields.get("parent_frame_id", 0)) - 1)

  def stack(frame):
    names = []
    while frame in frames and len(names) < 100:
      location, parent = frames[frame]
      names.append(locations[location].split(".<locals>.")[-1])
      frame = parent
    return names

  ops = {}
  for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*", hlo_text,
                       re.M):
    if not _CONTROL_FLOW.search(m.group(0)):
      frame = re.search(r"stack_frame_id=(\d+)", m.group(0))
      # No frame: an op XLA added (a loop-carry copy, a layout transpose).
      ops[m.group(1)] = stack(int(frame.group(1))) if frame else []
  return ops


def _profile_category(stack: list[str]) -> str:
  if not stack:
    return _NO_SOURCE
  phase = next(p for p, words in _PHASES
               if any(w in name for name in stack for w in words))
  if phase not in _PARTS:
    return phase
  if phase == "search":  # the first rule any function matches
    for part, words in _PARTS[phase]:
      if any(w in name for name in stack for w in words):
        return f"{phase}: {part}"
  for name in stack:  # in the step: the innermost function that matches
    for part, words in _PARTS[phase]:
      if any(w in name for w in words):
        return f"{phase}: {part}"
  return f"{phase}: " + (_SEARCH_REST if phase == "search" else "other")


def profile(name, module, model_config, params, batch, *, beam_size, alpha,
            extra, eos_id, repeats=2, options=None) -> None:
  """Traces the compiled search of `module` (a translate module) on one
  batch (`jax.profiler`) and prints XLA's op time summed by category (the
  jax source of each op); `options`: more arguments of its `_translate_fn`
  (the current code's `beam_stop`)."""
  searches = _searches(module)
  if hasattr(searches, "translate_fn"):  # settings as one object
    fn = searches.translate_fn(model_config, SearchSettings(
        beam_size=beam_size, alpha=alpha, **(options or {})), eos_id)
  else:  # a baseline of before (its settings one by one)
    fn = searches._translate_fn(model_config, beam_size, float(alpha),  # pylint: disable=protected-access
                                eos_id, **(options or {}))
  static, devices, rows = searches._search_inputs(  # pylint: disable=protected-access
      model_config, batch.inputs, max_decode_extra=extra,
      max_decode_len=batch.max_decode_len,
      first_stage_extra=batch_search.FIRST_STAGE_EXTRA, devices=(),
      extra_rows=())
  params = jax.device_put(params)
  start = time.perf_counter()
  compiled = fn.lower(params, *rows, devices=devices, num_best=0,
                      **static).compile()
  compile_seconds = time.perf_counter() - start
  ops = _stack_frames(compiled.as_text())
  jax.block_until_ready(compiled(params, *rows))
  with tempfile.TemporaryDirectory() as logdir:
    start = time.perf_counter()
    with jax.profiler.trace(logdir):
      for _ in range(repeats):
        out = jax.block_until_ready(compiled(params, *rows))
    seconds = (time.perf_counter() - start) / repeats
    path = glob.glob(os.path.join(logdir, "**", "*.trace.json.gz"),
                     recursive=True)[0]
    with gzip.open(path) as f:
      events = json.load(f)["traceEvents"]
  totals, counts = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("name") in ops:
      category = _profile_category(ops[e["name"]])
      totals[category] += e.get("dur", 0) / 1e3 / repeats
      counts[category] += 1 / repeats
  total = sum(totals.values())
  steps = int((np.asarray(out) != 0).sum(axis=1).max())
  print(f"profile of {name}, beam {beam_size}, one batch "
        f"{batch.inputs.shape} (cache {batch.max_decode_len}), {steps} steps "
        f"for its longest output: compiled in {compile_seconds:.1f} s; "
        f"{seconds * 1e3:.0f} ms "
        f"a search (traced), XLA op time {total:.0f} ms summed over threads "
        f"({len(ops)} ops in the optimized HLO):")
  for category, ms in totals.most_common():
    if ms / total >= 0.002:
      print(f"  {category:48s} {ms:8.1f} ms {ms / total:6.1%} "
            f"{counts[category]:7.0f} op runs")


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
                      help="with --workdir: time CTranslate2 (float32, int8) "
                      "on the same checkpoint, sentences and batches")
  parser.add_argument("--ct2_threads", type=int, default=os.cpu_count(),
                      help="CTranslate2's intra_threads (default: all cores)")
  parser.add_argument("--ct2_inter_threads", type=int, default=1,
                      help="N > 1: also CTranslate2 float32 with N "
                      "translators of one thread each, the batches "
                      "submitted at once (CTranslate2's inter_threads)")
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


def main():
  parser = make_parser()
  args = parser.parse_args()
  if args.ctranslate2 and not args.workdir:
    parser.error("--ctranslate2 needs --workdir (a trained model to export)")
  mha.use_cpu_cores(args.cpu_devices)

  total_start = time.perf_counter()
  print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{common.machine_line()}.")
  best, median = common.matmul_peak_flops()
  print(f"float32 matmul peak (2048 x 2048 jnp.dot, 9 runs): best "
        f"{common.fmt_si(best, 'FLOP/s')}, median "
        f"{common.fmt_si(median, 'FLOP/s')}.", flush=True)
  setup = _workdir_setup if args.workdir else _random_setup
  # cache_extra sizes the decode cache (batch.max_decode_len), extra limits
  # each output to its source length + extra.
  (model_config, params, encoded, tokenizer, references, alpha, cache_extra,
   extra, eos_id) = setup(args)
  if args.profile:
    batches = Path("new", translate, model_config, encoded, args.batch_size,
                   cache_extra).batches
    shapes = collections.Counter(batch.shape_key for batch in batches)
    batch = next(b for b in batches
                 if b.shape_key == shapes.most_common(1)[0][0])
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.")
    modules = [("new", translate, dict(beam_stop=args.beam_stop))]
    if args.baseline != "none":
      baseline = load_baseline(args.baseline)
      # The baseline's default rule (its code may predate the argument).
      takes = "beam_stop" in inspect.signature(
          _searches(baseline)._translate_fn).parameters  # pylint: disable=protected-access
      modules.insert(0, (f"old ({args.baseline})", baseline,
                         dict(beam_stop="exact") if takes else {}))
    for beam in ([1] * (not args.no_greedy)) + [args.beam_size]:
      for name, module, options in modules:
        profile(name, module, model_config, params, batch, beam_size=beam,
                alpha=alpha, extra=extra, eos_id=eos_id,
                repeats=args.repeats, options=options)
    return
  paths = []
  if args.baseline != "none":
    paths.append(Path(f"old ({args.baseline})", load_baseline(args.baseline),
                      model_config, encoded, args.batch_size, cache_extra))
  paths.append(Path("new", translate, model_config, encoded, args.batch_size,
                    cache_extra, dict(beam_stop=args.beam_stop,
                                      matmul_dtype=args.matmul_dtype)))
  print(f"{len(paths[-1].batches)} batches of up to {args.batch_size} "
        f"sentences; {jax.device_count()} {jax.default_backend()} device(s), "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.")
  ct2_folder = tempfile.TemporaryDirectory(prefix="decode_ct2_")
  ct2_paths = []
  if args.ctranslate2:
    ct2_paths = _ct2_paths(args, ct2_folder.name, tokenizer, encoded,
                           paths[-1].batches)
    print(f"CTranslate2: the same checkpoint exported (float32, int8), "
          f"{args.ct2_threads} intra threads, the same batches, one at a "
          "time" + (f"; 'x{args.ct2_inter_threads}': float32, "
                    f"{args.ct2_inter_threads} inter threads of 1, the "
                    "batches side by side" if args.ct2_inter_threads > 1
                    else "") + ".")
  speeds = {}
  searches = [("greedy", 1)] * (not args.no_greedy) + [
      (f"beam {args.beam_size}", args.beam_size)]
  for search, beam in searches:
    results = _timed(paths + ct2_paths, model_config, params, len(encoded),
                     repeats=args.repeats, beam_size=beam, alpha=alpha,
                     max_decode_extra=extra, eos_id=eos_id)
    for path in paths:
      r = results[path.name]
      line = (f"{search:>7} {path.name:>14}: {r['sentences_per_sec']:7.1f} "
              f"sentences/s {r['tokens_per_sec']:8.1f} tokens/s "
              f"({r['tokens']} tokens, {r['seconds']:.2f} s per pass; "
              f"first pass {r['warmup_seconds']:.1f} s with its "
              f"compilations: ~{r['compile_seconds']:.1f} s more than a "
              f"timed pass)")
      if tokenizer is not None:
        hypotheses = [tokenizer.decode(out) for out in r["outputs"]]
        line += f"  BLEU {_bleu(hypotheses, references):.2f}"
      print(line, flush=True)
      speeds[search, path.name] = r["sentences_per_sec"]
    if len(paths) == 2:
      old, new = (results[p.name] for p in paths)
      same = sum(np.array_equal(a, b) for a, b in zip(old["outputs"],
                                                      new["outputs"]))
      print(f"{search:>7} new/old speed ratio: "
            f"{old['seconds'] / new['seconds']:.2f}x; outputs "
            + (f"of all {len(encoded)} sentences identical" if same == len(
                encoded) else f"DIFFER: {same} of {len(encoded)} sentences "
               "identical") + ".", flush=True)
    if ct2_paths:
      _ct2_report(search, ct2_paths, results, references, tokenizer,
                  len(encoded))
  ct2_folder.cleanup()
  beam_name = f"beam {args.beam_size}"
  speed = speeds[beam_name, "new"]
  if not args.no_greedy:
    print(f"greedy/beam {args.beam_size} speed ratio (new): "
          f"{speeds['greedy', 'new'] / speed:.2f}x.")
  print(f"Total {time.perf_counter() - total_start:.0f} s.")
  print(f"{beam_name} (new): {speed:.1f} sentences/s = "
        f"{speed / REFERENCE_BEAM_SENTENCES_PER_SEC:.2f}x the reference "
        f"point's {REFERENCE_BEAM_SENTENCES_PER_SEC:g} (google/flax "
        f"examples/wmt, beam 4, same shape and machine)"
        + ("" if args.workdir else
           " (the reference is for a trained model: run with --workdir)")
        + ".")


if __name__ == "__main__":
  main()
