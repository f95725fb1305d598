"""Separate source and target SentencePiece models with one id table (an
OPUS-MT model's `source.spm`, `target.spm` and `vocab.json`): encodings
equal what the table and each model give by hand, decoding inverts
encoding, a workdir stores and loads them, and bad files are named.

The two models are trained here on the synthetic pair's two sides, with
SentencePiece's own ids (unk 0, bos 1, eos 2), which the table's are not.
"""
import io
import json
import os

import numpy as np
import pytest
import sentencepiece as spm

from conftest import synthetic_config
from mha import data
from mha.data import sources as data_sources
from mha.data import tokenized
from mha.data import tokenizer
from mha.errors import DataError
from mha.store import workdir as workdir_lib


pytestmark = pytest.mark.usefixtures("tfds_dir_for_the_session")
_synthetic = synthetic_config


def _train(sentences: list[str], size: int) -> bytes:
  writer = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=writer,
      vocab_size=size, model_type="bpe", character_coverage=1.0,
      num_threads=1, minloglevel=2)
  return writer.getvalue()


@pytest.fixture(scope="module")
def marian_files(tmp_path_factory):
  """{file name: bytes} of a separate vocabulary of the synthetic pair,
  and the pieces the table leaves out (one of the target model's)."""
  source_text, target_text = [], []
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MHA_TFDS_DIR", str(tmp_path_factory.getbasetemp() / "tfds"))
    split = data_sources.open_split(_synthetic(), "train")
    for chunk_sources, chunk_targets in split.read(2000):
      source_text += chunk_sources
      target_text += chunk_targets
  models = {tokenizer.SOURCE_MODEL_FILENAME: _train(source_text, 60),
            tokenizer.TARGET_MODEL_FILENAME: _train(target_text, 50)}
  pieces = []
  for proto in models.values():
    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())
               if not (sp.is_control(i) or sp.is_unknown(i))]
  pieces = sorted(set(pieces))
  left_out = pieces[-1]
  order = np.random.default_rng(0).permutation(len(pieces) - 1)
  table = {"<pad>": 0, "</s>": 1, "<unk>": 2}
  table.update({pieces[i]: 3 + n for n, i in enumerate(order)})
  files = dict(models)
  files[tokenizer.ID_TABLE_FILENAME] = json.dumps(table).encode()
  return files, left_out


def _folder(path, files, **replaced):
  os.makedirs(path, exist_ok=True)
  for name, content in dict(files, **replaced).items():
    if content is not None:
      (path / name).write_bytes(content)
  return path


def _by_hand(files, name, text):
  """The ids of `text` by the model `name` and the table, written out."""
  table = json.loads(files[tokenizer.ID_TABLE_FILENAME])
  sp = spm.SentencePieceProcessor(model_proto=files[name])
  return [table.get(p, table["<unk>"]) for p in sp.encode(text, out_type=str)]


def test_encodings_are_the_tables_ids_of_each_models_pieces(marian_files,
                                                            tmp_path):
  files, left_out = marian_files
  size = len(json.loads(files[tokenizer.ID_TABLE_FILENAME]))
  folder = _folder(tmp_path, files)
  tok = tokenizer.load_separate_tokenizer(_synthetic(vocab_size=size),
                                          str(folder))
  assert tok.vocab_size == size
  assert tok.path == str(folder / "vocab.json")
  pairs = list(zip(*next(iter(data_sources.open_split(
      _synthetic(), "test").read(20)))))
  for source, target in pairs:
    assert tok.encode(source) == _by_hand(files, "source.spm", source)
    assert tok.encode(target, side="target") == _by_hand(
        files, "target.spm", target)
  texts = [t for _, t in pairs]
  assert tok.encode_batch(texts, side="target") == [
      _by_hand(files, "target.spm", t) for t in texts]
  # The two models differ: a sentence's ids depend on its side.
  assert any(tok.encode(t) != tok.encode(t, side="target") for t in texts)
  # A target piece the table lacks is <unk>'s id, 2.
  target_sp = spm.SentencePieceProcessor(model_proto=files["target.spm"])
  if left_out in {target_sp.id_to_piece(i)
                  for i in range(target_sp.get_piece_size())}:
    text = target_sp.decode_pieces([left_out])
    assert data.token_ids.UNK_ID in tok.encode(text, side="target")


