"""bench/decode.py's CTranslate2 and end-to-end modes (bench/decode_ct2.py,
bench/ct2_process.py): CTranslate2 in a process of its own translates the
whole job as an in-process `translate_batch` does, the end-to-end runs
translate the same sentences, and bad flag combinations are one error.
Nothing about time is asserted.

The model is the conftest `random_workdir` (random parameters): its
outputs run to the length limit and differ from sentence to sentence, so
an output in the wrong order or cut short shows; `tiny_workdir`'s end with
EOS at once.
"""
import os

import numpy as np
import pytest

from bench import decode
from bench import decode_ct2
import mha
from mha import data
from mha.search import texts as translate
from mha.store import trained

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="ctranslate2 is not installed (the optional export "
    "dependency: pip install ctranslate2)")

SOURCES = ["Ein Hund läuft über die Wiese.", "Zwei Männer.",
           "Eine Frau mit einem roten Hut liest ein Buch im Park.",
           "Kinder spielen.", "Ein Mann fährt Fahrrad.", "Blau."]


def make_job(workdir, folder, batch_size: int = 2) -> decode_ct2.Job:
  config, tokenizer = trained.load_workdir(str(workdir))
  encoded = translate.encode_sources(tokenizer, SOURCES, config.max_len)
  return decode_ct2.Job(
      str(workdir), tokenizer, encoded, SOURCES, ["A dog."] * len(SOURCES),
      alpha=0.6, max_decode_extra=config.max_decode_extra,
      batch_size=batch_size, repeats=1, folder=str(folder))


@pytest.fixture(scope="module")
def exported(random_workdir, tmp_path_factory):
  """(job, {'float32': its export folder})."""
  job = make_job(random_workdir, tmp_path_factory.mktemp("decode_ct2"))
  return job, decode_ct2.export_models(job, {"float32"})


MODES = decode_ct2.modes(2, 2, ("float32",))  # 1 x 2 threads, 2 x 1


@pytest.fixture(scope="module")
def steady_results(exported):
  """`decode_ct2.steady` of the job, greedy and beam 3, in both MODES."""
  job, models = exported
  return decode_ct2.steady(job, models, MODES, [1, 3])


@pytest.mark.parametrize("beam", [1, 3])
def test_steady_equals_one_in_process_call(exported, steady_results, beam):
  job, models = exported
  pieces = [[job.tokenizer.id_to_piece(t) for t in ids[:-1]]
            for ids in job.encoded]
  # The whole job's limit: its longest source, its EOS, max_decode_extra.
  limit = max(len(ids) for ids in job.encoded) + job.max_decode_extra
  ids = {job.tokenizer.id_to_piece(i): i
         for i in range(job.tokenizer.vocab_size)}
  translator = ctranslate2.Translator(models["float32"], intra_threads=1)
  expected = [[ids[p] for p in r.hypotheses[0]]
              for r in translator.translate_batch(
                  pieces, max_batch_size=2, beam_size=beam,
                  length_penalty=0.6, max_decoding_length=limit,
                  min_decoding_length=0, return_end_token=True)]
  # Not trivial: the outputs in CTranslate2's order (by length) are not
  # in input order.
  by_length = sorted(range(len(SOURCES)), key=lambda i: len(pieces[i]))
  assert [expected[i] for i in by_length] != expected
  for mode in MODES:
    r = steady_results[beam, mode.name]
    assert [list(out) for out in r["outputs"]] == expected, mode
    assert r["tokens"] == sum(map(len, expected))
    assert r["sentences_per_sec"] * r["seconds"] == pytest.approx(
        len(SOURCES))


def test_steady_outputs_keep_their_eos(tiny_workdir, tmp_path):
  # tiny_workdir's model answers EOS first: each output is that one token,
  # counted (mha's outputs too end with their EOS).
  job = make_job(tiny_workdir, tmp_path)
  models = decode_ct2.export_models(job, {"float32"})
  mode = decode_ct2.Mode("float32", 1, 1)
  r = decode_ct2.steady(job, models, [mode], [1])[1, mode.name]
  assert [list(out) for out in r["outputs"]] == [[data.EOS_ID]] * len(
      SOURCES)
  assert r["tokens"] == len(SOURCES)


def test_two_translators_by_default_but_on_one_core():
  assert decode.parse_flags(["--ct2_threads=4"]).ct2_inter_threads == 2
  assert decode.parse_flags(["--ct2_threads=1"]).ct2_inter_threads == 1


