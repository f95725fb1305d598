"""Sentences to flat token ids, on one core or on every core of the host.

A split is encoded chunk by chunk (`encode_chunk`: each side's sentences
to one flat array, EOS after each, and their lengths). `chunk_encoder`
gives the function that encodes a stream of chunks in order: on one
process, or on a pool of `processes` worker processes, each chunk encoded
by the same `encode_chunk` in a worker and the results taken back in the
chunks' order, so that both give the same arrays, bit for bit.

How the workers get the vocabulary: a SentencePiece processor cannot be
pickled or shared between processes, so each worker builds its own, once,
from the vocabulary's files (`tok.files`: spm.model, or a separate
vocabulary's source.spm, target.spm and vocab.json), which the parent
writes to a temporary folder whose name the pool's initializer gets
(not the bytes themselves: a worker that dies at its start would leave
the parent blocked writing more than a pipe holds); the chunks' texts go
to the workers and their ids come back through the pool's pipes.

The workers are started with 'spawn' (a fork of a process where JAX or
TensorFlow runs threads may deadlock); each imports this module's light
dependencies (NumPy, SentencePiece) and, as 'spawn' does, the main
script: a script that tokenizes on several processes keeps its code under
`if __name__ == "__main__":` (else its workers stop, and `chunk_encoder`
raises). At most `2 * processes` chunks are in flight, so the memory of a
WMT-sized split is not read ahead.
"""
import collections
from concurrent import futures
from concurrent.futures import process
import contextlib
import functools
import itertools
import multiprocessing
import os
import signal
import tempfile
from typing import Callable, Iterable, Iterator

import numpy as np

from mha.data.token_ids import EOS_ID
from mha.errors import DataError
from mha.data import tokenizer
from mha.data.tokenizer import SOURCE
from mha.data.tokenizer import TARGET
from mha.data.tokenizer import Tokenizer

Chunk = tuple[list[str], list[str]]
# (flat ids, lengths with EOS) of each side of a chunk.
Encoded = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
ChunkEncoder = Callable[[Iterable[Chunk]], Iterator[Encoded]]

_WORKER_STOPPED = (
    "Each of the {processes} tokenization processes "
    "(config.tokenize_processes) imports the main script: its code must run "
    "under `if __name__ == '__main__':`; or set "
    "config.tokenize_processes=1.")
# Chunks in flight per worker: one being encoded, one waiting.
_IN_FLIGHT = 2


def host_cores() -> int:
  """The cores this process may run on (its CPU affinity)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def encode_texts(tok: Tokenizer, texts: list[str], dtype, side: str
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Flat ids with an EOS after each text, and the lengths (EOS included);
  `side` SOURCE or TARGET (a separate vocabulary's model)."""
  ids = tok.encode_batch(texts, side=side)
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
  return (encode_texts(tok, sources, dtype, SOURCE),
          encode_texts(tok, targets, dtype, TARGET))


# The worker's tokenizer, made once by `_start_worker`.
_worker_tokenizer: Tokenizer | None = None


def _start_worker(folder: str) -> None:
  global _worker_tokenizer
  # A Ctrl-C at a terminal reaches the whole process group: the parent
  # stops the pool, the workers print no traceback of their own.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  contents = {}
  for name in os.listdir(folder):
    with open(os.path.join(folder, name), "rb") as f:
      contents[name] = f.read()
  _worker_tokenizer = tokenizer.from_files(contents, folder)
  # One worker a core: SentencePiece's own threads would only contend.
  _worker_tokenizer.threads = 1


def _encode_in_worker(chunk: Chunk, dtype) -> Encoded:
  return encode_chunk(_worker_tokenizer, chunk, dtype)


def _in_order(submit: Callable, function: Callable[[Chunk], Encoded],
              chunks: Iterable[Chunk], in_flight: int) -> Iterator[Encoded]:
  """`function` of each chunk through `submit` (an executor's), in order,
  `in_flight` at most submitted and not yet taken (`Executor.map` would
  read every chunk ahead)."""
  pending = collections.deque()
  for chunk in chunks:
    pending.append(submit(function, chunk))
    if len(pending) >= in_flight:
      yield pending.popleft().result()
  while pending:
    yield pending.popleft().result()


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

  Raises:
    DataError: a worker died (a script without `if __name__ ==
      "__main__":`, which each worker imports, or out of memory).
  """
  if processes == 1:
    yield lambda chunks: (encode_chunk(tok, c, dtype) for c in chunks)
    return
  if getattr(multiprocessing.current_process(), "_inheriting", False):
    # A worker importing a main script that tokenizes (multiprocessing's
    # own check of it, `spawn._check_not_importing_main`): stopped here
    # with the message, before a pool of its own would wait forever.
    raise DataError(_WORKER_STOPPED.format(processes=processes))
  with tempfile.TemporaryDirectory(prefix="mha_tokenize_") as folder:
    for name, contents in tok.files.items():
      with open(os.path.join(folder, name), "wb") as f:
        f.write(contents)
    with _pool(processes, folder) as pool:
      function = functools.partial(_encode_in_worker, dtype=dtype)
      yield lambda chunks: _in_order(pool.submit, function, chunks,
                                     _IN_FLIGHT * processes)


@contextlib.contextmanager
def _pool(processes: int, folder: str
          ) -> Iterator[futures.ProcessPoolExecutor]:
  """`processes` workers that load the vocabulary in `folder`, shut down on
  leaving (the chunks being encoded finish, the others are cancelled)."""
  pool = futures.ProcessPoolExecutor(
      processes, mp_context=multiprocessing.get_context("spawn"),
      initializer=_start_worker, initargs=(folder,))
  try:
    yield pool
  except process.BrokenProcessPool as e:
    raise DataError(f"A tokenization worker stopped ({e}). "
                    + _WORKER_STOPPED.format(processes=processes)) from None
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
