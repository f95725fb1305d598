"""Every config file builds a model (configs/multi30k.py trains on a slice in
test_table3.py's end-to-end run of its base row)."""
import json

import jax
import jax.numpy as jnp
import ml_collections
import pytest

import mha
from configs import base
from configs import big
from configs import multi30k
from configs import quickstart
from mha.store import workdir as workdir_lib


@pytest.mark.parametrize("module,arg", [
    (base, None), (base, "C4,tiny"), (base, "multires,tiny"),
    (base, "tiny,A3,multires"), (big, None), (quickstart, None),
    (quickstart, "tiny"), (multi30k, None), (multi30k, "gpu"),
    (multi30k, "tiny"),
])
def test_config_builds_a_model(module, arg):
  config = module.get_config(arg)
  model = mha.create_model(config)
  ids = jax.ShapeDtypeStruct((2, 8), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), ids, ids)
  embedding = shapes["params"]["source_embed"]["embedding"]
  assert embedding.shape == (config.vocab_size, config.d_model)


def _built_head_sizes(config):
  """(h, d_k, d_v) read off the built model's query and value kernels, each
  [d_model, h, head size]; every attention layer must agree."""
  ids = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  shapes = jax.eval_shape(mha.create_model(config).init, jax.random.key(0),
                          ids, ids)
  kernels = {name: set() for name in ("query_kernel", "value_kernel")}
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    for name, found in kernels.items():
      if name in jax.tree_util.keystr(path):
        found.add(leaf.shape)
  (query,), (value,) = kernels["query_kernel"], kernels["value_kernel"]
  assert query[:2] == value[:2] == (config.d_model, config.num_heads)
  return query[1], query[2], value[2]


def test_table3_rows_resolve_to_the_papers_sizes():
  # (h, d_k, d_v) of Table 3 on the base model (d_model 512, 8 heads).
  paper = {"A1": (1, 512, 512), "A2": (4, 128, 128), "A3": (16, 32, 32),
           "A4": (32, 16, 16), "B1": (8, 16, 64), "B2": (8, 32, 64),
           "C4": (8, 32, 32), "C5": (8, 128, 128)}
  for row, sizes in paper.items():
    assert _built_head_sizes(base.get_config(row)) == sizes, row
  assert base.get_config("C4").d_model == 256
  assert base.get_config("C5").d_model == 1024
  # Rows A keep h·d_k = h·d_v = d_model on the other models too.
  for module, arg in [(big, "A1"), (big, "A4"), (multi30k, "A1"),
                      (multi30k, "A3"), (base, "tiny,A3")]:
    config = module.get_config(arg)
    h = base.TABLE3_ROWS[arg.split(",")[-1]]["num_heads"]
    d = config.d_model
    assert _built_head_sizes(config) == (h, d // h, d // h), (
        module.__name__, arg)


def test_multires_gives_one_width_per_head_of_the_final_model():
  assert base.get_config("multires").location_filter_sizes == (
      1, 3, 5, 7, 9, 11, 13, 15)
  for arg in ("multires,tiny", "tiny,multires"):
    config = base.get_config(arg)
    assert config.attention_type == "location"
    assert config.location_filter_sizes == (1, 3, 5, 7)  # tiny: 4 heads
  assert base.get_config("multires,A1").location_filter_sizes == (1,)
  assert base.get_config("location").location_filter_sizes == (7,)


def test_multi30k_data_dir_from_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("MHA_MULTI30K_DIR", str(tmp_path))
  assert multi30k.get_config().data_dir == str(tmp_path)


def _saved_workdir(tmp_path, config):
  tmp_path.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_config(config, str(tmp_path))
  return str(tmp_path)


def test_workdir_refuses_a_different_model_shape_field(tmp_path):
  config = base.get_config("tiny")
  workdir = _saved_workdir(tmp_path, config)
  workdir_lib.check_config(config, workdir)  # the same config: accepted
  other = base.get_config("tiny")
  other.num_heads = 2
  with pytest.raises(ValueError, match=r"num_heads=4 .* num_heads=2"):
    workdir_lib.check_config(other, workdir)
  other = base.get_config("tiny")
  other.num_train_steps += 10  # not a model-shape field: a longer run
  workdir_lib.check_config(other, workdir)


