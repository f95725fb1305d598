"""The BLEU the paper reports: tokenized, with compound splitting.

The paper's 27.3 / 28.4 (Table 2, newstest2014 en→de) were scored by
tensor2tensor's `get_ende_bleu.sh`, not by sacreBLEU. The script treats the
two sides differently:

* the translations (detokenized) are
  1. passed through Moses' `replace-unicode-punctuation.perl` (full-width
     and typographic punctuation to ASCII: “ ” to ", … to ...),
  2. tokenized by Moses' `tokenizer.perl -l <lang>` (punctuation split off,
     `&` escaped to `&amp;` as the script does by default), and
  3. compound-split: every `-` between two non-space characters becomes
     ` ##AT##-##AT## ` (`perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`),
     so a hyphenated compound counts as three tokens;
* the reference is an already tokenized file (`newstest2014.tok.de`, made
  by the WMT preparation scripts with `tokenizer.perl -l de` alone, no
  punctuation replacement) and is only compound-split (step 3).

Both are then scored by Moses' `multi-bleu.perl`: case-sensitive corpus BLEU
on the whitespace tokens, no smoothing. A raw reference is therefore
tokenized here as that file was (step 2 without step 1); a reference that is
already tokenized (`references_tokenized=True`) is only split. So typographic
quotes in the reference stay as they are while the translations' become
ASCII, as in the script.

Steps 2-3 give more, shorter tokens than sacreBLEU's 13a tokenizer on
detokenized text, and the split compounds are easy matches, so this score
reads higher than sacreBLEU on the same translations (on tensor2tensor's own
base checkpoint about 1.5 BLEU, tensor2tensor issue 317). Quote sacreBLEU
(with its signature) to compare with other work; use this score only to
compare with the paper's Table 2.

The Moses scripts are reproduced by `sacremoses`; the BLEU itself is
sacreBLEU's, on the already-tokenized text (tokenize='none'), with
multi-bleu's settings.
"""
import re
from typing import Sequence

import sacrebleu

from mha.scoring.corpus import Corpus
from mha.scoring.corpus import Score

# perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': matches do not overlap, so
# in "a-b-c" only the first hyphen is split, exactly as in Perl.
_COMPOUND = re.compile(r"(\S)-(\S)")
SIGNATURE = ("hyp:replace-unicode-punct+moses-tok(lang:{lang})|ref:{ref}"
             "|compound-split(##AT##)+multi-bleu(case:mixed|smooth:none)")


def compound_split(line: str) -> str:
  """`rich-text` -> `rich ##AT##-##AT## text`, as get_ende_bleu.sh does."""
  return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenize(lines: Sequence[str], lang: str,
             replace_punctuation: bool = True) -> list[str]:
  """Steps 1-3 above (the translations' side), or 2-3 without
  `replace_punctuation` (a raw reference): the text multi-bleu.perl scores,
  one line per input."""
  # Imported here: sacremoses compiles its rules at import (about 0.4 s),
  # which every command that imports the evaluator would pay otherwise.
  from sacremoses import MosesPunctNormalizer  # pylint: disable=import-outside-toplevel
  from sacremoses import MosesTokenizer  # pylint: disable=import-outside-toplevel
  normalizer = MosesPunctNormalizer(lang)
  tokenizer = MosesTokenizer(lang)
  if replace_punctuation:
    lines = [normalizer.replace_unicode_punct(line) for line in lines]
  return [compound_split(tokenizer.tokenize(line, return_str=True,
                                            escape=True))
          for line in lines]


def bleu_paper(corpus: Corpus) -> Score:
  """The paper's BLEU of a corpus, its `lang` needed: a metric of
  `mha.scoring.metric_table` (`paper_bleu` says how).

  Returns:
    The score in [0, 100] and `bleu_paper_signature`.

  Raises:
    ValueError: the corpus has no `lang`.
  """
  if corpus.lang is None:
    raise ValueError("The paper's BLEU needs the target language "
                     "(Corpus.lang): Moses' rules differ by language.")
  bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none",
                                force=True)
  if corpus.references_tokenized:
    reference_tokens = [compound_split(line) for line in corpus.references]
  else:
    reference_tokens = tokenize(corpus.references, corpus.lang,
                                replace_punctuation=False)
  score = bleu.corpus_score(tokenize(corpus.hypotheses, corpus.lang),
                            [reference_tokens])
  return Score(float(score.score), {
      "bleu_paper_signature": SIGNATURE.format(
          lang=corpus.lang,
          ref="tokenized" if corpus.references_tokenized
          else f"moses-tok(lang:{corpus.lang})")})


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str],
               lang: str, references_tokenized: bool = False
               ) -> dict[str, float | str]:
  """Tokenized, compound-split BLEU of detokenized `hypotheses`, the
  reference treated as get_ende_bleu.sh treats it (module docstring).

  Args:
    hypotheses: the system's translations, detokenized, one per sentence.
    references: the reference translations: raw text (tokenized here by
      Moses' tokenizer, without punctuation replacement), or already
      tokenized with `references_tokenized` (only compound-split).
    lang: the target language's code (Moses' tokenizer rules differ by
      language; `de` for the paper's en→de).
    references_tokenized: the references are Moses-tokenized already (as
      the script's `newstest2014.tok.de`).

  Returns:
    `{'bleu_paper': score in [0, 100], 'bleu_paper_signature': str}`.

  Raises:
    ValueError: when the lists have different lengths.
  """
  value, fields = bleu_paper(Corpus(hypotheses, references, lang,
                                    references_tokenized))
  return {"bleu_paper": value, **fields}
