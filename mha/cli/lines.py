"""mha-translate's lines: a trained model's `Translator` over a stream of
text lines, each output written as soon as its line is translated.

    function = lines.line_translator(translator, nbest=4)
    lines.translate_stream(function, lines.read_batches(0, 64), write)

`line_translator` turns lines into output text (translations, n-best lines
or samples), `read_batches` takes the lines already typed or piped without
waiting for more, `WarmedUp` prepares the searches of short lines while the
first line is typed, and `translate_stream` writes each batch's output.
"""
import codecs
import os
import select
import threading
from typing import Any, Callable, Iterator, Sequence

from absl import logging

from mha import data
from mha.errors import ConfigError
from mha.runtime import files
from mha.search import texts as translate
from mha.translator import Hypothesis
from mha.translator import Translator

# The n-best entry of a blank source line, which is not translated: the
# empty translation, as `Translator.translate` gives it, with scores 0.
BLANK_HYPOTHESIS = Hypothesis("", 0.0, 0.0)

# What `line_translator` returns: (lines, position of the first in the whole
# input) -> the output text of those lines, each output line ending with a
# newline.
LineFunction = Callable[[list[str], int], str]


def format_nbest(line_number: int, hypotheses: Sequence[Hypothesis]) -> str:
  """The n-best lines of one source line, each ending with a newline (the
  last one too).

  One line per hypothesis, best first, tab-separated: the source's line
  number (1 = the first), the rank (1 = the best), the length-penalised
  score, log P(Y | X), the translation (last: it may hold tabs), each line
  ending with a newline. (`line_translator` gives a blank source line n
  empty hypotheses, `BLANK_HYPOTHESIS`.)
  """
  return "".join(f"{line_number}\t{rank}\t{h.score:.6f}\t{h.log_prob:.6f}"
                 f"\t{h.text}\n" for rank, h in enumerate(hypotheses, 1))


def line_translator(translator: Translator, *, nbest: int = 0,
                    sample: bool = False, temperature: float = 1.0,
                    top_k: int = 0, seed: int = 0,
                    batch_size: int | None = None,
                    **search: Any) -> LineFunction:
  """The function that turns input lines into output lines.

  Beam search (`Translator.translate`) by default, a translation per line
  (a blank line for a blank line); `nbest=n`: the n best of each line in
  `format_nbest`'s format (for a blank line, n lines of `BLANK_HYPOTHESIS`:
  its number, ranks 1..n, scores 0, an empty translation); `sample`: one
  sample of each line, the line's position in the whole input choosing its
  key (so the samples do not depend on how the input was cut into batches).
  `search`: the search's settings (`Translator.translate`'s; sampling
  takes max_decode_extra alone).

  Raises:
    ConfigError: sampling and n-best together, or a bad setting (checked
      now, on an empty input).
  """
  if sample and nbest:
    raise ConfigError("Sampling gives one output per line: give n-best or "
                      "sampling, not both.")
  if sample:
    beam = sorted(k for k, v in search.items()
                  if v is not None and k != "max_decode_extra")
    if beam:
      raise ConfigError(f"{', '.join(beam)}: beam search settings; sampling "
                        "takes temperature, top_k, seed and "
                        "max_decode_extra.")
    options = dict(temperature=temperature, top_k=top_k, seed=seed,
                   max_decode_extra=search.get("max_decode_extra"),
                   batch_size=batch_size)
    translator.sample([], **options)
    return lambda lines, first: _lines(translator.sample(
        lines, first_id=first, **options))
  search["batch_size"] = batch_size
  if nbest:
    translator.nbest([], nbest, **search)
    blank = [BLANK_HYPOTHESIS] * nbest
    return lambda lines, first: "".join(
        format_nbest(first + i + 1,
                     blank if translate.is_blank(line) else hyps)
        for i, (line, hyps) in enumerate(
            zip(lines, translator.nbest(lines, nbest, **search))))
  translator.translate([], **search)
  return lambda lines, first: _lines(translator.translate(lines, **search))


# The source buckets (`translate.LENGTH_BUCKETS`, EOS included) of the
# searches `WarmedUp` prepares: a typed sentence of up to 23 pieces.
WARM_UP_BUCKETS = (8, 16, 24)


