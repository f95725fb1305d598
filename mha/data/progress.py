"""Progress lines of the long data steps: what, how many of how many, rate.

At WMT size, preparing a text folder, training the vocabulary and
tokenizing take minutes each. A `Progress` counts what a step has done
(`add`) and logs one line (absl logging, as the rest of the trainer) at
most every `every` seconds:

    Tokenizing /data de-en train: 1,234,567 of 4,500,000 pairs (27%),
    41,152 pairs/s, 30 s.

Inside `with progress:` a daemon thread also logs while the step's own
thread is busy in a library that counts nothing (TFDS writing its files,
SentencePiece training), so a line comes at least every `every` seconds
(plus up to `_POLL_SECONDS`) for the whole step. The clock is injected
(`clock`), so that tests need not wait.
"""
import threading
import time
from typing import Callable

from absl import logging

# The trainer's promise: a line at least every 30 s during a long step.
EVERY_SECONDS = 25.0
# How often the thread of `with progress:` looks at the clock.
_POLL_SECONDS = 1.0


def _duration(seconds: float) -> str:
  """'45 s', '2 min 5 s', '1 h 3 min'."""
  seconds = int(seconds)
  if seconds < 60:
    return f"{seconds} s"
  minutes, seconds = divmod(seconds, 60)
  if minutes < 60:
    return f"{minutes} min {seconds} s"
  return f"{minutes // 60} h {minutes % 60} min"


class Progress:
  """Counts a step's work and logs it at most every `every` seconds.

  The constructor also takes `every`, the seconds between lines (default
  `EVERY_SECONDS`), `clock`, the time in seconds (injected by tests), and
  `poll`, the seconds between two looks of `with`'s thread at the clock.

  Attributes:
    what: the step, e.g. 'Tokenizing wmt14 en-de train'.
    total: how many the step will do, or None if unknown.
    unit: what is counted, plural ('pairs', 'sentences').
    count: how many are done.
  """

  def __init__(self, what: str, total: int | None = None,
               unit: str = "pairs", every: float | None = None,
               clock: Callable[[], float] = time.monotonic,
               poll: float = _POLL_SECONDS):
    self.what = what
    self.total = total
    self.unit = unit
    self.count = 0
    self._every = EVERY_SECONDS if every is None else every
    self._clock = clock
    self._poll = poll
    self._start = self._last = clock()
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread = None

  def add(self, count: int) -> None:
    """`count` more done; logs a line if `every` seconds passed."""
    self.count += count
    self.tick()

  def tick(self) -> None:
    """Logs a line if `every` seconds passed since the last one."""
    with self._lock:
      now = self._clock()
      if now - self._last < self._every:
        return
      self._last = now
    logging.info("%s", self.line(now))

  def elapsed(self) -> float:
    """Seconds since the step began."""
    return self._clock() - self._start

  def line(self, now: float | None = None) -> str:
    """The progress line at time `now` (default: the clock's now)."""
    elapsed = (self._clock() if now is None else now) - self._start
    done = f"{self.count:,}"
    if self.total is not None:
      share = self.count / self.total if self.total else 1.0
      done += f" of {self.total:,} {self.unit} ({share:.0%})"
    else:
      done += f" {self.unit}"
    rate = self.count / elapsed if elapsed > 0 else 0.0
    return (f"{self.what}: {done}, {rate:,.0f} {self.unit}/s, "
            f"{_duration(elapsed)}.")

  def __enter__(self) -> "Progress":
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name=f"progress: {self.what}")
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stop.set()
    self._thread.join()

  def _watch(self) -> None:
    while not self._stop.wait(self._poll):
      self.tick()