def test_decode_inverts_encode_through_the_target_model(marian_files,
                                                        tmp_path):
  files, _ = marian_files
  size = len(json.loads(files[tokenizer.ID_TABLE_FILENAME]))
  tok = tokenizer.load_separate_tokenizer(
      _synthetic(vocab_size=size), str(_folder(tmp_path, files)))
  table = json.loads(files["vocab.json"])
  target_sp = spm.SentencePieceProcessor(model_proto=files["target.spm"])
  inverted = 0
  for _, target in zip(*next(iter(data_sources.open_split(
      _synthetic(), "test").read(20)))):
    ids = tok.encode(target, side="target")
    # Up to EOS, pads dropped; the pieces joined by the target model (a
    # piece the table lacks comes back as <unk>'s).
    pieces = target_sp.encode(target, out_type=str)
    expected = target_sp.decode_pieces(
        [p if p in table else "<unk>" for p in pieces])
    assert tok.decode(ids + [1, 5, 0]) == expected
    if all(p in table for p in pieces):
      inverted += 1
      assert expected == tok.normalize(target, side="target")
    piece = {i: p for p, i in table.items()}
    assert [tok.id_to_piece(i) for i in ids] == [piece[i] for i in ids]
  assert inverted >= 5


def test_a_workdir_stores_and_loads_it_and_never_trains(marian_files,
                                                         tmp_path):
  files, _ = marian_files
  size = len(json.loads(files[tokenizer.ID_TABLE_FILENAME]))
  config = _synthetic(vocab_size=size)
  folder = _folder(tmp_path / "run", files)
  layout = workdir_lib.Workdir(str(folder))
  assert layout.has_vocabulary()
  loaded = layout.load_tokenizer(config)
  assert isinstance(loaded, tokenizer.SeparateTokenizer)
  trained_or_loaded = data.get_tokenizer(config, str(folder))
  assert isinstance(trained_or_loaded, tokenizer.SeparateTokenizer)
  assert trained_or_loaded.sha256 == loaded.sha256
  assert not (folder / "spm.model").exists()  # nothing trained
  # The tokenized split: sources by source.spm, targets by target.spm.
  split = tokenized.tokenize_split(config, loaded, "test")
  pairs = list(zip(*next(iter(data_sources.open_split(
      config, "test").read(3)))))
  for i, (source, target) in enumerate(pairs):
    assert split.inputs_of(i).tolist() == _by_hand(
        files, "source.spm", source) + [1]
    assert split.targets_of(i).tolist() == _by_hand(
        files, "target.spm", target) + [1]


def test_tokenizing_on_two_processes_gives_the_one_process_arrays(
    marian_files, tmp_path, monkeypatch):
  # The workers rebuild the separate vocabulary from its three files and
  # encode each side with its own model, as this process does.
  files, _ = marian_files
  config = _synthetic(vocab_size=len(json.loads(
      files[tokenizer.ID_TABLE_FILENAME])))
  tok = tokenizer.load_separate_tokenizer(
      config, str(_folder(tmp_path / "run", files)))
  monkeypatch.setattr(tokenized, "CHUNK_PAIRS", 500)
  text_split = data_sources.open_split(config, "train[:1200]")
  one, two = (tokenized._encode_split(  # pylint: disable=protected-access
      text_split, tok, processes=n) for n in (1, 2))
  for name in ("inputs", "targets", "inputs_offsets", "targets_offsets"):
    assert getattr(one, name).tobytes() == getattr(two, name).tobytes()
  source, target = (x[-1] for x in next(iter(text_split.read(1200))))
  assert two.inputs_of(1199).tolist() == _by_hand(
      files, "source.spm", source) + [1]
  assert two.targets_of(1199).tolist() == _by_hand(
      files, "target.spm", target) + [1]


