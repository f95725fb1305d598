r"""One MultiHeadAttention layer: `einsum` vs `xla` cost against length.

    python bench/attention.py                    # batch 1, lengths 64..1024
    python bench/attention.py --tokens=4096      # constant B·L tokens
    python bench/attention.py --mask=causal --d_model=256 --num_heads=4

For each sequence length L, and each `attention_impl` of
`mha.model.attention.MultiHeadAttention` (`einsum`: the module's own masked
softmax; `xla`: `jax.nn.dot_product_attention(implementation='xla')`), a
self-attention layer (d_model 512, 8 heads by default) is jit-compiled alone and
timed for the forward pass and for forward + backward (the gradient of a fixed
linear function of the output with respect to the parameters and the input),
median of several runs after warm-up, the implementations timed in turn (round
robin) so that other processes' load falls on both alike. The mask is built
inside the function, as in the model, from a `[B, L]` padding vector
(`--mask=padding`, the default, the encoder's) or with the causal triangle
(`--mask=causal`, the decoder's).

Memory is the compiled executable's `memory_analysis()`: temporaries +
arguments + outputs - aliased bytes, for forward + backward.

Model FLOPs of forward + backward, the backward pass costing twice the
forward: 3 · (2·B·L·4·d_model² + 4·B·L²·d_model) for the Q, K, V, O
projections and QKᵀ, AV. The projections grow as L and the attention products
as L², so with batch 1 the time ratio to the previous (half) length rises
from ~2 towards 4 once the L² term dominates (from L ~ 2·d_model on); with a
constant token count (`--tokens`) the projections cost the same at every
length and the ratio tends to 2.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench import common  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.validation import ATTENTION_IMPLS  # pylint: disable=g-import-not-at-top,wrong-import-position
from mha.model.attention import MultiHeadAttention  # pylint: disable=g-import-not-at-top,wrong-import-position


def layer_flops(batch: int, length: int, d_model: int) -> float:
  """Matmul FLOPs of forward + backward of one self-attention layer."""
  projections = 2 * batch * length * 4 * d_model ** 2
  products = 4 * batch * length ** 2 * d_model  # QKᵀ and AV
  return 3.0 * (projections + products)


def make_functions(impl: str, num_heads: int, mask_kind: str):
  """(init, forward, forward + backward) of one self-attention layer."""
  layer = MultiHeadAttention(num_heads=num_heads, attention_impl=impl)

  def mask_of(valid):
    # [B, 1, L, L]: both positions are real tokens (and causal if asked).
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    if mask_kind == "causal":
      length = valid.shape[1]
      mask &= jnp.tril(jnp.ones((length, length), jnp.bool_))[None, None]
    return mask

  def forward(params, x, valid):
    return layer.apply({"params": params}, x, x, mask_of(valid))

  def loss(params, x, valid, cotangent):
    # A linear function of the output: its gradient is the VJP of `cotangent`.
    return jnp.sum(forward(params, x, valid) * cotangent)

  return layer, jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1)))


def prepare(impl: str, batch: int, length: int, args) -> dict:
  """Compiled forward and forward + backward of one implementation at one
  shape, their arguments, and the compiled memory and model FLOPs."""
  layer, forward, backward = make_functions(impl, args.num_heads, args.mask)
  key_x, key_c, key_p = jax.random.split(jax.random.key(length), 3)
  x = jax.random.normal(key_x, (batch, length, args.d_model), jnp.float32)
  cotangent = jax.random.normal(key_c, x.shape, jnp.float32)
  # The last eighth of each row is padding (none for the causal mask).
  pad = length // 8 if args.mask == "padding" else 0
  valid = jnp.broadcast_to(jnp.arange(length) < length - pad, (batch, length))
  params = jax.jit(layer.init)(key_p, x, x)["params"]
  fwd = forward.lower(params, x, valid).compile()
  both = backward.lower(params, x, valid, cotangent).compile()
  mem = both.memory_analysis()
  peak = (mem.temp_size_in_bytes + mem.argument_size_in_bytes
          + mem.output_size_in_bytes - mem.alias_size_in_bytes)
  for _ in range(2):  # warm-up
    common.block((fwd(params, x, valid), both(params, x, valid, cotangent)))
  return {"forward_fn": lambda: fwd(params, x, valid),
          "both_fn": lambda: both(params, x, valid, cotangent),
          "peak": peak, "temp": mem.temp_size_in_bytes,
          "flops": layer_flops(batch, length, args.d_model),
          "forward_times": [], "both_times": []}


def time_round_robin(runs: list[dict], repeats: int) -> None:
  """Times every run's functions in turn, `repeats` rounds, so that load
  from other processes falls on all implementations alike."""
  for _ in range(repeats):
    for run in runs:
      for part in ("forward", "both"):
        start = time.perf_counter()
        common.block(run[part + "_fn"]())
        run[part + "_times"].append(time.perf_counter() - start)
  for run in runs:
    run["forward"] = statistics.median(run["forward_times"])
    run["both"] = statistics.median(run["both_times"])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--lengths", default="64,128,256,512,1024")
  parser.add_argument("--batch", type=int, default=1,
                      help="rows per call (ignored with --tokens)")
  parser.add_argument("--tokens", type=int, default=0,
                      help="if > 0: batch = tokens // length at every length")
  parser.add_argument("--d_model", type=int, default=512)
  parser.add_argument("--num_heads", type=int, default=8)
  parser.add_argument("--mask", default="padding",
                      choices=("padding", "causal"))
  parser.add_argument("--impls", default=",".join(ATTENTION_IMPLS))
  parser.add_argument("--repeats", type=int, default=9,
                      help="timed runs per figure (median reported)")
  args = parser.parse_args()
  lengths = [int(x) for x in args.lengths.split(",")]
  impls = [x.strip() for x in args.impls.split(",") if x.strip()]

  print(common.machine_line())
  print(f"MultiHeadAttention self-attention: d_model {args.d_model}, "
        f"{args.num_heads} heads, {args.mask} mask, "
        + (f"{args.tokens} tokens per call" if args.tokens
           else f"batch {args.batch}") + f"; median of {args.repeats} runs")
  results = {}
  for length in lengths:
    batch = max(1, args.tokens // length) if args.tokens else args.batch
    runs = [prepare(impl, batch, length, args) for impl in impls]
    time_round_robin(runs, args.repeats)
    for impl, run in zip(impls, runs):
      results[impl, length] = (batch, run)

  rows = []
  for impl in impls:
    previous = None
    for length in lengths:
      batch, r = results[impl, length]
      ratio_t = f"{r['both'] / previous['both']:.2f}" if previous else "-"
      ratio_m = f"{r['peak'] / previous['peak']:.2f}" if previous else "-"
      rows.append([
          impl, length, batch, f"{r['forward'] * 1e3:.2f}",
          f"{r['both'] * 1e3:.2f}", ratio_t,
          common.fmt_si(r["flops"] / r["both"], "FLOP/s"),
          common.fmt_bytes(r["peak"]), common.fmt_bytes(r["temp"]), ratio_m])
      previous = r
  print(common.table(
      ["impl", "L", "B", "fwd ms", "fwd+bwd ms", "x prev L", "achieved",
       "peak memory", "of which temp", "mem x prev L"], rows))
  if len(impls) == 2:
    a, b = impls
    ratios = []
    for length in lengths:
      ra, rb = results[a, length][1], results[b, length][1]
      ratios.append(f"L={length}: {rb['both'] / ra['both']:.2f} / "
                    f"{rb['peak'] / ra['peak']:.2f}")
    print(f"\n{b} / {a} (fwd+bwd time / peak memory): " + ", ".join(ratios))
  print(f"load average {common.load_average():.2f} at the end")


if __name__ == "__main__":
  main()
