"""Attention maps of a translation, one panel per head (the paper's Figs. 3-5).

    from mha.evaluation import attention_maps
    weights = attention_maps.attention_weights(model_config, params,
                                               source_ids, target_ids, layer=-1)
    figure = attention_maps.plot_attention(
        weights["encoder_decoder"], query_labels, key_labels,
        title="Encoder-decoder attention, decoder layer 3 of 3",
        path="/tmp/cross.png")

`eval.py --plot_attention=N --plot_layer=L` calls `write_attention_maps`:
for each of the first N sentences it feeds the translation the evaluation
wrote (its ids, from the same search call: `translate.translate_with_ids`)
back teacher-forced and draws the weights of layer L (a Python index: 0 =
first, -1 = last) of

- `encoder_self`: encoder self-attention, source × source;
- `decoder_self`: decoder self-attention, output token × decoder input;
- `encoder_decoder`: encoder-decoder attention, output token × source.

Rows are queries, columns keys, each row a softmax over the keys (only real
tokens: padding is cropped; `</s>` is the source's EOS). A decoder position
reads the previous output token (`<s>`, the start symbol 0, at the first
position) and predicts the next one: its row is labelled with the token it
predicts, and decoder self-attention's columns with the token each position
reads: cell (i, i) pairs the token predicted at i with the one before it.

The weights are those the model sows (`MultiHeadAttention`, post-softmax,
before attention dropout) with `attention_impl='einsum'`; the figures are
drawn by matplotlib on its Agg canvas (no pyplot, no global state),
imported when the first figure is drawn: an evaluation without plots never
imports it.
"""
from __future__ import annotations

import functools
import math
import numbers
import os
from typing import Any, Sequence, TYPE_CHECKING

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from mha.search import texts as translate
from mha.data import tokenizer as tokenizer_lib
from mha.model.transformer import TransformerConfig
from mha.model.transformer import create_model

if TYPE_CHECKING:
  from matplotlib.figure import Figure

KINDS = ("encoder_self", "decoder_self", "encoder_decoder")
TITLES = {"encoder_self": "Encoder self-attention",
          "decoder_self": "Decoder self-attention",
          "encoder_decoder": "Encoder-decoder attention"}
# (query axis, key axis) of each kind.
AXIS_LABELS = {
    "encoder_self": ("query: source", "key: source"),
    "decoder_self": ("query: output token", "key: decoder input"),
    "encoder_decoder": ("query: output token", "key: source"),
}
START_PIECE = "<s>"  # the decoder's start symbol (id 0 after the shift)
EOS_PIECE = "</s>"
ATTENTION_DIR = "attention"


def resolve_layer(layer: int, num_encoder_layers: int,
                  num_decoder_layers: int, name: str = "layer"
                  ) -> tuple[int, int]:
  """`layer` as (encoder index, decoder index); negative: from the end.

  The maps of a layer come from both stacks, so `layer` must index both:
  -n..n-1 with n the smaller number of layers.

  Raises:
    ValueError: not an integer or out of range, naming `name` and both
      stacks' numbers of layers.
  """
  n = min(num_encoder_layers, num_decoder_layers)
  if (not isinstance(layer, numbers.Integral) or isinstance(layer, bool)
      or not -n <= layer < n):
    raise ValueError(
        f"{name}={layer} is out of range: the model has "
        f"{num_encoder_layers} encoder and {num_decoder_layers} decoder "
        f"layers (use 0..{n - 1}, or {-n}..-1 from the last).")
  return layer % num_encoder_layers, layer % num_decoder_layers


def crop_source(ids: Sequence[int]) -> np.ndarray:
  """The real source ids (> 0), EOS included."""
  ids = np.asarray(ids, np.int32).reshape(-1)
  return ids[ids > 0]