def _table(files, **changes):
  table = json.loads(files["vocab.json"])
  table.update(changes)
  return json.dumps(table).encode()


@pytest.mark.parametrize("replaced, message", [
    (dict(target_spm=None), "target.spm cannot be read"),
    (dict(source_spm=b"not a model"), "source.spm is not a SentencePiece"),
    (dict(vocab=b"{"), "vocab.json is not valid JSON"),
    (dict(vocab=b"[1, 2]"), "vocab.json is not an id table"),
    ("gap", "vocab.json does not give the ids 0.."),
    ("pad_last", "vocab.json gives {'<pad>': "),
    ("foreign", "vocab.json holds none of the pieces of"),
])
def test_bad_files_are_named(marian_files, tmp_path, replaced, message):
  files, _ = marian_files
  table = json.loads(files["vocab.json"])
  if replaced == "gap":
    replaced = dict(vocab=_table(files, **{"<x>": len(table) + 5}))
  elif replaced == "pad_last":  # Marian's own order: pad is the last id
    last = next(p for p, i in table.items() if i == len(table) - 1)
    replaced = dict(vocab=_table(files, **{"<pad>": len(table) - 1,
                                           last: 0}))
  elif replaced == "foreign":
    foreign = {"<pad>": 0, "</s>": 1, "<unk>": 2, "zzqx": 3}
    replaced = dict(vocab=json.dumps(foreign).encode())
  names = {"target_spm": "target.spm", "source_spm": "source.spm",
           "vocab": "vocab.json"}
  folder = _folder(tmp_path, files,
                   **{names[k]: v for k, v in replaced.items()})
  with pytest.raises(DataError, match=message.replace("{", r"\{")):
    tokenizer.load_separate_tokenizer(
        _synthetic(vocab_size=len(table)), str(folder))


def test_vocab_size_must_be_the_tables(marian_files, tmp_path):
  files, _ = marian_files
  folder = _folder(tmp_path, files)
  with pytest.raises(DataError, match="vocab.json has a vocabulary of"):
    tokenizer.load_separate_tokenizer(_synthetic(vocab_size=999),
                                      str(folder))


def _marian_workdir(folder, files):
  """A workdir as an import would leave it: the separate vocabulary,
  OPUS-MT's model options in config.json, random parameters (biases not
  0) as checkpoint 1. Returns (config, params)."""
  # pylint: disable=g-import-not-at-top
  import jax
  import mha
  import paper_reference
  from mha.store import checkpoints
  # pylint: enable=g-import-not-at-top
  size = len(json.loads(files[tokenizer.ID_TABLE_FILENAME]))
  config = _synthetic(vocab_size=size, ffn_activation="swish",
                      attention_bias=True, output_bias=True,
                      layer_norm_epsilon=1e-5, max_decode_extra=4)
  _folder(folder, files)
  workdir_lib.write_config(config, str(folder))
  model = mha.create_model(config, deterministic=True)
  ids = np.ones((1, 4), np.int32)
  params = paper_reference.random_params(
      jax.eval_shape(model.init, jax.random.key(0), ids, ids)["params"], 3)
  manager = checkpoints.make_manager(str(folder), keep=1)
  checkpoints.save(manager, 1, {"params": params}, {"step": 1})
  manager.close()
  return config, params


