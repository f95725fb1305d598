r"""BLEU of transformers' greedy and beam outputs of an exported workdir,
beside mha's own on the same sentences.

    python scripts/huggingface_bleu.py --workdir=/tmp/m30k \
        --sources=data/multi30k/test_2016_flickr.de.gz \
        --references=data/multi30k/test_2016_flickr.en.gz

Exports the workdir's checkpoint (`--step`, default the latest) as
`mha-export --format=huggingface` does (into a temporary folder), loads it with transformers'
`MarianMTModel` and `MarianTokenizer`, and translates the sources with
`generate`: greedy (`num_beams=1`) and beam search (the workdir's beam size,
its α as transformers' `length_penalty`, `early_stopping="never"`, as the
export's generation config has them), each sentence with mha's length limit
(its pieces + EOS + `max_decode_extra`, at most `max_len`; the sentences of
one limit in batches of `--batch_size`, as `max_length` holds for a whole
call). mha (`mha.load`) translates the same sentences with the same
settings. Prints, for each search, sacreBLEU of both engines against the
references and how many of the outputs are the same text.

Needs the `[hf]` extra and torch (requirements-dev.txt has both on Python
3.11, Linux x86_64). docs/evaluation.md says why beam outputs may differ
(transformers' length penalty is |Y|^α, not GNMT's).
"""
import argparse
import gzip
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
import mha
from mha.huggingface import export as hf_export
from mha.scoring import bleu as bleu_lib
from mha.scoring.corpus import Corpus


def read_lines(path: str, limit: int | None) -> list[str]:
  """The lines of a text file (gzip if it ends in .gz), the first `limit`."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f]
  return lines[:limit] if limit else lines


def limits(translator: mha.Translator, sources: list[str]) -> list[int]:
  """mha's limit on each output: the source's pieces + EOS +
  `max_decode_extra`, at most the model's `max_len`."""
  extra = translator.defaults.max_decode_extra
  max_len = translator.model_config.max_len
  return [min(len(translator.tokenizer.encode(s)) + 1 + extra, max_len)
          for s in sources]


def hf_translate(folder: str, sources: list[str], lengths: list[int],
                 batch_size: int, **settings) -> list[str]:
  """transformers' translation of each source, the sentences of one length
  limit in batches (its `max_length` counts the start token: limit + 1)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
  model = transformers.MarianMTModel.from_pretrained(folder).eval()
  outputs: list[str] = [""] * len(sources)
  for limit in sorted(set(lengths)):
    rows = [i for i, n in enumerate(lengths) if n == limit]
    for start in range(0, len(rows), batch_size):
      chunk = rows[start:start + batch_size]
      batch = tokenizer([sources[i] for i in chunk], return_tensors="pt",
                        padding=True)
      with torch.no_grad():
        ids = model.generate(**batch, max_length=limit + 1, do_sample=False,
                             **settings)
      for i, text in zip(chunk, tokenizer.batch_decode(
          ids, skip_special_tokens=True)):
        outputs[i] = text
  return outputs


def compare(workdir: str, sources: list[str], references: list[str],
            batch_size: int, step: int | None = None) -> list[dict]:
  """One row per search (greedy, beam) of checkpoint `step` (None: the
  latest): both engines' BLEU and the outputs they share."""
  translator = mha.load(workdir, step=step)
  beam, alpha = translator.defaults.beam_size, translator.defaults.alpha
  lengths = limits(translator, sources)
  rows = []
  with tempfile.TemporaryDirectory(prefix="mha_hf_bleu_") as tmp:
    folder = os.path.join(tmp, "model")
    hf_export.export_model(workdir, folder, step=translator.step)
    for name, beam_size in (("greedy", 1), (f"beam {beam}", beam)):
      ours = translator.translate(sources, beam_size=beam_size)
      settings = dict(num_beams=beam_size)
      if beam_size > 1:
        settings.update(length_penalty=alpha, early_stopping="never")
      theirs = hf_translate(folder, sources, lengths, batch_size, **settings)
      rows.append(dict(
          search=name,
          mha=bleu_lib.bleu(Corpus(ours, references)).value,
          transformers=bleu_lib.bleu(Corpus(theirs, references)).value,
          same=sum(a == b for a, b in zip(ours, theirs)),
          sentences=len(sources)))
  return rows


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--sources", required=True)
  parser.add_argument("--references", required=True)
  parser.add_argument("--num_sentences", type=int, default=None,
                      help="the first N lines (default: all)")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--step", type=int, default=None,
                      help="the checkpoint (default: the latest)")
  args = parser.parse_args(argv)
  sources = read_lines(args.sources, args.num_sentences)
  references = read_lines(args.references, args.num_sentences)
  if len(sources) != len(references):
    sys.exit(f"{args.sources} has {len(sources)} lines, {args.references} "
             f"{len(references)}: not a pair.")
  rows = compare(args.workdir, sources, references, args.batch_size,
                 args.step)
  print("| search | mha BLEU | transformers BLEU | same outputs |")
  print("| --- | --: | --: | --: |")
  for row in rows:
    print(f"| {row['search']} | {row['mha']:.2f} | "
          f"{row['transformers']:.2f} | {row['same']} / {row['sentences']} |")


if __name__ == "__main__":
  main()