def crop_target(ids: Sequence[int]) -> np.ndarray:
  """Output ids up to and including the first EOS, padding dropped."""
  ids = np.asarray(ids, np.int32).reshape(-1)
  ids = ids[ids > 0]
  eos = np.flatnonzero(ids == tokenizer_lib.EOS_ID)
  return ids[:eos[0] + 1] if eos.size else ids


def attention_weights(model_config: TransformerConfig, params: Any,
                      source_ids: Sequence[int], target_ids: Sequence[int],
                      layer: int = -1) -> dict[str, np.ndarray]:
  """The attention weights of one sentence pair at one layer, cropped.

  Args:
    model_config: the model's `TransformerConfig`; evaluated with
      `attention_impl='einsum', deterministic=True, decode=False` (the only
      implementation with explicit weights).
    params: its parameters.
    source_ids: source ids (EOS included; padding, if any, is dropped).
    target_ids: the target, e.g. the model's own translation, teacher-forced:
      the decoder reads it shifted right behind the start symbol 0. Cropped
      with `crop_target` (at the first EOS).
    layer: encoder and decoder layer index, negative = from the end.

  Returns:
    float32 `[heads, queries, keys]` per kind: `encoder_self` `[H, S, S]`,
    `decoder_self` `[H, T, T]`, `encoder_decoder` `[H, T, S]`, with S / T the
    cropped source / target lengths.

  Raises:
    ValueError: `layer` out of range, an empty source or target, or one
      longer than the model's `max_len`.
  """
  cfg = model_config.replace(attention_impl="einsum", deterministic=True,
                             decode=False)
  enc, dec = resolve_layer(layer, cfg.num_encoder_layers,
                           cfg.num_decoder_layers)
  source = crop_source(source_ids)
  target = crop_target(target_ids)
  if not source.size or not target.size:
    raise ValueError("The source and the target need at least one token.")
  if max(source.size, target.size) > cfg.max_len:
    raise ValueError(f"{source.size} source and {target.size} target ids: "
                     f"the model has max_len={cfg.max_len} positions.")
  # Padded to bucket lengths (few compilations); padding is masked, so the
  # real rows and columns are those of the unpadded pair.
  padded = []
  for ids in (source, target):
    row = np.zeros((1, translate.bucket_length(ids.size, cfg.max_len)),
                   np.int32)
    row[0, :ids.size] = ids
    padded.append(row)
  sown = _weights_fn(cfg, enc, dec)(params, *padded)
  s, t = source.size, target.size
  crops = {"encoder_self": (s, s), "decoder_self": (t, t),
           "encoder_decoder": (t, s)}
  return {kind: np.asarray(sown[kind], np.float32)[0, :, :q, :k]
          for kind, (q, k) in crops.items()}


@functools.lru_cache(maxsize=16)
def _weights_fn(cfg: TransformerConfig, enc: int, dec: int):
  """A jitted map (params, source, target) -> the sown weights of a layer."""
  model = create_model(cfg)

  def weights(params, source, target):
    _, state = model.apply({"params": params}, source, target,
                           mutable=["intermediates"])
    sown = state["intermediates"]

    def get(module, name):
      (w,) = sown[module][name]["attention_weights"]
      return w.astype(jnp.float32)  # [B, H, Q, K]

    return {"encoder_self": get(f"encoder_layers_{enc}", "self_attention"),
            "decoder_self": get(f"decoder_layers_{dec}", "self_attention"),
            "encoder_decoder": get(f"decoder_layers_{dec}",
                                   "cross_attention")}

  return jax.jit(weights)


def pieces(tokenizer, ids: Sequence[int]) -> list[str]:
  """The SentencePiece piece of each id (`</s>` for EOS)."""
  return [EOS_PIECE if i == tokenizer_lib.EOS_ID else tokenizer.id_to_piece(i)
          for i in np.asarray(ids).reshape(-1).tolist()]


