"""`bench/decode.py --profile`: where the compiled search's time goes.

`run` traces the compiled search (greedy, then beam) of one batch of the
most frequent shape with `jax.profiler`, for the baseline and the current
code in turn, and prints XLA's op time summed by category (encoder, the
step's output projection, feed-forward and attention matmuls, the cache
write, the cache reorder, the vocabulary's lse and top-k, shrinking, loop
control), each op placed by the jax source stack the optimized HLO records
for it (ops XLA added, without one, in a category of their own: loop-carry
copies, layout transposes); with the compile time and the search's time.
Op time is summed over XLA's threads and inflated by the machine's load:
compare shares and the two codes within one run.
"""
import collections
import glob
import gzip
import inspect
import json
import os
import re
import tempfile
import time
import types

import jax
import numpy as np

from mha.search import batches as batch_search
from mha.search import texts as translate
from mha.search.settings import SearchSettings


def _searches(module: types.ModuleType) -> types.ModuleType:
  """The module of a translate module's compiled searches (`_translate_fn`,
  `_search_inputs`): its `batch_search`, or itself before the split."""
  return getattr(module, "batch_search", module)


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


def run(batches, baseline: tuple[str, types.ModuleType] | None, *,
        model_config, params, beam_sizes, alpha, extra, eos_id, repeats,
        beam_stop) -> None:
  """`profile` of the current search (with `beam_stop`) and of `baseline`
  ((name, its translate module), with its default rule), each beam size in
  turn, on one batch of the most frequent shape of `batches`."""
  shapes = collections.Counter(batch.shape_key for batch in batches)
  batch = next(b for b in batches
               if b.shape_key == shapes.most_common(1)[0][0])
  print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.")
  modules = [("new", translate, dict(beam_stop=beam_stop))]
  if baseline is not None:
    name, module = baseline
    # The baseline's default rule (its code may predate the argument).
    takes = "beam_stop" in inspect.signature(
        _searches(module)._translate_fn).parameters  # pylint: disable=protected-access
    modules.insert(0, (name, module,
                       dict(beam_stop="exact") if takes else {}))
  for beam in beam_sizes:
    for name, module, options in modules:
      profile(name, module, model_config, params, batch, beam_size=beam,
              alpha=alpha, extra=extra, eos_id=eos_id, repeats=repeats,
              options=options)
