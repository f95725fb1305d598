"""mha's parameters ↔ a Hugging Face `MarianMTModel` state dict (numpy).

Both directions are pure numpy, exact and need neither torch nor
transformers: `params_to_marian` (the export) and `marian_to_params` (an
import), inverse to each other bit for bit. `check_representable` refuses
the variants Marian has no layer for, naming the config field.

How mha's Transformer (`mha.model.transformer`) maps onto Marian's
(`transformers.models.marian.modeling_marian`):

* **Positions.** Both add the same sinusoids, laid out differently: ours
  interleave them (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos, §3.5), Marian's
  put the sines in the first half of the vector and the cosines in the
  second. Marian's model coordinate j is ours `model_permutation(M)[j]`
  (the even coordinates, then the odd ones). The whole model is written in
  that order: the embedding columns, the inputs of every projection that
  reads the model's vector (queries, keys, values, the FFN's W_1), the
  outputs of every projection that writes it (W^O, the FFN's W_2) and the
  layer norms' scale and bias (whose mean and variance do not depend on
  the order). Marian's model is then ours with its coordinates renamed:
  the same numbers, computed in another order, and its own sinusoids are
  exactly ours permuted (tests/test_huggingface.py shows both).
* **Attention.** Marian's q/k/v/out projections are `nn.Linear` with
  biases, `[h·d_k, M]` (heads major); ours have none (§3.2.2): the biases
  are written as zeros. Its scale is 1/√(M/h): only scaled dot-product
  attention with d_k = d_v = M/h maps.
* **Embeddings.** ×√d_model (`scale_embedding`); shared source, target and
  pre-softmax matrix (§3.4: `model.shared.weight`, `final_logits_bias` all
  zeros), or, with `share_embeddings=False`, separate encoder and decoder
  matrices and an untied `lm_head` whose bias is `final_logits_bias`.
* **Norms.** Post-LN, LayerNorm(x + Sublayer(x)) with no final norm, in
  both. Marian's `nn.LayerNorm` adds ε = 1e-5 to the variance, flax 1e-6:
  the one difference that is not exact (docs/evaluation.md measures it).
"""
from typing import Any

import numpy as np

from mha.errors import ExportError
from mha.model.transformer import TransformerConfig

# Marian's `nn.LayerNorm` default, which its config cannot change.
MARIAN_LAYER_NORM_EPSILON = 1e-5

# Marian's names of one attention layer's projections, by ours.
PROJECTIONS = (("query", "q_proj"), ("key", "k_proj"),
                ("value", "v_proj"))
# mha's residual blocks of a layer -> Marian's layer norm after them.
_ENCODER_NORMS = (("attention_block", "self_attn_layer_norm"),
                  ("ffn_block", "final_layer_norm"))
_DECODER_NORMS = (("self_attention_block", "self_attn_layer_norm"),
                  ("cross_attention_block", "encoder_attn_layer_norm"),
                  ("ffn_block", "final_layer_norm"))
_DECODER_ATTENTION = (("self_attention", "self_attn"),
                      ("cross_attention", "encoder_attn"))


def check_representable(model_config: TransformerConfig) -> None:
  """Refuses what `MarianMTModel` cannot compute.

  Raises:
    ExportError: one line naming the config field at fault.
  """
  cfg = model_config
  head = cfg.d_model // cfg.num_heads
  problems = (
      (cfg.layer_norm != "post", "layer_norm", cfg.layer_norm,
       "Marian's layers are post-LN ('post')"),
      (cfg.attention_type != "scaled_dot", "attention_type",
       cfg.attention_type, "Marian has scaled dot-product attention only "
       "('scaled_dot')"),
      (cfg.position_encoding != "sinusoidal", "position_encoding",
       cfg.position_encoding, "Marian adds fixed sinusoids ('sinusoidal')"),
      (cfg.d_model % cfg.num_heads != 0, "num_heads", cfg.num_heads,
       f"Marian's heads split d_model={cfg.d_model} evenly"),
      (cfg.d_k not in (None, head), "d_k", cfg.d_k,
       f"Marian's heads have d_k = d_model / num_heads = {head}"),
      (cfg.d_v not in (None, head), "d_v", cfg.d_v,
       f"Marian's heads have d_v = d_model / num_heads = {head}"),
  )
  for refused, field, value, why in problems:
    if refused:
      raise ExportError(
          f"config.{field}={value!r} cannot be exported to Hugging Face "
          f"Marian: {why}.")


def model_permutation(d_model: int) -> np.ndarray:
  """Marian's model coordinate j is ours `[j]`: the even coordinates (our
  sines), then the odd ones (our cosines)."""
  return np.concatenate([np.arange(0, d_model, 2),
                         np.arange(1, d_model, 2)])


def _f32(x: Any) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x, np.float32))


class _Layout:
  """The permutation `p` and its inverse, applied to one axis of a tensor
  (`to_marian`: take our coordinates in Marian's order; `to_mha`: back)."""

  def __init__(self, d_model: int):
    self.p = model_permutation(d_model)
    self.inverse = np.argsort(self.p)

  def to_marian(self, x: Any, axis: int) -> np.ndarray:
    return _f32(np.take(np.asarray(x), self.p, axis=axis))

  def to_mha(self, x: Any, axis: int) -> np.ndarray:
    return _f32(np.take(np.asarray(x), self.inverse, axis=axis))


