"""What the rows of a search's cache leaves are (`CacheRows`), and the
rows a beam search's hypotheses keep in place (a speed-up of
`mha.search.decoding`'s beam search: only copies move cache rows).

Cache leaves: the caller says what the rows of each leaf are, with
`cache_rows`, a pytree of the cache's structure whose leaves are `CacheRows`
(the model side knows its cache; `mha.search.model_cache.cache_rows` says
it for the Transformer). Rows are ordered `[batch, beam]`: sentence b's
hypotheses are in rows `b * beam_size` to `(b + 1) * beam_size - 1`, in an
order of the search's own (rows in place, below).

* `CacheRows.SHARED`: one value for all rows (a position index): never
  repeated or gathered; every hypothesis is at the same position.
* `CacheRows.HYPOTHESIS`: a leading row axis of `batch_size * beam_size`, or
  of `batch_size` (then repeated for each beam); a row holds its
  hypothesis's state, copied to the rows of its new children when the beam
  moves on.
* `CacheRows.SENTENCE`: the same leading axis, but equal across the beams of
  a sentence (computed from the source alone): repeated per beam, never
  copied, since a hypothesis never moves to another sentence.
* `CacheRows.ONE_PER_SENTENCE`: a leading axis of `batch_size`, kept so:
  never repeated nor gathered. The step function reads row b for the
  hypotheses of sentence b (rows `b * beam_size` to `(b + 1) * beam_size -
  1`): the Transformer's encoder-decoder keys and values, stored and read
  once per sentence.

Without `cache_rows`, 0-d leaves are `SHARED` and every other leaf is
`HYPOTHESIS`.

Rows in place: a beam search's hypotheses keep their cache rows. When the
beam moves on, a new hypothesis takes over its parent's row if it is the
parent's first child, and its parent's row is copied into a row left free
(a hypothesis without children) otherwise; the step function reads the
rows in that order (`_follow_parents`). Its results for a row must
therefore depend on that row (and its sentence) alone, not on where the
row is among its sentence's rows. Only the copies move cache rows, about a
third of them a step in the Transformer's search, where a reorder of every
row by its parent moved them all (bench/README.md, issue 33).
"""

from __future__ import annotations

import enum

import jax
from jax import lax
import jax.numpy as jnp

from mha.search.common import PyTree, _pad_axis, _take


class CacheRows(enum.Enum):
  """What the rows of a cache leaf are (module docstring)."""
  SHARED = 'shared'
  HYPOTHESIS = 'hypothesis'
  SENTENCE = 'sentence'
  ONE_PER_SENTENCE = 'one_per_sentence'


def _row_kinds(cache: PyTree, cache_rows: PyTree | None) -> PyTree:
  """`cache_rows`, or the default: 0-d leaves SHARED, others HYPOTHESIS."""
  if cache_rows is not None:
    return cache_rows
  return jax.tree.map(
      lambda x: CacheRows.SHARED if jnp.ndim(x) == 0 else CacheRows.HYPOTHESIS,
      cache)


def _expand_cache(cache: PyTree, cache_rows: PyTree, batch_size: int,
                  beam_size: int) -> PyTree:
  """Brings every per-hypothesis leaf to `batch_size * beam_size` rows."""
  num_rows = batch_size * beam_size

  def expand(path, kind: CacheRows, x):
    if kind is CacheRows.SHARED:
      return x
    if kind is CacheRows.ONE_PER_SENTENCE:
      if jnp.ndim(x) and x.shape[0] == batch_size:
        return x
      raise ValueError(
          f'Cache leaf {jax.tree_util.keystr(path)} ({kind.value} rows) has '
          f'shape {jnp.shape(x)}: expected a leading axis of batch_size = '
          f'{batch_size}.')
    if jnp.ndim(x) and x.shape[0] == num_rows:
      return x
    if jnp.ndim(x) and x.shape[0] == batch_size:
      return jnp.repeat(x, beam_size, axis=0)  # [batch * beam, ...]
    raise ValueError(
        f'Cache leaf {jax.tree_util.keystr(path)} ({kind.value} rows) has '
        f'shape {jnp.shape(x)}: expected a leading axis of batch_size * '
        f'beam_size = {num_rows} or batch_size = {batch_size} (or say '
        'CacheRows.SHARED for it in cache_rows).')

  return jax.tree_util.tree_map_with_path(expand, cache_rows, cache)


