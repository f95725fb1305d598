"""Search and translation, in three layers from the top down.

Modules: `texts` (text -> ids -> length-bucketed batches -> search -> text:
the one translation path of every caller), `batches` (one batch through
the Transformer's search on this process's devices: the model's decode
cache and the device runner), `decoding` (the search algorithms: greedy,
beam and n-best, sampling, forced decoding, over a step function and its
cache; it imports no model), `settings` (`SearchSettings`, the search's
settings as one object), `trace_cache` (traced searches kept on disk).
"""