def test_modes_share_the_cores_equally():
  modes = decode_ct2.modes(8, 4)
  assert [m.name for m in modes] == [
      "ct2 float32 1x8", "ct2 float32 4x2", "ct2 int8 1x8", "ct2 int8 4x2"]
  assert {m.translators * m.threads for m in modes} == {8}
  assert [m.name for m in decode_ct2.modes(2, 1)] == [
      "ct2 float32 1x2", "ct2 int8 1x2"]


def test_compare_counts_equal_and_capped_outputs():
  eos = data.EOS_ID
  ours = [np.array([5, 6, eos]), np.array([5, 6]), np.array([5, 6]),
          np.array([7, eos])]
  theirs = [np.array([5, 6, eos]), np.array([5, 6, 8, eos]),
            np.array([5, 9, 8]), np.array([7, 8, eos])]
  # Equal; past mha's cap (no EOS, CTranslate2's goes on); different;
  # different (mha's ended with EOS).
  assert decode_ct2.compare(ours, theirs) == (1, 1)


@pytest.mark.parametrize("flags, named", [
    (["--ctranslate2"], "--ctranslate2 needs --workdir"),
    (["--end_to_end"], "--end_to_end needs --workdir"),
    (["--workdir=w", "--end_to_end", "--profile"], "--end_to_end"),
    (["--workdir=w", "--ct2_threads=4", "--ct2_inter_threads=3"],
     "--ct2_inter_threads=3 does not divide --ct2_threads=4"),
    (["--ct2_threads=2", "--ct2_inter_threads=4"], "--ct2_inter_threads=4"),
    (["--ct2_threads=0"], "--ct2_threads=0"),
])
def test_a_bad_flag_combination_is_one_error_naming_it(flags, named, capsys):
  with pytest.raises(SystemExit) as exit_info:
    decode.parse_flags(flags)
  assert exit_info.value.code == 2
  assert named in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.slow
def test_end_to_end_runs_translate_the_job(exported, tmp_path, monkeypatch):
  # eval.py with a cold, then a warm cache, and CTranslate2's own script
  # (it tokenizes the text itself), each a fresh process, greedy.
  job, models = exported
  job = make_job(job.workdir, tmp_path, batch_size=64)
  mode = decode_ct2.Mode("float32", 1, 1)
  caches = []  # (the cache folder of each eval.py run, its files before)
  eval_run = decode_ct2._eval_run  # pylint: disable=protected-access

  def recorded(job, beam, cache_dir, *args):
    caches.append((cache_dir, sorted(os.listdir(cache_dir))
                   if os.path.isdir(cache_dir) else []))
    return eval_run(job, beam, cache_dir, *args)

  monkeypatch.setattr(decode_ct2, "_eval_run", recorded)
  results = decode_ct2.end_to_end(job, models, [mode], [1], [])
  # The cold run starts on a new empty folder; the warm one reads the
  # folder the cold run filled.
  (cold, cold_files), (warm, warm_files) = caches
  assert cold == warm and not cold_files and warm_files
  run = tmp_path / "end_to_end" / "beam1_round0"
  texts = {name: (run / name).read_text(encoding="utf-8").splitlines()
           for name in ("eval_cold/translations.txt",
                        "eval_warm/translations.txt",
                        "ct2_float32_1x1.txt")}
  # mha's translations, whatever the cache; eval.py's compiled searches
  # were stored in the cold run's folder, read by the warm run.
  ours = mha.load(job.workdir).translate(SOURCES, beam_size=1)
  assert texts["eval_cold/translations.txt"] == ours
  assert texts["eval_warm/translations.txt"] == ours
  assert os.listdir(run / "cache")
  # CTranslate2's, from the text: those of the steady state's pieces.
  steady = decode_ct2.steady(job, models, [mode], [1])[1, mode.name]
  assert texts["ct2_float32_1x1.txt"] == [
      job.tokenizer.decode(out) for out in steady["outputs"]]
  assert len(set(texts["ct2_float32_1x1.txt"])) > 1
  for name in ("mha cold", "mha warm", mode.name):
    assert results[1, name]["seconds"] > 0, name
  cold = results[1, "mha cold"]
  assert 0 < cold["compile_seconds"] <= cold["decode_seconds"] < cold[
      "seconds"]
