"""The model: the paper's equations as `flax.linen` modules, and its training
objective.

Modules: `attention` (scaled dot-product, dot-product and additive
attention; `ATTENTION_VARIANTS`, the one table of attention variants;
`MultiHeadAttention`), `location` (location-aware and multi-resolution
attention, a variant of that table), `positional` (sinusoidal and learned
position encodings), `dropout` (the dropout masks, a keyed hash),
`transformer` (`TransformerConfig`, the encoder and decoder layers,
`Transformer`, `create_model`: the one place a model is built), `losses`
(label-smoothed cross entropy, accuracy), `optim` (`SCHEDULES`, the one
table of learning-rate schedules, the paper's noam among them, and Adam),
`flops` (a step's matmul FLOPs), `params` (parameters read without
tracing their initializers at every `apply`: `StoredParams`, and flax's
`Dense` and `LayerNorm` with it). Imports only the package's errors
and validation rules below it.
"""
