"""Attention maps (mha.evaluation.attention_maps, eval.py --plot_attention),
tiny model.

The workdir holds a freshly initialised tiny model (no training: the maps of
random weights are as good a test as any, and it takes seconds).
"""
import pathlib

import jax
import matplotlib.image
import numpy as np
import pytest

from configs import quickstart
from mha.evaluation import attention_maps
from mha.store import checkpoints
from mha import data
from mha.evaluation import evaluator
from mha.store import trained
from mha.search import texts as translate
from mha.store import workdir as workdir_lib
from mha.model.transformer import Transformer
from mha.model.transformer import TransformerConfig

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
  """config.json, spm.model and checkpoint 1 holding initial parameters."""
  path = tmp_path_factory.mktemp("attention_maps") / "run"
  path.mkdir()
  config = quickstart.get_config("tiny")  # 2 layers, d_model 32, 4 heads
  config.update(vocab_size=128, max_decode_extra=4)
  data.get_tokenizer(config, str(path))
  workdir_lib.write_config(config, str(path))
  ids = np.ones((1, 4), np.int32)
  params = jax.jit(Transformer(TransformerConfig.from_config(config)).init)(
      jax.random.key(0), ids, ids)["params"]
  manager = checkpoints.make_manager(str(path), 1)
  checkpoints.save(manager, 1, {"params": jax.device_get(params)}, {})
  manager.close()
  return path


@pytest.fixture(scope="module")
def model(workdir):
  """(config, tokenizer, model_config, params, [(source, output ids)] x 2)."""
  config, tokenizer = trained.load_workdir(str(workdir))
  params, _ = checkpoints.restore_params(str(workdir))
  model_config = TransformerConfig.from_config(config, deterministic=True)
  sources, _ = data.load_text_pairs(config, "test[:2]")
  found = translate.translate_with_ids(
      model_config, params, tokenizer, sources, beam_size=1, alpha=0.6,
      max_decode_extra=config.max_decode_extra)
  pairs = list(zip(found.source_ids, found.output_ids))
  return config, tokenizer, model_config, params, pairs


def _softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
  logits = np.where(mask, logits, -np.inf)
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _numpy_first_layer_self_attention(params, ids: np.ndarray,
                                      layer: str, causal: bool) -> np.ndarray:
  """softmax(QKᵀ/√d_k) of a first layer, from the embeddings, in NumPy.

  Post-LN: the first layer reads the scaled embeddings plus the sinusoids.
  """
  table = np.asarray(params["source_embed"]["embedding"], np.float64)
  d_model = table.shape[1]
  length = len(ids)
  pos = np.arange(length)[:, None]
  i = np.arange(0, d_model, 2)[None, :]
  pe = np.zeros((length, d_model))
  pe[:, 0::2] = np.sin(pos / 10000 ** (i / d_model))
  pe[:, 1::2] = np.cos(pos / 10000 ** (i / d_model))
  x = table[ids] * np.sqrt(d_model) + pe  # [L, M]
  attention = params[layer]["self_attention"]
  wq = np.asarray(attention["query_kernel"], np.float64)  # [M, H, d_k]
  wk = np.asarray(attention["key_kernel"], np.float64)
  q = np.einsum("lm,mhd->hld", x, wq)
  k = np.einsum("lm,mhd->hld", x, wk)
  logits = q @ k.transpose(0, 2, 1) / np.sqrt(wq.shape[-1])  # [H, L, L]
  mask = (np.tril(np.ones((length, length), bool)) if causal
          else np.ones((length, length), bool))
  return _softmax(logits, mask)


def test_weights_match_numpy_and_are_softmax_rows(model):
  _, _, model_config, params, pairs = model
  source, target = pairs[0]
  s, t = len(source), len(target)
  assert source[-1] == data.EOS_ID and s > 3 and t > 1
  first = attention_maps.attention_weights(model_config, params, source,
                                           target, layer=0)
  shifted = np.concatenate([[0], target[:-1]])  # decoder input, start 0
  np.testing.assert_allclose(
      first["encoder_self"],
      _numpy_first_layer_self_attention(params, source, "encoder_layers_0",
                                        causal=False), atol=2e-5)
  np.testing.assert_allclose(
      first["decoder_self"],
      _numpy_first_layer_self_attention(params, shifted, "decoder_layers_0",
                                        causal=True), atol=2e-5)
  # The last layer: -1 = 1 of 2; cropped shapes; each row a softmax over the
  # real keys; decoder self-attention sees no later position.
  last = attention_maps.attention_weights(model_config, params, source,
                                          target, layer=-1)
  again = attention_maps.attention_weights(
      model_config, params, np.pad(source, (0, 5)), np.pad(target, (0, 3)),
      layer=1)
  heads = model_config.num_heads
  shapes = {"encoder_self": (heads, s, s), "decoder_self": (heads, t, t),
            "encoder_decoder": (heads, t, s)}
  for kind in attention_maps.KINDS:
    assert last[kind].shape == shapes[kind], kind
    np.testing.assert_array_equal(last[kind], again[kind])
    np.testing.assert_allclose(last[kind].sum(-1), 1.0, atol=1e-5)
    assert (last[kind] >= 0).all()
  assert not np.allclose(last["encoder_self"], first["encoder_self"])
  assert (np.triu(last["decoder_self"], k=1) == 0).all()
  with pytest.raises(ValueError, match="layer=2 is out of range"):
    attention_maps.attention_weights(model_config, params, source, target,
                                     layer=2)