def axis_labels(tokenizer, source_ids: Sequence[int],
                target_ids: Sequence[int]) -> dict[str, tuple[list[str],
                                                             list[str]]]:
  """(query labels, key labels) of each kind, as described in the module."""
  source = pieces(tokenizer, crop_source(source_ids))
  outputs = pieces(tokenizer, crop_target(target_ids))
  decoder_inputs = [START_PIECE] + outputs[:-1]
  return {"encoder_self": (source, source),
          "decoder_self": (outputs, decoder_inputs),
          "encoder_decoder": (outputs, source)}


def _grid(num_heads: int) -> tuple[int, int]:
  """(rows, columns) of the panels: 2 a row up to 4 heads, then 4 a row up
  to 16, then a square."""
  if num_heads <= 4:
    cols = min(num_heads, 2)
  elif num_heads <= 16:
    cols = 4
  else:
    cols = math.ceil(math.sqrt(num_heads))
  return math.ceil(num_heads / cols), cols


def plot_attention(weights: np.ndarray, query_labels: Sequence[str],
                   key_labels: Sequence[str], *, title: str = "",
                   axis_names: tuple[str, str] = ("query", "key"),
                   path: str | os.PathLike[str] | None = None,
                   dpi: int = 100) -> Figure:
  """One heatmap panel per head of `weights` `[heads, queries, keys]`.

  Every panel shares one colour scale, 0 to 1 (a row of weights sums to 1),
  has a tick per token labelled with `query_labels` (rows) and `key_labels`
  (columns), and the title "head h" (1-based); `title` heads the figure.

  Args:
    weights: `[H, Q, K]` attention weights.
    query_labels: Q labels.
    key_labels: K labels.
    title: the figure's title (kind and layer).
    axis_names: (query axis, key axis) names.
    path: where to save the figure as PNG (None: not saved).
    dpi: resolution of the PNG.

  Returns:
    The matplotlib `Figure`: H panels (Axes with one image each) and a
    colour bar.
  """
  weights = np.asarray(weights, np.float32)
  if weights.ndim != 3:
    raise ValueError(f"weights must be [heads, queries, keys], got shape "
                     f"{weights.shape}.")
  num_heads, num_q, num_k = weights.shape
  if (len(query_labels), len(key_labels)) != (num_q, num_k):
    raise ValueError(f"{len(query_labels)} query and {len(key_labels)} key "
                     f"labels for weights of shape {weights.shape}.")
  figure, panels, font = _panels(num_heads, num_q, num_k, dpi)
  cols = _grid(num_heads)[1]
  image = None
  for h, ax in enumerate(panels):
    image = ax.imshow(weights[h], cmap="viridis", vmin=0.0, vmax=1.0,
                      interpolation="nearest", aspect="auto")  # [Q, K]
    ax.set_xticks(np.arange(num_k), labels=list(key_labels), rotation=90,
                  fontsize=font)
    ax.set_yticks(np.arange(num_q), labels=list(query_labels),
                  fontsize=font)
    ax.tick_params(length=0, pad=1)
    ax.set_title(f"head {h + 1}", fontsize=9)
    if h % cols == 0:
      ax.set_ylabel(axis_names[0], fontsize=8)
    if h >= num_heads - cols:
      ax.set_xlabel(axis_names[1], fontsize=8)
  if title:
    figure.suptitle(title, fontsize=10)
  colorbar = figure.colorbar(image, ax=panels, shrink=0.6, pad=0.01)
  colorbar.set_label("attention weight", fontsize=8)
  colorbar.ax.tick_params(labelsize=7)
  if path is not None:
    figure.savefig(os.fspath(path), format="png", dpi=dpi)
  return figure