def warm_up_line(tokenizer: data.Tokenizer, bucket: int) -> str | None:
  """A line of repeated words whose ids (with EOS) fall in `bucket`, the
  longest such line; None if the vocabulary gives none."""
  found = None
  for count in range(1, bucket):
    line = " ".join(["a"] * count)
    length = len(tokenizer.encode(line)) + 1
    if length > bucket:
      break
    if translate.bucket_length(length, bucket) == bucket:
      found = line
  return found


class WarmedUp:
  """A `LineFunction` whose searches for one line of each bucket of
  `buckets` (up to the model's `max_len`) are prepared in a thread of
  their own from the moment it is made.

  For a line-by-line session at a terminal (`mha-translate`): the search
  is traced and compiled (or loaded from the compilation cache) per batch
  shape on its first call, seconds that would come after the first line;
  here they pass while it is typed. The first call stops the warm-up after
  the bucket in progress and waits for it (so that no shape is compiled
  twice at once), then translates. The warm-up's outputs are dropped; a
  failure there is only logged (the same call fails again, in the open, on
  a real line).
  """

  def __init__(self, function: LineFunction, tokenizer: data.Tokenizer,
               max_len: int, buckets: Sequence[int] = WARM_UP_BUCKETS):
    self._function = function
    buckets = [b for b in buckets if b <= max_len]
    self._lines = [line for line in (warm_up_line(tokenizer, b)
                                     for b in buckets) if line is not None]
    self._stop = threading.Event()
    logging.info("Preparing the search for typed lines (source buckets %s) "
                 "while the first line is typed.",
                 ", ".join(str(b) for b in buckets))
    self._thread = threading.Thread(target=self._warm, name="mha-warm-up")
    self._thread.start()

  def _warm(self) -> None:
    for line in self._lines:
      if self._stop.is_set():
        return
      try:
        self._function([line], 0)
      except Exception as e:  # pylint: disable=broad-except
        logging.info("Warm-up of the search failed (%s).", e)

  def wait(self) -> None:
    """Returns once the warm-up has prepared every bucket (or stopped)."""
    self._thread.join()

  def __call__(self, lines: list[str], first: int) -> str:
    self._stop.set()
    self._thread.join()
    return self._function(lines, first)


def _lines(texts: Sequence[str]) -> str:
  return "".join(text + "\n" for text in texts)


def read_batches(fd: int, max_lines: int, what: str = "standard input"
                 ) -> Iterator[list[str]]:
  """The lines of a file descriptor in batches, without waiting for more.

  Each batch holds the complete lines that have arrived (at least one, at
  most `max_lines`): the reader waits for the first, then takes only what
  can be read without blocking. A last line without a newline counts; line
  endings ('\n', '\r\n') and a byte order mark at the start are dropped.

  Raises:
    DataError: a line that is not valid UTF-8, naming `what` and the line.
  """
  pending, lines, number, eof = b"", [], 0, False

  def take(chunk: bytes) -> None:
    nonlocal pending
    pending += chunk
    *complete, pending = pending.split(b"\n")
    lines.extend(complete)

  while lines or not eof:
    while not lines and not eof:
      chunk = os.read(fd, 1 << 16)  # waits for input
      eof = not chunk
      take(chunk)
    while (not eof and len(lines) < max_lines
           and select.select([fd], [], [], 0)[0]):
      chunk = os.read(fd, 1 << 16)  # ready: does not wait
      eof = not chunk
      take(chunk)
    if eof and pending:
      lines.append(pending)
      pending = b""
    batch, lines = lines[:max_lines], lines[max_lines:]
    if batch:
      yield [_decode_line(raw, number + i + 1, what)
             for i, raw in enumerate(batch)]
      number += len(batch)


def _decode_line(raw: bytes, number: int, what: str) -> str:
  if number == 1 and raw.startswith(codecs.BOM_UTF8):
    raw = raw[len(codecs.BOM_UTF8):]
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise data.DataError(f"{what}, line {number}: invalid UTF-8 ({e.reason} "
                         f"at byte {e.start} of the line).") from None
  if "\0" in text:
    raise data.DataError(f"{what}, line {number}: {files.NUL_BYTE}")
  return text[:-1] if text.endswith("\r") else text


def translate_stream(function: LineFunction, batches: Iterator[list[str]],
                     write: Callable[[str], None]) -> int:
  """Translates each batch as it comes and writes its outputs at once.

  Args:
    function: a `line_translator`.
    batches: lists of input lines (`read_batches`).
    write: called with each batch's output text; it should flush.

  Returns:
    The number of input lines.
  """
  count = 0
  for lines in batches:
    write(function(lines, count))
    count += len(lines)
  return count
