"""Sentences to flat token ids, on one core or on every core of the host.

A split is encoded chunk by chunk (`encode_chunk`: each side's sentences
to one flat array, EOS after each, and their lengths). `chunk_encoder`
gives the function that encodes a stream of chunks in order: on one
process, or on a pool of `processes` worker processes, each chunk encoded
by the same `encode_chunk` in a worker and the results taken back in the
chunks' order, so that both give the same arrays, bit for bit.

How the workers get the vocabulary: a SentencePiece processor cannot be
pickled or shared between processes, so each worker builds its own, once,
from the model's serialized bytes (`Tokenizer.model_proto`, a few hundred
KB) handed to the pool's initializer; the chunks' texts go to the workers
and their ids come back through the pool's pipes. The workers are started
with 'spawn' (a fork of a process where JAX or TensorFlow runs threads
may deadlock); each imports only this module's light dependencies (NumPy,
SentencePiece). At most `2 * processes` chunks are in flight, so the
memory of a WMT-sized split is not read ahead.
"""
import collections
import contextlib
import functools
import itertools
import multiprocessing
import os
from typing import Callable, Iterable, Iterator

import numpy as np

from mha.data.token_ids import EOS_ID
from mha.data.tokenizer import Tokenizer

Chunk = tuple[list[str], list[str]]
# (flat ids, lengths with EOS) of each side of a chunk.
Encoded = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
ChunkEncoder = Callable[[Iterable[Chunk]], Iterator[Encoded]]

# Chunks in flight per worker: one being encoded, one waiting.
_IN_FLIGHT = 2


def host_cores() -> int:
  """The cores this process may run on (its CPU affinity)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def encode_texts(tok: Tokenizer, texts: list[str], dtype
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Flat ids with an EOS after each text, and the lengths (EOS included)."""
  ids = tok.encode_batch(texts)
  lengths = np.fromiter((len(x) + 1 for x in ids), np.int64, len(ids))
  flat = np.full(int(lengths.sum()), EOS_ID, dtype=dtype)
  not_eos = np.ones(len(flat), dtype=bool)
  not_eos[np.cumsum(lengths) - 1] = False
  flat[not_eos] = np.fromiter(itertools.chain.from_iterable(ids), dtype,
                              int(not_eos.sum()))
  return flat, lengths


def encode_chunk(tok: Tokenizer, chunk: Chunk, dtype) -> Encoded:
  """Both sides of a chunk (`encode_texts`)."""
  sources, targets = chunk
  return encode_texts(tok, sources, dtype), encode_texts(tok, targets, dtype)


# The worker's tokenizer, made once by `_start_worker`.
_worker_tokenizer: Tokenizer | None = None


def _start_worker(model_proto: bytes) -> None:
  global _worker_tokenizer
  _worker_tokenizer = Tokenizer(model_proto)


def _encode_in_worker(chunk: Chunk, dtype) -> Encoded:
  return encode_chunk(_worker_tokenizer, chunk, dtype)


def _in_order(pool, function: Callable[[Chunk], Encoded],
              chunks: Iterable[Chunk], in_flight: int) -> Iterator[Encoded]:
  """`function` of each chunk on `pool`, in order, `in_flight` at most
  submitted and not yet taken (`Pool.imap` would read every chunk ahead)."""
  pending = collections.deque()
  for chunk in chunks:
    pending.append(pool.apply_async(function, (chunk,)))
    if len(pending) >= in_flight:
      yield pending.popleft().get()
  while pending:
    yield pending.popleft().get()


@contextlib.contextmanager
def chunk_encoder(tok: Tokenizer, dtype, processes: int
                  ) -> Iterator[ChunkEncoder]:
  """The function that encodes chunks in order, on `processes` processes.

  Args:
    tok: the vocabulary.
    dtype: the ids' NumPy dtype.
    processes: 1 encodes in this process; more start that many workers,
      stopped when the context ends.

  Yields:
    `encode(chunks)`: an iterator of each chunk's `encode_chunk`.
  """
  if processes == 1:
    yield lambda chunks: (encode_chunk(tok, c, dtype) for c in chunks)
    return
  context = multiprocessing.get_context("spawn")
  with context.Pool(processes, initializer=_start_worker,
                    initargs=(tok.model_proto,)) as pool:
    function = functools.partial(_encode_in_worker, dtype=dtype)
    yield lambda chunks: _in_order(pool, function, chunks,
                                   _IN_FLIGHT * processes)