def test_location_fields_matter_only_for_location_attention(tmp_path):
  config = base.get_config("tiny")
  workdir = _saved_workdir(tmp_path / "dot", config)
  other = base.get_config("tiny")
  other.location_num_filters = config.location_num_filters + 1
  workdir_lib.check_config(other, workdir)  # no location parameters
  config.attention_type = "location"
  workdir = _saved_workdir(tmp_path / "location", config)
  other.attention_type = "location"
  with pytest.raises(ValueError, match=r"location_num_filters"):
    workdir_lib.check_config(other, workdir)
  other = base.get_config("tiny")  # scaled_dot now, location before
  with pytest.raises(ValueError, match=r"attention_type='location'"):
    workdir_lib.check_config(other, workdir)


def test_a_workdir_of_before_the_schedule_field_loads_and_resumes(tmp_path):
  """An older run's config.json lacks `learning_rate_schedule`: today's
  config resumes it, and the config it holds passes the checks and builds
  the model and the optimizer (on noam, the schedule it trained with)."""
  config = base.get_config("tiny")
  older = json.loads(config.to_json())
  del older["learning_rate_schedule"]
  (tmp_path / workdir_lib.CONFIG_FILE).write_text(json.dumps(older))
  workdir_lib.check_config(config, str(tmp_path))
  loaded = workdir_lib.load_config(str(tmp_path))
  assert "learning_rate_schedule" not in loaded
  from mha.train import config_check  # pylint: disable=g-import-not-at-top
  config_check.validate(loaded)
  mha.create_model(loaded)
  params = jnp.zeros(())
  tx = mha.create_optimizer(loaded)
  update, _ = tx.update(jnp.ones(()), tx.init(params), params)
  # The first noam update: -d_model^-0.5 · warmup^-1.5 (Adam's m̂ = v̂ = 1).
  assert float(update) == pytest.approx(
      -config.d_model ** -0.5 * config.warmup_steps ** -1.5, rel=1e-5)


@pytest.mark.parametrize("field, bad", [
    ("beam_size", 0), ("beam_size", 2.5), ("beam_size", True),
    ("alpha", -0.5), ("alpha", float("nan")),
    ("max_decode_extra", -1), ("beam_stop", "fast"), ("beam_stop", "Exact")])
def test_a_config_field_and_its_flag_are_refused_in_the_same_words(field,
                                                                   bad):
  # One rule in mha.validation serves config.beam_size (train.py) and
  # --beam_size (eval.py): the two messages differ in the name alone.
  from mha.train import config_check  # pylint: disable=g-import-not-at-top
  from mha.evaluation import evaluator  # pylint: disable=g-import-not-at-top
  from mha import errors  # pylint: disable=g-import-not-at-top
  from mha import validation  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({**base.get_config().to_dict(),
                                      field: bad})  # any type
  with pytest.raises(errors.ConfigError) as as_field:
    config_check.validate(config)
  with pytest.raises(errors.EvalError) as as_flag:
    with validation.as_flags():  # as in eval.py
      evaluator.check_flags(**{field: bad})
  field_words = str(as_field.value)
  assert field_words.startswith(f"config.{field} must be ")
  assert "\n" not in field_words
  assert str(as_flag.value) == field_words.replace(f"config.{field}",
                                                   f"--{field}", 1)


def test_every_rule_names_a_field_of_the_base_config():
  from mha import validation  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  assert not [f for f in validation.FIELDS if f not in config]
  assert not [f for f in validation.FLAGS if f in config]
  # A value the base config holds passes its own rule.
  assert not [f for f, rule in validation.FIELDS.items()
              if rule(config[f]) is not None]


def test_the_lowest_allowed_values_pass_and_the_next_below_is_refused():
  from mha import validation  # pylint: disable=g-import-not-at-top
  fields = validation.FIELDS
  # The optional sizes: one head dimension or one layer at least.
  for field in ("d_k", "d_v", "num_encoder_layers", "num_decoder_layers"):
    assert fields[field](1) is None and fields[field](0) is not None, field
  # Length penalty alpha 0 is ((5 + |Y|) / 6)^0 = 1: no penalty, allowed.
  assert fields["alpha"](0.0) is None and fields["alpha"](-0.1) is not None
  # 0 steps: a run that only sets up its workdir.
  assert fields["num_train_steps"](0) is None
  assert fields["num_train_steps"](-1) is not None
  # profile_steps (first, count): steps count from 1, the count from 0.
  assert fields["profile_steps"]((1, 0)) is None
  assert fields["profile_steps"]((0, 5)) is not None
