"""Translation data: sources, the shared vocabulary and batches.

    from mha import data
    tok = data.get_tokenizer(config, workdir)
    sources, targets = data.load_text_pairs(config, config.eval_split)
    for batch in data.train_batches(config, tok, start_step=step): ...
    batches = data.eval_batches(config, tok, config.eval_split)

Modules: `sources` (which dataset a config names), `parallel_text` (the TFDS
builder of local text folders), `synthetic` (the made-up language pair),
`tokenizer` (SentencePiece), `tokenized` (encoded splits and their cache),
`batching` (token-budget and packed batch plans), `pipeline` (the batch
iterators).
"""
from mha.data.pipeline import eval_batches
from mha.data.pipeline import train_batches
from mha.data.sources import load_text_pairs
from mha.data.tokenizer import get_tokenizer
from mha.data.tokenizer import Tokenizer
from mha.errors import DataError
from mha.token_ids import EOS_ID
from mha.token_ids import PAD_ID

__all__ = [
    "DataError", "EOS_ID", "PAD_ID", "Tokenizer", "eval_batches",
    "get_tokenizer", "load_text_pairs", "train_batches",
]