# ---------------------------------------------------------- mha -> Marian


def _attention_to_marian(layout: _Layout, p: dict, prefix: str,
                         out: dict[str, np.ndarray]) -> None:
  """q/k/v: our `[M, h, d]` as Marian's `[h·d, M]` (input permuted); out:
  our `[h, d_v, M]` as `[M, h·d_v]` (output permuted); the biases of
  `config.attention_bias` (`[h, d]` as `[h·d]`; out's permuted), else
  zeros."""
  for ours, theirs in PROJECTIONS:
    kernel = np.asarray(p[f"{ours}_kernel"])
    kernel = kernel.reshape(kernel.shape[0], -1)  # [M, h·d]
    out[f"{prefix}.{theirs}.weight"] = layout.to_marian(kernel, 0).T.copy()
    bias = p.get(f"{ours}_bias")
    out[f"{prefix}.{theirs}.bias"] = (
        np.zeros(kernel.shape[1], np.float32) if bias is None
        else _f32(np.asarray(bias).reshape(-1)))
  w_out = np.asarray(p["out_kernel"])
  w_out = w_out.reshape(-1, w_out.shape[-1])  # [h·d_v, M]
  out[f"{prefix}.out_proj.weight"] = layout.to_marian(w_out, 1).T.copy()
  out[f"{prefix}.out_proj.bias"] = (
      np.zeros(w_out.shape[1], np.float32) if "out_bias" not in p
      else layout.to_marian(p["out_bias"], 0))


def _ffn_to_marian(layout: _Layout, p: dict, prefix: str,
                   out: dict[str, np.ndarray]) -> None:
  """fc1 = W_1 (input permuted), fc2 = W_2 (output and bias permuted)."""
  out[f"{prefix}.fc1.weight"] = layout.to_marian(p["w1"]["kernel"], 0).T.copy()
  out[f"{prefix}.fc1.bias"] = _f32(p["w1"]["bias"])
  out[f"{prefix}.fc2.weight"] = layout.to_marian(p["w2"]["kernel"], 1).T.copy()
  out[f"{prefix}.fc2.bias"] = layout.to_marian(p["w2"]["bias"], 0)


def _norms_to_marian(layout: _Layout, p: dict, names, prefix: str,
                     out: dict[str, np.ndarray]) -> None:
  for ours, theirs in names:
    norm = p[ours]["layer_norm"]
    out[f"{prefix}.{theirs}.weight"] = layout.to_marian(norm["scale"], 0)
    out[f"{prefix}.{theirs}.bias"] = layout.to_marian(norm["bias"], 0)


def params_to_marian(model_config: TransformerConfig,
                     params: dict) -> dict[str, np.ndarray]:
  """The `MarianMTModel` state dict of a model (float32, C order).

  The keys are those `MarianMTModel.save_pretrained` writes: no position
  tables (Marian makes its own), no tied copies of `model.shared.weight`.

  Args:
    model_config: the model's config (`check_representable` passes).
    params: its `params` collection, as arrays.

  Returns:
    Marian's name -> tensor.

  Raises:
    ExportError: a variant Marian cannot represent.
  """
  check_representable(model_config)
  layout = _Layout(model_config.d_model)
  out: dict[str, np.ndarray] = {}
  source = layout.to_marian(params["source_embed"]["embedding"], 1)
  vocab_size = source.shape[0]
  if model_config.share_embeddings:
    out["model.shared.weight"] = source
    out["final_logits_bias"] = (  # config.output_bias's, else zeros
        _f32(params["output_bias"])[None] if "output_bias" in params
        else np.zeros((1, vocab_size), np.float32))
  else:
    out["model.encoder.embed_tokens.weight"] = source
    out["model.decoder.embed_tokens.weight"] = layout.to_marian(
        params["target_embed"]["embedding"], 1)
    projection = params["output_projection"]
    out["lm_head.weight"] = layout.to_marian(projection["kernel"], 0).T.copy()
    out["final_logits_bias"] = _f32(projection["bias"])[None]
  for i in range(model_config.num_encoder_layers):
    p, prefix = params[f"encoder_layers_{i}"], f"model.encoder.layers.{i}"
    _attention_to_marian(layout, p["self_attention"], f"{prefix}.self_attn",
                         out)
    _ffn_to_marian(layout, p["ffn"], prefix, out)
    _norms_to_marian(layout, p, _ENCODER_NORMS, prefix, out)
  for i in range(model_config.num_decoder_layers):
    p, prefix = params[f"decoder_layers_{i}"], f"model.decoder.layers.{i}"
    for ours, theirs in _DECODER_ATTENTION:
      _attention_to_marian(layout, p[ours], f"{prefix}.{theirs}", out)
    _ffn_to_marian(layout, p["ffn"], prefix, out)
    _norms_to_marian(layout, p, _DECODER_NORMS, prefix, out)
  return out


# ---------------------------------------------------------- Marian -> mha