def test_a_marian_like_workdir_translates_and_scores(marian_files,
                                                     tmp_path):
  """`mha.load` of a workdir with a separate vocabulary and OPUS-MT's model
  options (random parameters): its scores are the model's teacher-forced
  log-probabilities of the ids by hand (source by source.spm, target by
  target.spm), and its greedy translations are the target model's text of
  a greedy search written out with the full forward pass."""
  import jax  # pylint: disable=g-import-not-at-top
  import mha  # pylint: disable=g-import-not-at-top
  files, _ = marian_files
  folder = tmp_path / "run"
  config, params = _marian_workdir(folder, files)
  model = mha.create_model(config, deterministic=True)
  translator = mha.load(str(folder))
  pairs = list(zip(*next(iter(data_sources.open_split(
      config, "test").read(3)))))
  scores = translator.score([s for s, _ in pairs], [t for _, t in pairs])
  # The full forward pass, jitted: one compile a shape (not one for each
  # operation and shape, as run op by op).
  forward = jax.jit(lambda src, tgt: model.apply({"params": params}, src,
                                                 tgt))
  for (source, target), score in zip(pairs, scores):
    src = np.array([_by_hand(files, "source.spm", source) + [1]], np.int32)
    tgt = np.array([_by_hand(files, "target.spm", target) + [1]], np.int32)
    log_probs = jax.nn.log_softmax(forward(src, tgt), axis=-1)
    np.testing.assert_allclose(
        score.token_log_probs,
        np.take_along_axis(np.asarray(log_probs)[0], tgt[0][:, None], -1
                           )[:, 0], atol=1e-4)
  source = pairs[0][0]
  src = np.array([_by_hand(files, "source.spm", source) + [1]], np.int32)
  output = []
  # The targets so far padded to one length: the decoder is causal, so the
  # padding after position len(output) leaves its logits as they are.
  tgt = np.zeros((1, src.shape[1] + 5), np.int32)
  for _ in range(src.shape[1] + 4):
    tgt[0, :len(output) + 1] = output + [1]
    logits = forward(src, tgt)
    output.append(int(np.argmax(logits[0, len(output)])))
    if output[-1] == 1:
      break
  table = {i: p for p, i in json.loads(files["vocab.json"]).items()}
  target_sp = spm.SentencePieceProcessor(model_proto=files["target.spm"])
  expected = target_sp.decode_pieces(
      [table[i] for i in output if i not in (0, 1)])
  assert translator.translate([source], beam_size=1) == [expected]


def test_a_warm_start_shares_the_separate_vocabulary(marian_files,
                                                     tmp_path):
  """`init_from` a workdir with a separate vocabulary: its three files are
  the new run's (no spm.model trained), its parameters the first step's,
  and a new workdir holding a shared spm.model is refused."""
  # pylint: disable=g-import-not-at-top
  from mha.errors import ConfigError
  from mha.store import checkpoints
  from mha.train import trainer
  from mha.train import warm_start
  # pylint: enable=g-import-not-at-top
  files, _ = marian_files
  source = tmp_path / "imported"
  config, _ = _marian_workdir(source, files)
  assert warm_start.vocabulary(str(source), str(tmp_path / "new")) == files
  other = tmp_path / "other"
  other.mkdir()
  (other / "spm.model").write_bytes(b"a shared vocabulary")
  with pytest.raises(ConfigError, match="other/spm.model differs from "
                     ".*imported/spm.model"):
    warm_start.vocabulary(str(source), str(other))
  new = tmp_path / "new"
  config.update(init_from=str(source), num_train_steps=2,
                checkpoint_every_steps=2, eval_every_steps=100,
                eval_split="validation[:8]")
  trainer.train_and_evaluate(config, str(new))
  for name, content in files.items():
    assert (new / name).read_bytes() == content
  assert not (new / "spm.model").exists()
  assert checkpoints.latest_step(str(new)) == 2


def test_the_ctranslate2_export_refuses_it(marian_files, tmp_path):
  """The CTranslate2 export writes one shared spm.model: a workdir with a
  separate vocabulary is refused with one line, nothing written."""
  pytest.importorskip("ctranslate2")
  from mha import export  # pylint: disable=g-import-not-at-top
  from mha.errors import ExportError  # pylint: disable=g-import-not-at-top
  files, _ = marian_files
  _marian_workdir(tmp_path / "run", files)
  with pytest.raises(ExportError) as refused:
    export.export(str(tmp_path / "run"), str(tmp_path / "ct2"))
  assert str(refused.value) == (
      f"{tmp_path / 'run'} has separate source and target vocabularies "
      f"({tmp_path / 'run' / 'vocab.json'}): the CTranslate2 export writes "
      "one shared spm.model, which cannot encode both.")
  assert sorted(os.listdir(tmp_path)) == ["run"]