def _panels(num_heads: int, num_q: int, num_k: int,
            dpi: int) -> tuple[Figure, list[Any], int]:
  """(figure on an Agg canvas, one Axes per head, tick font size)."""
  # matplotlib is imported here, at the first figure (module docstring).
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top,redefined-outer-name
  rows, cols = _grid(num_heads)
  # ~0.17 inch per token keeps 7-point labels apart for ~30-token sentences;
  # longer ones get 5-point labels and smaller cells.
  small = max(num_q, num_k) > 40
  cell = 0.12 if small else 0.17
  panel_w = max(2.2, cell * num_k + 1.2)
  panel_h = max(2.2, cell * num_q + 1.4)
  figure = Figure(figsize=(cols * panel_w + 0.8, rows * panel_h + 0.5),
                  dpi=dpi, layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots(rows, cols, squeeze=False)
  for ax in axes.flat[num_heads:]:
    figure.delaxes(ax)
  return figure, list(axes.flat[:num_heads]), 5 if small else 7


def figure_title(kind: str, layer: int, num_layers: int) -> str:
  side = "encoder" if kind == "encoder_self" else "decoder"
  return f"{TITLES[kind]}, {side} layer {layer + 1} of {num_layers}"


def sentence_figures(model_config: TransformerConfig, params: Any, tokenizer,
                     source_ids: Sequence[int], target_ids: Sequence[int], *,
                     layer: int = -1, prefix: str | None = None,
                     dpi: int = 100) -> dict[str, Figure]:
  """The three figures (`KINDS`) of one sentence pair at `layer`.

  With `prefix`, each is saved as `<prefix>_<kind>.png`.
  """
  weights = attention_weights(model_config, params, source_ids, target_ids,
                              layer)
  labels = axis_labels(tokenizer, source_ids, target_ids)
  encoder = model_config.num_encoder_layers
  decoder = model_config.num_decoder_layers
  enc, dec = resolve_layer(layer, encoder, decoder)
  figures = {}
  for kind in KINDS:
    index, num_layers = ((enc, encoder) if kind == "encoder_self"
                         else (dec, decoder))
    figures[kind] = plot_attention(
        weights[kind], *labels[kind],
        title=figure_title(kind, index, num_layers),
        axis_names=AXIS_LABELS[kind],
        path=None if prefix is None else f"{prefix}_{kind}.png", dpi=dpi)
  return figures


def write_attention_maps(model_config: TransformerConfig, params: Any,
                         tokenizer,
                         pairs: Sequence[tuple[Sequence[int], Sequence[int]]
                                         | None],
                         output_dir: str, *, layer: int = -1,
                         dpi: int = 100) -> list[str]:
  """Saves the three figures of each translated sentence.

  Writes `<output_dir>/sentence_<i>_<kind>.png`, i = 1, 2, ... the position
  of the pair in `pairs` (its line number in a source file).

  Args:
    model_config: the model's `TransformerConfig`.
    params: its parameters.
    tokenizer: the workdir's vocabulary.
    pairs: per sentence, (source ids, output ids) as the evaluation's search
      made them (`translate.Translations`' `source_ids`, `output_ids`): the
      maps show the translation that was written, with no second search.
      None for a blank source, which was not translated: no figures.
    output_dir: created if missing.
    layer: encoder and decoder layer index, negative = from the end.
    dpi: resolution of the PNGs.

  Returns:
    The paths written, sentence by sentence in `KINDS` order.
  """
  os.makedirs(output_dir, exist_ok=True)
  paths = []
  for i, pair in enumerate(pairs, start=1):
    if pair is None:
      logging.info("Sentence %d is blank (not translated): no attention "
                   "maps.", i)
      continue
    prefix = os.path.join(output_dir, f"sentence_{i}")
    sentence_figures(model_config, params, tokenizer, *pair, layer=layer,
                     prefix=prefix, dpi=dpi)
    paths.extend(f"{prefix}_{kind}.png" for kind in KINDS)
  return paths


def count_panels(figure: Figure) -> int:
  """Axes of `figure` that hold an image (the heads' panels)."""
  return sum(1 for ax in figure.axes if ax.images)


__all__ = ["ATTENTION_DIR", "KINDS", "attention_weights", "axis_labels",
           "count_panels", "crop_source", "crop_target", "pieces",
           "plot_attention", "resolve_layer", "sentence_figures",
           "write_attention_maps"]