def _attention_to_mha(layout: _Layout, state: dict, prefix: str,
                      num_heads: int, extras: dict[str, np.ndarray]) -> dict:
  """Our attention kernels from Marian's; its biases go to `extras`, in
  our coordinates (out_proj's bias is a model vector)."""
  p = {}
  for ours, theirs in PROJECTIONS:
    weight = np.asarray(state[f"{prefix}.{theirs}.weight"])  # [h·d, M]
    kernel = layout.to_mha(weight.T, 0)  # [M, h·d]
    p[f"{ours}_kernel"] = kernel.reshape(kernel.shape[0], num_heads, -1)
    extras[f"{prefix}.{theirs}.bias"] = _f32(state[f"{prefix}.{theirs}.bias"])
  w_out = layout.to_mha(np.asarray(state[f"{prefix}.out_proj.weight"]).T, 1)
  p["out_kernel"] = w_out.reshape(num_heads, -1, w_out.shape[-1])
  extras[f"{prefix}.out_proj.bias"] = layout.to_mha(
      state[f"{prefix}.out_proj.bias"], 0)
  return p


def _ffn_to_mha(layout: _Layout, state: dict, prefix: str) -> dict:
  return {
      "w1": {"kernel": layout.to_mha(np.asarray(
                 state[f"{prefix}.fc1.weight"]).T, 0),
             "bias": _f32(state[f"{prefix}.fc1.bias"])},
      "w2": {"kernel": layout.to_mha(np.asarray(
                 state[f"{prefix}.fc2.weight"]).T, 1),
             "bias": layout.to_mha(state[f"{prefix}.fc2.bias"], 0)}}


def _norms_to_mha(layout: _Layout, state: dict, names, prefix: str,
                  p: dict) -> None:
  for ours, theirs in names:
    p[ours] = {"layer_norm": {
        "scale": layout.to_mha(state[f"{prefix}.{theirs}.weight"], 0),
        "bias": layout.to_mha(state[f"{prefix}.{theirs}.bias"], 0)}}


def _embeddings_to_mha(model_config: TransformerConfig, layout: _Layout,
                       state: dict, params: dict,
                       extras: dict[str, np.ndarray]) -> None:
  """Embeddings and the pre-softmax map; a shared model's
  `final_logits_bias` (which mha's shared model lacks) goes to `extras`."""
  bias = _f32(state["final_logits_bias"]).reshape(-1)
  if model_config.share_embeddings:
    params["source_embed"] = {
        "embedding": layout.to_mha(state["model.shared.weight"], 1)}
    extras["final_logits_bias"] = bias
    return
  params["source_embed"] = {"embedding": layout.to_mha(
      state["model.encoder.embed_tokens.weight"], 1)}
  params["target_embed"] = {"embedding": layout.to_mha(
      state["model.decoder.embed_tokens.weight"], 1)}
  params["output_projection"] = {
      "kernel": layout.to_mha(np.asarray(state["lm_head.weight"]).T, 0),
      "bias": bias}


def marian_to_params(model_config: TransformerConfig, state: dict
                     ) -> tuple[dict, dict[str, np.ndarray]]:
  """mha's parameters of a `MarianMTModel` state dict: the inverse of
  `params_to_marian`.

  Args:
    model_config: the mha model the state dict is read into (its sizes,
      `num_heads` and `share_embeddings`; `check_representable` passes).
    state: Marian's name -> tensor (numpy arrays, e.g. read by
      `safetensors.numpy.load_file`), with the keys `params_to_marian`
      writes.

  Returns:
    (params, extras): the `params` collection of mha's model, and the
    tensors of Marian's that mha's model has no parameter for, by Marian's
    name, in mha's coordinates: every attention bias and, with shared
    embeddings, `final_logits_bias` (`[V]`). All zero for a model exported
    by mha; an import must use or refuse the non-zero ones.

  Raises:
    ExportError: a variant Marian cannot represent.
    KeyError: a tensor missing from `state`.
  """
  check_representable(model_config)
  layout = _Layout(model_config.d_model)
  params: dict = {}
  extras: dict[str, np.ndarray] = {}
  _embeddings_to_mha(model_config, layout, state, params, extras)
  heads = model_config.num_heads
  for i in range(model_config.num_encoder_layers):
    prefix = f"model.encoder.layers.{i}"
    p = {"self_attention": _attention_to_mha(
        layout, state, f"{prefix}.self_attn", heads, extras),
         "ffn": _ffn_to_mha(layout, state, prefix)}
    _norms_to_mha(layout, state, _ENCODER_NORMS, prefix, p)
    params[f"encoder_layers_{i}"] = p
  for i in range(model_config.num_decoder_layers):
    prefix = f"model.decoder.layers.{i}"
    p = {ours: _attention_to_mha(layout, state, f"{prefix}.{theirs}", heads,
                                 extras)
         for ours, theirs in _DECODER_ATTENTION}
    p["ffn"] = _ffn_to_mha(layout, state, prefix)
    _norms_to_mha(layout, state, _DECODER_NORMS, prefix, p)
    params[f"decoder_layers_{i}"] = p
  return params, extras
