"""The project's commands: mha-train, mha-eval, mha-translate, mha-export,
mha-import.

Each module parses its flags and calls one library function; the preamble
they share (huge pages, quiet library logs, the compilation cache,
`--traceback` and bad input as one line) is `mha.cli.startup`. Each runs as
its console script (`pyproject.toml`), as `python -m mha.cli.<name>`, and
train and eval as the repository's `train.py` and `eval.py`.
"""