def _by_sentence(x: jax.Array, batch_size: int) -> jax.Array:
  """`[batch * n, ...]` rows as `[batch, n, ...]` (a reshape, no copy)."""
  return x.reshape((batch_size, x.shape[0] // batch_size) + x.shape[1:])


# Rows in place (module docstring): `rows[b, k]` (`[batch, beam]`) is the
# row, among sentence b's beam_size rows, that holds live hypothesis k's
# cache.


def _hypothesis_of_row(rows: jax.Array) -> jax.Array:
  """The inverse of `rows` (`[batch, beam]`, a permutation per sentence):
  the hypothesis whose cache row r holds."""
  beam = jnp.arange(rows.shape[1])
  return jnp.sum(jnp.where(rows[:, None, :] == beam[None, :, None],
                           beam[None, None, :], 0), axis=2)


def _row_tokens(beams) -> jax.Array:
  """The tokens fed to the step function, `[batch * beam, 1]`: each row's
  hypothesis's last token."""
  return _take(beams.last, _hypothesis_of_row(beams.rows)).reshape(-1, 1)


def _follow_parents(rows: jax.Array, parent: jax.Array, needed: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The rows of the new hypotheses (`[batch, beam]`), whose parents are
  `parent`, and the copies that give them their parents' caches.

  A parent's first child that needs its cache (`needed`: alive) takes over
  the parent's row; every other child takes a row no such child took, in
  order. Copies run from the parents' rows to the rows of the other
  children that need a cache; no row is both a copy's source and a
  destination.

  Returns:
    `(new rows, source rows, copy)`: int32, int32 and bool `[batch, beam]`;
    child k needs a copy from its source row to its new row where `copy`.
  """
  beam = jnp.arange(rows.shape[1])
  source = _take(rows, parent)  # [b, beam] the parents' rows
  sibling = parent[:, :, None] == parent[:, None, :]  # [b, k, j]
  earlier = beam[None, :] < beam[:, None]  # [k, j]: j before k
  keeps = needed & ~jnp.any(sibling & earlier & needed[:, None, :], axis=2)
  taken = jnp.any(keeps[:, :, None] & (source[:, :, None] == beam), axis=1)
  free_rank = jnp.cumsum(~taken, axis=1) - 1  # [b, r] among free rows
  other_rank = jnp.cumsum(~keeps, axis=1) - 1  # [b, k] among the others
  free_row = jnp.argmax(~taken[:, None, :] & (
      free_rank[:, None, :] == other_rank[:, :, None]), axis=2)
  new_rows = jnp.where(keeps, source, free_row).astype(jnp.int32)
  return new_rows, source, needed & ~keeps


# Copies of `_copy_rows` made at a time (a gather and an in-place scatter).
_COPY_CHUNK = 16


def _copy_rows(cache: PyTree, cache_rows: PyTree, source: jax.Array,
               dest: jax.Array, copy: jax.Array) -> PyTree:
  """The HYPOTHESIS leaves of `cache` with row `dest[i]` a copy of row
  `source[i]` where `copy[i]` (flat row indices `[n]`; no row both a
  source and a destination), `_COPY_CHUNK` copies at a time, in place."""
  n = copy.shape[0]
  size = -(-n // _COPY_CHUNK) * _COPY_CHUNK
  order = jnp.argsort(~copy, stable=True)  # the copies first
  source = _pad_axis(source[order], 0, size)
  dest = jnp.where(copy[order], dest[order], size + n)  # past the end: none
  dest = jnp.concatenate([dest, jnp.full((size - n,), size + n, dest.dtype)])

  def chunk(i, cache):
    at = i * _COPY_CHUNK
    src = lax.dynamic_slice_in_dim(source, at, _COPY_CHUNK)
    dst = lax.dynamic_slice_in_dim(dest, at, _COPY_CHUNK)
    return jax.tree.map(
        lambda kind, x: x.at[dst].set(x[src], mode='drop')
        if kind is CacheRows.HYPOTHESIS else x, cache_rows, cache)

  count = jnp.sum(copy)
  return lax.fori_loop(0, (count + _COPY_CHUNK - 1) // _COPY_CHUNK, chunk,
                       cache)


def _first_rows(batch_size: int, beam_size: int) -> jax.Array:
  """`rows` of a search that starts: hypothesis k in row k."""
  return jnp.tile(jnp.arange(beam_size, dtype=jnp.int32), (batch_size, 1))


def _move_rows(cache: PyTree, cache_rows: PyTree, rows: jax.Array,
               parent: jax.Array, needed: jax.Array
               ) -> tuple[jax.Array, PyTree]:
  """The new hypotheses' rows (`_follow_parents`) and the cache with the
  copies that give them their parents' rows."""
  new_rows, source, copy = _follow_parents(rows, parent, needed)
  batch_size, beam_size = rows.shape
  first = (jnp.arange(batch_size) * beam_size)[:, None]  # [b, 1]
  return new_rows, _copy_rows(cache, cache_rows,
                              (first + source).reshape(-1),
                              (first + new_rows).reshape(-1),
                              copy.reshape(-1))
