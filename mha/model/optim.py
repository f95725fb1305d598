"""The paper's optimizer (§5.3): Adam with warmup and inverse-sqrt decay."""
import jax.numpy as jnp
import ml_collections
import optax


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
  if warmup_steps <= 0:
    raise ValueError(f"warmup_steps must be positive, got {warmup_steps}.")

  def schedule(count):
    k = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model ** -0.5 * jnp.minimum(
        k ** -0.5, k * warmup_steps ** -1.5)

  return schedule


def peak_learning_rate(d_model: int, warmup_steps: int,
                       scale: float = 1.0) -> float:
  """The schedule's largest value, at k = warmup_steps:
  scale · d_model^-0.5 · warmup_steps^-0.5 (in float64)."""
  return scale * d_model ** -0.5 * warmup_steps ** -0.5


def config_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """`noam_schedule` of a config's d_model, warmup_steps and
  learning_rate_scale: the optimizer's and the logged rate."""
  return noam_schedule(config.d_model, config.warmup_steps,
                       config.learning_rate_scale)


def create_optimizer(config: ml_collections.ConfigDict
                     ) -> optax.GradientTransformation:
  """Adam(β1, β2, ε) on the noam schedule, optionally after norm clipping."""
  schedule = config_schedule(config)
  adam = optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2,
                    eps=config.adam_eps)
  if config.grad_clip_norm and config.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adam)
  return adam
