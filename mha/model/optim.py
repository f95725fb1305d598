"""The paper's optimizer (§5.3): Adam with warmup and inverse-sqrt decay.

The learning-rate schedule is chosen by `config.learning_rate_schedule`
from `SCHEDULES`, the one table of schedules: the paper's `noam` by
default.
"""
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from mha import validation

# After the warmup: k -> the factor that takes over from k · warmup^-1.5.
_Decay = Callable[[jax.Array], jax.Array | float]


def _warmup_schedule(d_model: int, warmup_steps: int, scale: float,
                     decay: _Decay) -> optax.Schedule:
  """lrate = scale · d_model^-0.5 · min(decay(k), k · warmup_steps^-1.5),
  k = count + 1 (`noam_schedule`)."""
  if warmup_steps <= 0:
    raise ValueError(f"warmup_steps must be positive, got {warmup_steps}.")

  def schedule(count):
    k = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model ** -0.5 * jnp.minimum(
        decay(k), k * warmup_steps ** -1.5)

  return schedule


def noam_schedule(d_model: int, warmup_steps: int,
                  scale: float = 1.0) -> optax.Schedule:
  """lrate = scale · d_model^-0.5 · min(k^-0.5, k · warmup_steps^-1.5).

  k = 1, 2, ... numbers the updates. optax calls a schedule with the count of
  updates already applied (0 for the first), so the schedule evaluates the
  formula at k = count + 1: the first update uses k = 1, never k = 0 (whose
  rate would be 0).

  Args:
    d_model: model size.
    warmup_steps: the rate grows linearly for this many updates, then decays
      as k^-0.5.
    scale: a constant factor (1.0 = the paper).

  Returns:
    count -> learning rate.
  """
  return _warmup_schedule(d_model, warmup_steps, scale, lambda k: k ** -0.5)


def constant_warmup_schedule(d_model: int, warmup_steps: int,
                             scale: float = 1.0) -> optax.Schedule:
  """lrate = scale · d_model^-0.5 · min(warmup_steps^-0.5,
  k · warmup_steps^-1.5).

  The noam warmup (the same rates for k <= warmup_steps), then constant at
  its peak, `peak_learning_rate`, instead of decaying as k^-0.5. k = count
  + 1 as in `noam_schedule`.

  Returns:
    count -> learning rate.
  """
  return _warmup_schedule(d_model, warmup_steps, scale,
                          lambda k: warmup_steps ** -0.5)


def peak_learning_rate(d_model: int, warmup_steps: int,
                       scale: float = 1.0) -> float:
  """The schedule's largest value, at k = warmup_steps:
  scale · d_model^-0.5 · warmup_steps^-0.5 (in float64)."""
  return scale * d_model ** -0.5 * warmup_steps ** -0.5


Schedule = Callable[[ml_collections.ConfigDict], optax.Schedule]


def _of_warmup_fields(schedule: Callable[[int, int, float], optax.Schedule]
                      ) -> Schedule:
  """A schedule of (d_model, warmup_steps, scale) as a function of a config
  (its d_model, warmup_steps and learning_rate_scale)."""
  return lambda config: schedule(config.d_model, config.warmup_steps,
                                 config.learning_rate_scale)


# The one table of learning-rate schedules: config.learning_rate_schedule ->
# the function of the config that gives its optax schedule (count -> rate).
# A new schedule is an entry here and its name in
# `mha.validation.LEARNING_RATE_SCHEDULES`, in the same order (a test keeps
# the two equal).
SCHEDULES: dict[str, Schedule] = {
    "noam": _of_warmup_fields(noam_schedule),  # §5.3
    "constant_warmup": _of_warmup_fields(constant_warmup_schedule),
}
# The schedule of a config written before `learning_rate_schedule` existed
# (an older workdir's config.json): the only one there was.
OLDER_SCHEDULE = "noam"


def config_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """The schedule of `config.learning_rate_schedule` (`SCHEDULES`;
  `OLDER_SCHEDULE` where the config has no such field): the optimizer's
  and the logged rate.

  Raises:
    ConfigError: a name `SCHEDULES` does not hold, naming the field.
  """
  name = config.get("learning_rate_schedule", OLDER_SCHEDULE)
  validation.check_field("learning_rate_schedule", name)
  return SCHEDULES[name](config)


def create_optimizer(config: ml_collections.ConfigDict
                     ) -> optax.GradientTransformation:
  """Adam(β1, β2, ε) on the config's schedule (`config_schedule`),
  optionally after norm clipping."""
  schedule = config_schedule(config)
  adam = optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2,
                    eps=config.adam_eps)
  if config.grad_clip_norm and config.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adam)
  return adam
