"""Position encodings (§3.5): sinusoids, or learned embeddings
(Table 3 row E)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mha import validation
from mha.model.params import StoredParams



def sinusoidal_encoding(length: int, d_model: int,
                        base: float = 10000.0) -> np.ndarray:
  """PE(pos, 2i) = sin(pos / base^(2i/d_model)), PE(pos, 2i+1) = cos(same).

  The paper's base is 10000 (one of the project's source notes says 1000).

  Args:
    length: number of positions, 0 .. length-1.
    d_model: encoding size (even or odd; an odd size drops the last cosine).
    base: the wavelength base.

  Returns:
    float32 `[length, d_model]`, sines in even columns and cosines in odd ones.
  """
  position = np.arange(length, dtype=np.float64)[:, None]  # [L, 1]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]  # [1, ceil(M/2)]
  angle = position / np.power(base, two_i / d_model)  # [L, ceil(M/2)]
  encoding = np.zeros((length, d_model), np.float64)
  encoding[:, 0::2] = np.sin(angle)
  encoding[:, 1::2] = np.cos(angle[:, : d_model // 2])
  return encoding.astype(np.float32)


class AddPositionEncoding(StoredParams, nn.Module):
  """Adds position encodings to embeddings `[B, L, d_model]`.

  Attributes:
    max_len: the largest number of positions.
    kind: `sinusoidal` (fixed, §3.5) or `learned` (a trained table, row E).
    decode: incremental decoding: each call is one position further, counted
      in the `cache` collection (`position_index`: one count for all rows,
      or `[B]`, one per row, if the cache is given so).
  """
  max_len: int
  kind: str = "sinusoidal"
  decode: bool = False

  @nn.compact
  def __call__(self, x: jax.Array,
               positions: jax.Array | None = None) -> jax.Array:
    """Adds PE(pos); `positions` `[B, L]` overrides 0..L-1 (packed rows)."""
    validation.check_field("position_encoding", self.kind)
    length, d_model = x.shape[1], x.shape[2]
    if self.kind == "learned":
      table = self.param("embedding", nn.initializers.normal(stddev=0.02),
                         (self.max_len, d_model))
    else:
      table = jnp.asarray(sinusoidal_encoding(self.max_len, d_model))
    if self.decode:
      initialized = self.has_variable("cache", "position_index")
      index = self.variable("cache", "position_index",
                            lambda: jnp.array(0, jnp.int32))
      if initialized:
        if jnp.ndim(index.value):  # [B]: each row at its own position
          # (a search that refills finished rows, `mha.search.refill`)
          pe = jnp.take(table, index.value, axis=0, mode="clip")[:, None]
        else:
          pe = jax.lax.dynamic_slice_in_dim(table, index.value, 1)[None]
        index.value = index.value + 1
        return x + pe.astype(x.dtype)
    if positions is None:
      if length > self.max_len:
        raise ValueError(f"Sequence length {length} exceeds max_len "
                         f"{self.max_len}; raise config.max_len.")
      pe = table[None, :length]  # [1, L, M]
    else:
      pe = jnp.take(table, positions, axis=0)  # [B, L, M]
    return x + pe.astype(x.dtype)
