"""rl.py against hand-computed numbers: advantages, designer rewards, the policy loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import rl

# ---------------------------------------------------------------------------------------------
# Advantages


def test_agent_advantages_population_zscore_per_group():
  r = [1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5]
  g = [0, 0, 0, 0, 1, 1, 1]
  a = rl.agent_advantages(r, g)
  # group 0: mean 0.5, population std 0.5 -> +-1; group 1: equal returns -> 0.
  np.testing.assert_allclose(a, [1, -1, 1, -1, 0, 0, 0], atol=1e-6)


def test_agent_advantages_interleaved_groups_and_three_values():
  r = [0.0, 3.0, 1.0, 5.0, 2.0]
  g = [7, 2, 7, 2, 7]
  a = rl.agent_advantages(r, g)
  # group 7: [0, 1, 2] mean 1, std sqrt(2/3); group 2: [3, 5] mean 4, std 1.
  s = np.sqrt(2 / 3)
  np.testing.assert_allclose(a, [-1 / s, -1, 0, 1, 1 / s], rtol=1e-6)


def test_agent_advantages_reject_nan_and_mismatch():
  with pytest.raises(ValueError, match="non-finite"):
    rl.agent_advantages([1.0, np.nan], [0, 0])
  with pytest.raises(ValueError, match="non-finite"):
    rl.agent_advantages([1.0, np.inf], [0, 0])
  with pytest.raises(ValueError, match="same shape"):
    rl.agent_advantages([1.0, 0.0], [0])


def test_designer_scale_and_advantages():
  assert rl.designer_scale(192, 24, 4) == 32.0
  assert rl.designer_scale(192, 2, 4) == 50.0  # capped
  with pytest.raises(ValueError):
    rl.designer_scale(192, 0, 4)
  a = rl.designer_advantages([1.0, 0.5, 0.2, 0.7], ["math", "math", "logic", "math"], scale=2.0)
  # math: mean of [1, .5, .7] = .7333; logic alone -> 0. No std division.
  m = (1.0 + 0.5 + 0.7) / 3
  np.testing.assert_allclose(a, [2 * (1 - m), 2 * (0.5 - m), 0.0, 2 * (0.7 - m)], rtol=1e-6)
  with pytest.raises(ValueError, match="non-finite"):
    rl.designer_advantages([np.nan], [0], 1.0)


# ---------------------------------------------------------------------------------------------
# Designer rewards


def test_regret_term_and_anchor_values():
  np.testing.assert_allclose(rl.regret_term([-1.0, 0.0, 0.075, 0.15, 0.6]), [0, 0, 0.5, 1, 1])
  np.testing.assert_allclose(rl.anchor([0.0, 0.15, 0.2, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0]),
                             [0, 0, 0.2, 1, 1, 1, 0.6, 0, 0], atol=1e-12)


def test_blend_worked_examples_from_spade_md():
  # docs/method.md §6, regret weight = anchor weight = 1, scale 1, before centering.
  got = rl.blend([-1.0, 0.3, 0.075], [1.0, 0.5, 0.2], regret_weight=1.0, anchor_weight=1.0)
  np.testing.assert_allclose(got, [0.0, 2.0, 0.7], atol=1e-12)
  # Default weights 0.4 / 0.6.
  np.testing.assert_allclose(rl.blend([0.3], [0.5]), [1.0])
  np.testing.assert_allclose(rl.blend([0.075], [0.2]), [0.4 * 0.5 + 0.6 * 0.2])
  with pytest.raises(ValueError, match="non-finite"):
    rl.blend([np.nan], [0.5])


def test_regret_and_variants():
  assert rl.regret([1.0, 0.0, 1.0, 1.0], [0.0, 0.5]) == pytest.approx(0.5)
  with pytest.raises(ValueError):
    rl.regret([], [0.0])
  np.testing.assert_allclose(rl.solve_rate_reward([0.2, 0.5, 0.95]), [0.2, 1.0, 0.0], atol=1e-12)
  np.testing.assert_allclose(rl.regret_reward([0.8, 0.2, 0.9], [0.5, 0.4, 0.1],
                                              [True, True, False]), [0.3, 0.0, 0.0], atol=1e-12)


def test_learning_potential_and_its_moving_averages():
  # g weighs the new value: 0.98 * 1.0 + 0.02 * 0.5 = 0.99; 0.85 * 1.0 + 0.15 * 0.5 = 0.925.
  np.testing.assert_allclose(rl.ema([0.5, 0.2], [1.0, 0.2], 0.98), [0.99, 0.2])
  np.testing.assert_allclose(rl.ema([0.5], [1.0], 0.85), [0.925])
  np.testing.assert_allclose(rl.learning_potential_reward([0.9, 0.1, 0.5], [0.5, 0.5, 0.5]),
                             [0.4, 0.4, 0.0], atol=1e-12)


def test_every_variant_is_dispatched_through_the_one_table():
  s = rl.EnvSignals(np.array([0.3]), np.array([0.5]), np.array([0.8]), np.array([0.5]),
                    np.array([True]), np.array([0.1]))
  cfg = rl.RewardConfig()
  want = {"blend": 1.0, "solve_rate": 1.0, "regret": 0.3, "learning_potential": 0.4}
  assert sorted(rl.DESIGNER_REWARDS) == sorted(want)
  for variant, value in want.items():
    got = rl.designer_reward(s, rl.RewardConfig(variant=variant))
    np.testing.assert_allclose(got, [value], atol=1e-12, err_msg=variant)
  with pytest.raises(ValueError, match="unknown designer reward variant"):
    rl.designer_reward(s, rl.RewardConfig(variant="vibes"))
  assert cfg.band() == {"low": 0.4, "high": 0.6, "width": 0.25}


# ---------------------------------------------------------------------------------------------
# Policy loss

MASK = jnp.array([[1.0, 1.0], [1.0, 0.0]])
ADV = jnp.array([1.0, -0.5])
LOGP_OLD = jnp.array([[-1.0, -2.0], [-0.5, -3.0]])


def test_two_sample_loss_and_gradient_by_hand():
  # Behaviour log-probs give IS weights 1.5, min(3, 2) = 2 and 1; the masked slot holds garbage.
  beh = LOGP_OLD - jnp.array([[np.log(1.5), np.log(3.0)], [0.0, 0.0]])
  beh = beh.at[1, 1].set(jnp.nan)

  def loss_fn(logp):
    return rl.policy_loss(logp, LOGP_OLD, beh, ADV, MASK, n_samples=2)[0]

  loss, grad = jax.value_and_grad(loss_fn)(LOGP_OLD)
  # On-policy: ratio 1, pg = -A. Sample 0: (1.5 * -1 + 2 * -1) / 2; sample 1: (1 * 0.5) / 1.
  np.testing.assert_allclose(loss, (-1.75 + 0.5) / 2, rtol=1e-6)
  # d/dlogp = -A * w / (n_tokens * n_samples).
  np.testing.assert_allclose(grad, [[-1.5 / 4, -2.0 / 4], [0.5 / 2, 0.0]], rtol=1e-6)


def test_asymmetric_clipping_by_hand():
  mask = jnp.ones((3, 1))
  adv = jnp.array([1.0, -1.0, 1.0])
  old = jnp.zeros((3, 1))
  logp = jnp.log(jnp.array([[1.5], [0.5], [0.5]]))

  def loss_fn(lp):
    return rl.policy_loss(lp, old, old, adv, mask, n_samples=3, eps_low=0.2, eps_high=0.28)

  (loss, stats), grad = jax.value_and_grad(loss_fn, has_aux=True)(logp)
  # ratio 1.5, A>0 -> clipped at 1.28; ratio .5, A<0 -> clipped at .8; ratio .5, A>0 -> unclipped.
  np.testing.assert_allclose(loss, (-1.28 + 0.8 - 0.5) / 3, rtol=1e-6)
  # Only the unclipped token has a gradient: d(-ratio)/dlogp = -ratio = -0.5, over 3 samples.
  np.testing.assert_allclose(grad, [[0.0], [0.0], [-0.5 / 3]], atol=1e-7)
  m = rl.finalize_stats(stats)
  np.testing.assert_allclose(m["clip_frac_high"], 1 / 3)
  np.testing.assert_allclose(m["clip_frac_low"], 1 / 3)


@pytest.mark.parametrize("ratio, adv, want_pg, clipped", [
    (1.25, 1.0, -1.25, None),  # inside 1 + eps_high = 1.28: unclipped (at eps 0.2 it would be)
    (0.75, -1.0, 0.8, "low"),  # below 1 - eps_low = 0.8: clipped (at eps 0.28 it would not be)
    (1.25, -1.0, 1.25, None),  # A < 0 is never clipped above
    (0.75, 1.0, -0.75, None),  # A > 0 is never clipped below
])
def test_each_side_clips_with_its_own_epsilon(ratio, adv, want_pg, clipped):
  """Cases where only the right epsilon gives the right answer: a swap of eps_low and eps_high
  changes each of the first two."""
  old = jnp.zeros((1, 1))
  lp = jnp.log(jnp.array([[ratio]]))

  def loss_fn(x):
    return rl.policy_loss(x, old, old, jnp.array([adv]), jnp.ones((1, 1)), n_samples=1,
                          eps_low=0.2, eps_high=0.28)

  (loss, stats), grad = jax.value_and_grad(loss_fn, has_aux=True)(lp)
  np.testing.assert_allclose(loss, want_pg, rtol=1e-6)
  np.testing.assert_allclose(grad, [[0.0 if clipped else -adv * ratio]], rtol=1e-6, atol=1e-7)
  m = rl.finalize_stats(stats)
  assert float(m["clip_frac_low"]) == (clipped == "low") and float(m["clip_frac_high"]) == 0.0


def test_on_policy_ratio_and_is_weight_exactly_one():
  logp = jax.random.normal(jax.random.key(0), (4, 5)) - 3.0
  mask = (jax.random.uniform(jax.random.key(1), (4, 5)) > 0.3).astype(jnp.float32)
  mask = mask.at[:, 0].set(1.0)
  adv = jnp.array([1.0, -1.0, 0.0, 2.0])
  loss, stats = rl.policy_loss(logp, logp, logp, adv, mask, n_samples=4)
  m = rl.finalize_stats(stats)
  assert float(m["ratio_mean"]) == 1.0
  assert float(m["is_weight_mean"]) == 1.0 and float(m["is_weight_max"]) == 1.0
  assert float(m["abs_logp_diff_mean"]) == 0.0
  assert float(m["clip_frac_low"]) == 0.0 and float(m["clip_frac_high"]) == 0.0
  np.testing.assert_allclose(m["nonzero_adv_frac"], 0.75)
  np.testing.assert_allclose(loss, -jnp.mean(adv), rtol=1e-6)  # token mean of -A is -A


def test_empty_rows_are_skipped_not_nan():
  logp = jnp.full((2, 3), -1.0)
  mask = jnp.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
  loss, stats = rl.policy_loss(logp, logp, logp, jnp.array([2.0, 5.0]), mask, n_samples=1)
  np.testing.assert_allclose(loss, -2.0)
  assert float(stats["samples"]) == 1.0


def test_micro_batch_losses_add_up_to_full_batch():
  k = jax.random.split(jax.random.key(2), 4)
  logp = jax.random.normal(k[0], (4, 6)) - 2.0
  old = logp + 0.1 * jax.random.normal(k[1], (4, 6))
  beh = old + 0.3 * jax.random.normal(k[2], (4, 6))
  mask = (jax.random.uniform(k[3], (4, 6)) > 0.4).astype(jnp.float32).at[:, 0].set(1.0)
  adv = jnp.array([1.0, -2.0, 0.5, 0.0])
  full, s_full = rl.policy_loss(logp, old, beh, adv, mask, n_samples=4)
  la, sa = rl.policy_loss(logp[:2], old[:2], beh[:2], adv[:2], mask[:2], n_samples=4)
  lb, sb = rl.policy_loss(logp[2:], old[2:], beh[2:], adv[2:], mask[2:], n_samples=4)
  np.testing.assert_allclose(la + lb, full, rtol=1e-6)
  m_full, m_acc = rl.finalize_stats(s_full), rl.finalize_stats(rl.combine_stats(sa, sb))
  for key in m_full:
    np.testing.assert_allclose(m_acc[key], m_full[key], rtol=1e-6, err_msg=key)


def test_k3_kl_values_and_clamp():
  lp = jnp.array([[-1.0, -1.0, -1.0]])
  ref = jnp.array([[-1.0, -1.0 + np.log(2.0), -1.0 + 100.0]])
  kl = rl.k3_kl(lp, ref, clamp=10.0)
  # d = 0 -> 0; d = log 2 -> 2 - log 2 - 1; d huge -> clamped to 10.
  np.testing.assert_allclose(kl, [[0.0, 1.0 - np.log(2.0), 10.0]], rtol=1e-6)
  loss0, _ = rl.policy_loss(lp, lp, lp, jnp.zeros(1), jnp.ones((1, 3)), 1)
  loss1, st = rl.policy_loss(lp, lp, lp, jnp.zeros(1), jnp.ones((1, 3)), 1, kl_beta=0.5,
                             logp_ref_BT=ref)
  np.testing.assert_allclose(loss1 - loss0, 0.5 * (1.0 - np.log(2.0) + 10.0) / 3, rtol=1e-6)
  assert "kl_mean" in rl.finalize_stats(st)
  with pytest.raises(ValueError, match="logp_ref_BT"):
    rl.policy_loss(lp, lp, lp, jnp.zeros(1), jnp.ones((1, 3)), 1, kl_beta=0.5)


def test_shape_errors():
  lp = jnp.zeros((2, 3))
  with pytest.raises(ValueError, match="advantages_B"):
    rl.policy_loss(lp, lp, lp, jnp.zeros(3), jnp.ones((2, 3)), 2)
  with pytest.raises(ValueError, match="logp_behaviour_BT"):
    rl.policy_loss(lp, lp, jnp.zeros((2, 4)), jnp.zeros(2), jnp.ones((2, 3)), 2)


def test_token_entropy():
  logits = jnp.array([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
  e = rl.token_entropy(logits, jnp.array([1.0]))
  np.testing.assert_allclose(e, [[np.log(4.0), 0.0]], atol=1e-5)
  # T = 0.5 sharpens: softmax([4, 0]).
  logits = jnp.array([[[2.0, 0.0]]])
  p = np.exp([4.0, 0.0]) / np.exp([4.0, 0.0]).sum()  # T = 0.5
  np.testing.assert_allclose(rl.token_entropy(logits, jnp.array([0.5])),
                             [[-(p * np.log(p)).sum()]], rtol=1e-5)