def test_figure_is_a_png_with_one_panel_per_head(model, tmp_path):
  _, tokenizer, model_config, params, pairs = model
  source, target = pairs[1]
  # Any target: a random model need not end its output; this one does.
  target = np.append(target[:6], data.EOS_ID)
  figures = attention_maps.sentence_figures(
      model_config, params, tokenizer, source, target, layer=-1,
      prefix=str(tmp_path / "s"))
  weights = attention_maps.attention_weights(model_config, params, source,
                                             target, layer=-1)
  source_pieces = [tokenizer.id_to_piece(i) for i in source[:-1]] + ["</s>"]
  output_pieces = [tokenizer.id_to_piece(i) for i in target[:-1]] + ["</s>"]
  for kind, figure in figures.items():
    path = tmp_path / f"s_{kind}.png"
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) > 200
    assert image[..., :3].std() > 0.05  # not a blank page
    panels = [ax for ax in figure.axes if ax.images]
    assert len(panels) == attention_maps.count_panels(figure) == (
        model_config.num_heads)
    layer_name = "encoder" if kind == "encoder_self" else "decoder"
    assert figure.get_suptitle() == (
        f"{attention_maps.TITLES[kind]}, {layer_name} layer 2 of 2")
    for h, ax in enumerate(panels):
      assert ax.get_title() == f"head {h + 1}"
      np.testing.assert_array_equal(ax.images[0].get_array(),
                                    weights[kind][h])
    ax = panels[0]
    rows = [label.get_text() for label in ax.get_yticklabels()]
    cols = [label.get_text() for label in ax.get_xticklabels()]
    if kind == "encoder_self":
      assert rows == cols == source_pieces
    elif kind == "decoder_self":
      assert rows == output_pieces
      assert cols == ["<s>"] + output_pieces[:-1]
    else:
      assert (rows, cols) == (output_pieces, source_pieces)


def test_eval_py_writes_three_maps_per_sentence(workdir, tmp_path, eval_py,
                                                capsys):
  out = tmp_path / "out"
  code = eval_py(f"--workdir={workdir}", "--split=test[:3]", "--beam_size=1",
                 "--plot_attention=2", "--plot_layer=0", f"--output_dir={out}")
  result = capsys.readouterr()
  assert code == 0, result.err[-3000:]
  written = sorted(p.name for p in (out / "attention").iterdir())
  assert written == sorted(f"sentence_{i}_{kind}.png" for i in (1, 2)
                           for kind in attention_maps.KINDS)
  for name in written:
    assert (out / "attention" / name).read_bytes()[:8] == PNG_SIGNATURE
  assert (f"Wrote 6 attention maps (2 sentence(s), layer 0) to "
          f"{out / 'attention'}") in result.out
  # The maps show the translations the evaluation wrote.
  assert "attention maps show the translation" not in result.err


def test_maps_draw_the_evaluations_own_ids_without_a_second_search(
    workdir, tmp_path, monkeypatch):
  # A source file with a blank line: one search call for the evaluation,
  # and the maps are those of the ids it returned (the blank one has none).
  source = tmp_path / "src.txt"
  config, tokenizer = trained.load_workdir(str(workdir))
  sentences, _ = data.load_text_pairs(config, "test[:2]")
  source.write_text(f"{sentences[0]}\n\n{sentences[1]}\n", encoding="utf-8")
  searches, drawn = [], []
  search = translate.translate_with_ids
  monkeypatch.setattr(translate, "translate_with_ids", lambda *a, **k: (
      searches.append(a[3]) or search(*a, **k)))
  figures = attention_maps.sentence_figures
  monkeypatch.setattr(attention_maps, "sentence_figures", lambda *a, **k: (
      drawn.append((a[3], a[4], k["prefix"])) or figures(*a, **k)))
  out = tmp_path / "out"
  result = evaluator.evaluate(str(workdir), source_file=str(source),
                              beam_size=1, plot_attention=3,
                              output_dir=str(out))
  assert searches == [[sentences[0], "", sentences[1]]]
  assert result["translations"][1] == ""
  assert [pathlib.Path(p).name for _, _, p in drawn] == [
      "sentence_1", "sentence_3"]
  params, _ = checkpoints.restore_params(str(workdir))
  model_config = TransformerConfig.from_config(config, deterministic=True)
  again = search(model_config, params, tokenizer, [sentences[0],
                                                   sentences[1]],
                 beam_size=1, alpha=config.alpha,
                 max_decode_extra=config.max_decode_extra)
  for (source_ids, output_ids, _), i in zip(drawn, (0, 1)):
    np.testing.assert_array_equal(source_ids, again.source_ids[i])
    np.testing.assert_array_equal(output_ids, again.output_ids[i])
    assert translate.detokenize(tokenizer, output_ids) == (
        result["translations"][2 * i])
  assert len(result["attention_maps"]) == 6


def test_bad_plot_flags_fail_before_any_work(workdir, tmp_path):
  w = str(workdir)
  out = tmp_path / "never"
  cases = [
      (dict(plot_attention=-1), "^plot_attention must be >= 0, got -1"),
      (dict(plot_attention=1, plot_layer=2),
       r"^plot_layer=2 is out of range: the model has 2 encoder and 2 "
       r"decoder layers \(use 0..1, or -2..-1"),
      (dict(plot_attention=1, plot_layer=-3), "^plot_layer=-3 is out of"),
      (dict(plot_attention=1, write=False), "give output_dir "),
  ]
  for kwargs, message in cases:
    with pytest.raises(evaluator.EvalError, match=message):
      evaluator.evaluate(w, split="test[:1]", output_dir=str(out), **kwargs)
  assert not out.exists()
  # A layer index is not checked when nothing is drawn.
  result = evaluator.evaluate(w, split="test[:1]", beam_size=1,
                              output_dir=str(out), plot_layer=7)
  assert "attention_maps" not in result
  assert not (out / attention_maps.ATTENTION_DIR).exists()
