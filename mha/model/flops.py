"""Matmul FLOPs of one training step of the Transformer.

Model FLOPs per step are counted analytically from the padded shapes (every
matrix product, 2 FLOPs per multiply-add; the backward pass costs twice the
forward, hence the factor 3). For B rows, source length S, target length T,
N_s = B·S and N_t = B·T padded tokens, d = d_model, f = d_ff, h heads of
key size d_k and value size d_v, L_e / L_d layers and vocabulary V:

    forward = 2·N_s·L_e·(2·d·h·d_k + 2·d·h·d_v + 2·d·f)   encoder Q K V O, FFN
            + 2·N_t·L_d·(3·d·h·d_k + 3·d·h·d_v + 2·d·f)   decoder self Q K V
                                                          O, cross Q O, FFN
            + 2·N_s·L_d·(d·h·d_k + d·h·d_v)               cross K, V
            + 2·N_t·d·V                                   output logits
            + 2·B·h·(d_k + d_v)·(L_e·S² + L_d·(T² + T·S)) QKᵀ and AV
    FLOPs/step = 3 · forward

i.e. 6·(non-embedding parameters)·tokens plus the vocabulary projection and
the attention products, each ×3. The embedding lookup is a gather (0 FLOPs);
softmax, layer norm, the FFN's activation (`ffn_activation`), the biases
(`attention_bias`, `output_bias`: additions), the loss and Adam are not
counted (as in MFU conventions), so those options leave the count as it
is. `cpu_model` names the CPU a figure was measured on.
"""
import platform

from mha.model.transformer import TransformerConfig


def training_flops(cfg: TransformerConfig, rows: int, source_len: int,
                   target_len: int) -> float:
  """FLOPs of one training step (forward + backward) on `rows` padded rows
  of `source_len` source and `target_len` target positions (module docstring).
  """
  d, f, h, v = cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.vocab_size
  d_k = cfg.d_k or d // h
  d_v = cfg.d_v or d // h
  n_s, n_t = rows * source_len, rows * target_len
  le, ld = cfg.num_encoder_layers, cfg.num_decoder_layers
  forward = (2 * n_s * le * (2 * d * h * d_k + 2 * d * h * d_v + 2 * d * f)
             + 2 * n_t * ld * (3 * d * h * d_k + 3 * d * h * d_v + 2 * d * f)
             + 2 * n_s * ld * (d * h * d_k + d * h * d_v)
             + 2 * n_t * d * v
             + 2 * rows * h * (d_k + d_v) * (
                 le * source_len ** 2
                 + ld * (target_len ** 2 + target_len * source_len)))
  return 3.0 * forward


def cpu_model() -> str:
  """The CPU's model name (from /proc/cpuinfo), or the platform's."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"
