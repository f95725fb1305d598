r"""CTranslate2 in a process of its own, as its users run it.

    python bench/ct2_process.py steady --model_dir=D --pieces_file=P.json \
        --beam_sizes=1,4 --alpha=0.6 --max_decode_extra=50 --batch_size=64 \
        --inter_threads=1 --intra_threads=2 --repeats=2
    python bench/ct2_process.py end_to_end --model_dir=D --source_file=S \
        --output=O --beam_sizes=4 ...

bench/decode.py starts this file as a subprocess and waits for it: it
imports neither JAX nor mha, and no JAX computation runs beside it. Each
search is one `translate_batch` call over the whole job (the sentences
sorted by length and cut into batches of `--batch_size` by CTranslate2
itself, `max_batch_size`), the beam size, α (CTranslate2's length penalty,
|Y|^α), no minimum length, and one length limit for the call: the longest
source (with its EOS) + `--max_decode_extra` tokens (mha's limit is per
sentence). `--inter_threads` translators of `--intra_threads` threads each
(two translators take the call's batches side by side).

* `steady`: `--pieces_file` holds the sources as SentencePiece pieces (a
  JSON list of lists, without EOS: CTranslate2 adds it). The model is
  loaded, then for each beam size one untimed call (the warm-up), then
  `--repeats` timed calls. Prints one JSON object on standard output:
  `load_seconds`, and per beam size its `warmup_seconds`, `times` and the
  last call's `outputs` (pieces, EOS included).
* `end_to_end`: what a user's script does, for one beam size: reads
  `--source_file` (one sentence a line), encodes it with the export's
  `spm.model` (each source cut to the model's `max_len` - 1 pieces, as
  mha cuts it; `mha_export.json`), loads the model, translates, decodes and
  writes `--output`, one translation a line. Prints its own seconds
  (`import`, `load`, `translate`) as JSON; the caller times the process from
  its start to its exit.
"""
import argparse
import json
import os
import sys
import time

_STARTED = time.perf_counter()

# pylint: disable=g-import-not-at-top,wrong-import-position
import ctranslate2
import sentencepiece as spm
# pylint: enable=g-import-not-at-top,wrong-import-position

_IMPORTED = time.perf_counter()


def translate_job(translator: ctranslate2.Translator,
                  sources: list[list[str]], *, beam_size: int, alpha: float,
                  max_decode_extra: int, batch_size: int,
                  return_end_token: bool) -> list[list[str]]:
  """The best hypothesis (pieces) of each source, in input order, from one
  `translate_batch` call over the whole job."""
  results = translator.translate_batch(
      sources, max_batch_size=batch_size, beam_size=beam_size,
      length_penalty=alpha,
      max_decoding_length=max(map(len, sources)) + 1 + max_decode_extra,
      min_decoding_length=0, max_input_length=0,
      return_end_token=return_end_token)
  return [r.hypotheses[0] for r in results]


def _translator(args: argparse.Namespace) -> ctranslate2.Translator:
  return ctranslate2.Translator(
      args.model_dir, device="cpu", inter_threads=args.inter_threads,
      intra_threads=args.intra_threads)


def _search(args: argparse.Namespace, beam_size: int) -> dict[str, float]:
  return dict(beam_size=beam_size, alpha=args.alpha,
              max_decode_extra=args.max_decode_extra,
              batch_size=args.batch_size)


def steady(args: argparse.Namespace) -> dict:
  """The model loaded once; per beam size a warm-up call, then timed
  calls."""
  with open(args.pieces_file, encoding="utf-8") as f:
    sources = json.load(f)
  start = time.perf_counter()
  translator = _translator(args)
  report = {"load_seconds": time.perf_counter() - start, "searches": {}}
  for beam_size in args.beam_sizes:
    search = _search(args, beam_size)
    start = time.perf_counter()
    translate_job(translator, sources, **search, return_end_token=True)
    warmup = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      outputs = translate_job(translator, sources, **search,
                              return_end_token=True)
      times.append(time.perf_counter() - start)
    report["searches"][str(beam_size)] = {
        "warmup_seconds": warmup, "times": times, "outputs": outputs}
  return report


def end_to_end(args: argparse.Namespace) -> dict:
  """Text in, text out, the model loaded first: one beam size."""
  if len(args.beam_sizes) != 1:
    sys.exit("bench/ct2_process.py: end_to_end takes one --beam_sizes.")
  with open(os.path.join(args.model_dir, "mha_export.json"),
            encoding="utf-8") as f:
    max_len = json.load(f)["max_len"]
  tokenizer = spm.SentencePieceProcessor(
      model_file=os.path.join(args.model_dir, "spm.model"))
  with open(args.source_file, encoding="utf-8") as f:
    lines = f.read().splitlines()
  sources = [pieces[:max_len - 1]
             for pieces in tokenizer.encode(lines, out_type=str)]
  start = time.perf_counter()
  translator = _translator(args)
  loaded = time.perf_counter()
  outputs = translate_job(translator, sources,
                          **_search(args, args.beam_sizes[0]),
                          return_end_token=False)
  with open(args.output, "w", encoding="utf-8") as f:
    f.writelines(tokenizer.decode_pieces(out) + "\n" for out in outputs)
  return {"import_seconds": _IMPORTED - _STARTED,
          "load_seconds": loaded - start,
          "translate_seconds": time.perf_counter() - loaded}


def make_parser() -> argparse.ArgumentParser:
  """The flags of both modes."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("mode", choices=("steady", "end_to_end"))
  parser.add_argument("--model_dir", required=True,
                      help="a CTranslate2 export (mha.export)")
  parser.add_argument("--pieces_file", help="steady: the sources' pieces")
  parser.add_argument("--source_file", help="end_to_end: the sources")
  parser.add_argument("--output", help="end_to_end: the translations")
  parser.add_argument("--beam_sizes", required=True,
                      type=lambda s: [int(b) for b in s.split(",")])
  parser.add_argument("--alpha", type=float, required=True)
  parser.add_argument("--max_decode_extra", type=int, required=True)
  parser.add_argument("--batch_size", type=int, required=True)
  parser.add_argument("--inter_threads", type=int, default=1)
  parser.add_argument("--intra_threads", type=int, default=1)
  parser.add_argument("--repeats", type=int, default=2)
  return parser


def main() -> None:
  args = make_parser().parse_args()
  report = steady(args) if args.mode == "steady" else end_to_end(args)
  json.dump(report, sys.stdout)
  print(flush=True)


if __name__ == "__main__":
  main()
