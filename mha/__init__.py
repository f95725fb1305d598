"""mha: the Transformer of "Attention Is All You Need" in JAX/Flax."""
from mha.attention import additive_attention
from mha.attention import dot_product_attention
from mha.attention import masked_softmax
from mha.attention import MultiHeadAttention
from mha.attention import scaled_dot_product_attention
from mha.losses import accuracy
from mha.losses import cross_entropy_with_label_smoothing
from mha.losses import negative_log_likelihood
from mha.optim import create_optimizer
from mha.optim import noam_schedule
from mha.positional import AddPositionEncoding
from mha.positional import sinusoidal_encoding
from mha.transformer import create_model
from mha.transformer import Transformer
from mha.transformer import TransformerConfig

__all__ = [
    "AddPositionEncoding", "MultiHeadAttention", "Transformer",
    "TransformerConfig", "accuracy", "additive_attention", "create_model",
    "create_optimizer", "cross_entropy_with_label_smoothing",
    "dot_product_attention", "masked_softmax", "negative_log_likelihood",
    "noam_schedule", "scaled_dot_product_attention", "sinusoidal_encoding",
]
