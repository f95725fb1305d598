"""Search and translation, in three layers from the top down.

Modules: `texts` (text -> ids -> length-bucketed batches -> search -> text:
the one translation path of every caller), `batches` (one batch through
the Transformer's search on this process's devices: the device runner)
over `model_cache` (the Transformer's step function and decode cache as
the search takes them), `decoding` (the paper's search algorithms: greedy,
beam and n-best, sampling, forced decoding, the step hook, over a step
function and its cache; it imports no model), its speed-ups, none of
which changes an output: `refill` (rows refilled as sentences end),
`stages` (outputs and cache grown in stages; a batch shrunk to its
sentences not done), `fast_top_k` (the best tokens of the raw logits),
`cache_rows` (what the rows of a cache leaf are; rows kept in place), and
`common` (what they all share); `settings` (`SearchSettings`, the search's
settings as one object), `hooks` (the step hooks the settings build),
`trace_cache` (traced searches kept on disk).
"""
