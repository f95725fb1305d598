"""What the compiled search of `mha.search.texts` does inside its loop: loop
invariants stay out of it (the optimized HLO of a tiny search, not timings)."""
import re

import numpy as np
import pytest

from mha.search import batches as batch_search
from mha.search.settings import SearchSettings

from test_decoding import EOS
from test_decoding import tiny_transformer  # noqa: F401  pylint: disable=unused-import


def _computations(hlo: str) -> dict[str, str]:
  """Computation name -> its body text, from optimized HLO text."""
  found = {}
  for m in re.finditer(r"^(?:ENTRY )?%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}$", hlo,
                       re.M | re.S):
    found[m.group(1)] = m.group(2)
  return found


def _in_loops(hlo: str) -> str:
  """The text of every computation a while loop's body runs (its body and,
  transitively, the fusions and branches it calls)."""
  comps = _computations(hlo)
  todo = [name for body in comps.values()
          for name in re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)", body)]
  seen = set()
  while todo:
    name = todo.pop()
    if name in seen or name not in comps:
      continue
    seen.add(name)
    todo += re.findall(r"%([\w.\-]+)", " ".join(
        re.findall(r"(?:calls|body|condition|to_apply|branch_computations|"
                   r"true_computation|false_computation)=\{?([^}\s]+(?:, "
                   r"%[\w.\-]+)*)", comps[name])))
  return "\n".join(comps[name] for name in seen)


@pytest.mark.parametrize("beam", [1, 2])
def test_source_keys_and_values_are_not_transposed_in_the_loop(
    tiny_transformer, beam):  # noqa: F811
  """The encoder-decoder keys and values ([b, S, h, d]) ride in the search's
  cache in the layout of the attention products ([b, h, d, S]): no step
  transposes them (it did, every step, when they rode as the decoder makes
  them)."""
  model_config, _, params, inputs = tiny_transformer
  batch, length = inputs.shape
  heads = model_config.num_heads
  head = model_config.d_model // heads
  fn = batch_search.translate_fn(model_config, SearchSettings(beam_size=beam),
                                 EOS)
  static, devices, rows = batch_search._search_inputs(  # pylint: disable=protected-access
      model_config, inputs, max_decode_extra=4, max_decode_len=None,
      first_stage_extra=batch_search.FIRST_STAGE_EXTRA, devices=(),
      extra_rows=())
  hlo = fn.lower(params, *rows, devices=devices, num_best=0,
                 **static).compile().as_text()
  loops = _in_loops(hlo)
  assert "dot(" in loops  # the decoder's step is in there
  stored = f"f32[{batch},{heads},{head},{length}]"
  transposes = [line for line in loops.split("\n")
                if " transpose(" in line and f"= {stored}" in line]
  assert not transposes, transposes[:2]
  # The search's outputs are unchanged by the layout (test_decoding.py checks
  # them against the full forward pass); here only that they are outputs.
  assert np.asarray(fn(params, *rows, devices=devices, num_best=0,
                       **static)).shape[0] == batch
