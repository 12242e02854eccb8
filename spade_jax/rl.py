"""SPADE's RL maths as pure array functions: advantages, designer rewards, the policy loss.

Rewards and advantages (docs/method.md §6) are computed on the host from a few hundred returns, so they
are NumPy functions that reject non-finite input with a ValueError. The policy loss (§7) is a JAX
function traced inside the learner's jitted step; its shape checks run at trace time. It returns
the loss together with additive statistics (token sums and counts) so that micro-batches can be
accumulated exactly and reduced to metrics once, by `finalize_stats`.

Shape letters: B samples, T tokens, N designer samples, S skills.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax import logprobs


def _finite_1d(name: str, x) -> np.ndarray:
  x = np.asarray(x, np.float64)
  if x.ndim != 1:
    raise ValueError(f"{name} must be 1-D, got shape {x.shape}")
  if not np.all(np.isfinite(x)):
    bad = np.flatnonzero(~np.isfinite(x))
    raise ValueError(f"{name} has non-finite values at indices {bad.tolist()[:10]}")
  return x


def _same_length(a: np.ndarray, b: np.ndarray, names: str) -> None:
  if a.shape != b.shape:
    raise ValueError(f"{names} must have the same shape, got {a.shape} and {b.shape}")


# ---------------------------------------------------------------------------------------------
# Advantages


def agent_advantages(returns_B, group_B, eps: float = 1e-8) -> np.ndarray:
  """Per-group z-score (A - mean) / (population std + eps); a group of equal returns gets 0.

  group_B holds any hashable-as-int id per sample (the environment it played); groups need not
  be contiguous or equally sized.
  """
  r = _finite_1d("returns_B", returns_B)
  g = np.asarray(group_B)
  _same_length(r, g, "returns_B and group_B")
  out = np.zeros_like(r)
  for gid in np.unique(g):
    sel = g == gid
    x = r[sel]
    out[sel] = (x - x.mean()) / (x.std() + eps)  # np.std is the population std (ddof=0)
  return out.astype(np.float32)


def designer_scale(n_agent: int, n_designer: int, k: int, cap: float = 50.0) -> float:
  """min(n_agent / n_designer * k, cap): up-weights the rare designer samples (32 at 192/24/4)."""
  if n_designer <= 0:
    raise ValueError(f"n_designer must be positive, got {n_designer}")
  return float(min(n_agent / n_designer * k, cap))


def designer_advantages(reward_N, skill_N, scale: float) -> np.ndarray:
  """(reward - mean reward of the same skill) * scale; mean-centering only, no std division."""
  r = _finite_1d("reward_N", reward_N)
  s = np.asarray(skill_N)
  _same_length(r, s, "reward_N and skill_N")
  if not np.isfinite(scale):
    raise ValueError(f"scale must be finite, got {scale}")
  out = np.zeros_like(r)
  for sid in np.unique(s):
    sel = s == sid
    out[sel] = (r[sel] - r[sel].mean()) * scale
  return out.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Designer rewards


def regret(hinted_returns, unhinted_returns) -> float:
  """mean(hinted) - mean(unhinted): how much the privileged hint helps. Unfloored."""
  h = _finite_1d("hinted_returns", hinted_returns)
  u = _finite_1d("unhinted_returns", unhinted_returns)
  if h.size == 0 or u.size == 0:
    raise ValueError("regret needs at least one hinted and one unhinted return")
  return float(h.mean() - u.mean())


def regret_term(regret_N, saturation: float = 0.15):
  """min(1, max(0, regret / saturation)): floored at 0, saturates at `saturation`."""
  return np.clip(np.asarray(regret_N, np.float64) / saturation, 0.0, 1.0)


def anchor(win_rate_N, low: float = 0.4, high: float = 0.6, width: float = 0.25):
  """Flat-top anchor: 1 on [low, high], falling linearly to 0 over `width` on either side."""
  w = np.asarray(win_rate_N, np.float64)
  below = np.maximum(0.0, 1.0 - (low - w) / width)
  above = np.maximum(0.0, 1.0 - (w - high) / width)
  return np.where(w < low, below, np.where(w > high, above, 1.0))


def blend(regret_N, win_rate_N, regret_weight: float = 0.4, anchor_weight: float = 0.6,
          saturation: float = 0.15, low: float = 0.4, high: float = 0.6, width: float = 0.25):
  """The designer's default reward: regret_weight * regret_term + anchor_weight * anchor (>= 0)."""
  r = _finite_1d("regret_N", np.atleast_1d(regret_N))
  w = _finite_1d("win_rate_N", np.atleast_1d(win_rate_N))
  _same_length(r, w, "regret_N and win_rate_N")
  return (regret_weight * regret_term(r, saturation) +
          anchor_weight * anchor(w, low, high, width))


def solve_rate_reward(win_rate_N, low: float = 0.4, high: float = 0.6, width: float = 0.25):
  """Ablation `solve_rate`: the anchor alone."""
  return anchor(_finite_1d("win_rate_N", np.atleast_1d(win_rate_N)), low, high, width)


def regret_reward(hinted_mean_N, unhinted_all_mean_N, hint_ok_N):
  """Ablation `regret`: max(0, mean hinted - mean of ALL unhinted plays of the window); 0 where
  the hint failed (no hinted return to compare)."""
  h = _finite_1d("hinted_mean_N", np.atleast_1d(hinted_mean_N))
  u = _finite_1d("unhinted_all_mean_N", np.atleast_1d(unhinted_all_mean_N))
  _same_length(h, u, "hinted_mean_N and unhinted_all_mean_N")
  ok = np.broadcast_to(np.asarray(hint_ok_N, bool), h.shape)
  return np.where(ok, np.maximum(0.0, h - u), 0.0)


def ema(prev, x, g: float):
  """(1 - g) * prev + g * x: `g` is the weight of the NEW value (docs/method.md §6)."""
  return (1.0 - g) * np.asarray(prev, np.float64) + g * np.asarray(x, np.float64)


def learning_potential_reward(win_rate_N, slow_N):
  """Ablation `learning_potential`: |an environment's window win rate - its skill's slow moving
  average of win rate|, per environment (then centred per skill like every designer reward)."""
  w = _finite_1d("win_rate_N", np.atleast_1d(win_rate_N))
  s = _finite_1d("slow_N", np.atleast_1d(slow_N))
  _same_length(w, s, "win_rate_N and slow_N")
  return np.abs(w - s)


class EnvSignals(NamedTuple):
  """What a closing window measured, one entry per environment that was played (N)."""
  regret_N: np.ndarray  # mean hinted - mean unhinted at offset 0 (unfloored; 0: hint failed)
  win_rate_N: np.ndarray  # mean of all unhinted returns of the window
  hinted_mean_N: np.ndarray  # mean hinted return (unused where hint_ok_N is False)
  unhinted_mean_N: np.ndarray  # = win_rate_N's returns, kept apart for the `regret` variant
  hint_ok_N: np.ndarray  # bool: a hint was written and some hinted plays ran
  slow_N: np.ndarray  # the environment's skill's slow win-rate average before this window


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """The designer reward's knobs (configs/spade.py `reward`)."""
  variant: str = "blend"
  regret_weight: float = 0.4
  anchor_weight: float = 0.6
  regret_scale: float = 0.15
  band_low: float = 0.4
  band_high: float = 0.6
  ramp: float = 0.25
  lp_fast: float = 0.98  # weight of the new window's win rate in the fast average
  lp_slow: float = 0.85  # ... and in the slow one
  scale_cap: float = 50.0

  def band(self) -> dict[str, float]:
    return dict(low=self.band_low, high=self.band_high, width=self.ramp)


# Every designer reward variant: EnvSignals, RewardConfig -> reward_N (before centring).
DESIGNER_REWARDS = {
    "blend": lambda s, c: blend(s.regret_N, s.win_rate_N, c.regret_weight, c.anchor_weight,
                                c.regret_scale, **c.band()),
    "solve_rate": lambda s, c: solve_rate_reward(s.win_rate_N, **c.band()),
    "regret": lambda s, c: regret_reward(s.hinted_mean_N, s.unhinted_mean_N, s.hint_ok_N),
    "learning_potential": lambda s, c: learning_potential_reward(s.win_rate_N, s.slow_N),
}


def designer_reward(signals: EnvSignals, cfg: RewardConfig) -> np.ndarray:
  """The configured variant's reward per environment."""
  if cfg.variant not in DESIGNER_REWARDS:
    raise ValueError(f"unknown designer reward variant {cfg.variant!r}; "
                     f"known: {sorted(DESIGNER_REWARDS)}")
  return np.asarray(DESIGNER_REWARDS[cfg.variant](signals, cfg), np.float64)


# ---------------------------------------------------------------------------------------------
# The policy loss


def token_entropy(logits_BTV, temperature_B):
  """Entropy of softmax(logits / T) per position, float32 [B, T]; T <= 0 (greedy) counts as 1."""
  z = logprobs.tempered(logits_BTV, temperature_B)
  return logprobs.entropy(z, jax.nn.logsumexp(z, axis=-1))


def k3_kl(logp_BT, logp_ref_BT, clamp: float = 10.0):
  """k3 estimator of KL(theta || ref): exp(d) - d - 1 with d = ref - theta, clamped for
  stability (the log-ratio to +-2*clamp before the exp, the estimate to [0, clamp])."""
  d = jnp.clip(logp_ref_BT - logp_BT, -2.0 * clamp, 2.0 * clamp)
  return jnp.clip(jnp.exp(d) - d - 1.0, 0.0, clamp)


def policy_loss(logp_BT, logp_old_BT, logp_behaviour_BT, advantages_B, mask_BT, n_samples, *,
                eps_low: float = 0.2, eps_high: float = 0.28, tis_cap: float = 2.0,
                kl_beta: float = 0.0, logp_ref_BT=None, kl_clamp: float = 10.0,
                entropy_BT=None):
  """SPADE's loss (§7): asymmetric PPO-clip, truncated IS, per-sample token mean, batch mean.

    ratio = exp(logp - logp_old)
    pg    = max(-ratio * A, -clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    w     = min(exp(logp_old - logp_behaviour), tis_cap)            (stop-gradient)
    loss  = sum_i [sum_t mask * (w * pg + beta * k3) / sum_t mask] / n_samples

  `n_samples` is the number of samples with a non-empty mask in the WHOLE batch, so the losses of
  micro-batches add up to the full-batch loss. A sample whose mask is all zero (batch padding)
  contributes nothing. Returns (loss, stats): stats are additive sums (or maxima, for keys ending
  in "_max") over this micro-batch; `finalize_stats` turns their total into metrics.
  """
  B, T = mask_BT.shape
  for name, x in (("logp_BT", logp_BT), ("logp_old_BT", logp_old_BT),
                  ("logp_behaviour_BT", logp_behaviour_BT), ("logp_ref_BT", logp_ref_BT),
                  ("entropy_BT", entropy_BT)):
    if x is not None and x.shape != (B, T):
      raise ValueError(f"{name} has shape {x.shape}, expected mask_BT's {(B, T)}")
  if advantages_B.shape != (B,):
    raise ValueError(f"advantages_B has shape {advantages_B.shape}, expected {(B,)}")
  if kl_beta != 0.0 and logp_ref_BT is None:
    raise ValueError("kl_beta != 0 needs logp_ref_BT")

  mask = mask_BT.astype(jnp.float32)
  on = mask > 0
  n_tok_B = mask.sum(axis=1)
  # 1 / (tokens of the sample * samples in the batch); 0 for empty rows, never 0/0.
  row_w_B = jnp.where(n_tok_B > 0, 1.0 / jnp.maximum(n_tok_B, 1.0), 0.0) / n_samples
  A = advantages_B.astype(jnp.float32)[:, None]

  logp_old = jax.lax.stop_gradient(logp_old_BT)
  # Masked positions may hold anything (padding); keep them out of every exp.
  log_ratio = jnp.where(on, logp_BT - logp_old, 0.0)
  ratio = jnp.exp(log_ratio)
  pg = jnp.maximum(-ratio * A, -jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * A)
  behaviour_gap = jnp.where(on, logp_old - logp_behaviour_BT, 0.0)
  is_w = jax.lax.stop_gradient(jnp.minimum(jnp.exp(behaviour_gap), tis_cap))
  per_tok = is_w * pg
  stats = {}
  if kl_beta != 0.0:
    kl = jnp.where(on, k3_kl(logp_BT, logp_ref_BT, kl_clamp), 0.0)
    per_tok = per_tok + kl_beta * kl
    stats["kl_sum"] = jnp.sum(kl * mask)
  loss = jnp.sum(per_tok * mask * row_w_B[:, None])

  sg = jax.lax.stop_gradient
  ratio_sg = sg(ratio)
  clip_low = on & (A < 0) & (ratio_sg < 1.0 - eps_low)
  clip_high = on & (A > 0) & (ratio_sg > 1.0 + eps_high)
  stats.update(
      tokens=mask.sum(),
      samples=jnp.sum(n_tok_B > 0).astype(jnp.float32),
      nonzero_adv_samples=jnp.sum((n_tok_B > 0) & (advantages_B != 0)).astype(jnp.float32),
      clip_low_sum=jnp.sum(clip_low).astype(jnp.float32),
      clip_high_sum=jnp.sum(clip_high).astype(jnp.float32),
      ratio_sum=jnp.sum(ratio_sg * mask),
      is_weight_sum=jnp.sum(is_w * mask),
      is_weight_max=jnp.max(jnp.where(on, is_w, -jnp.inf)),
      abs_logp_diff_sum=jnp.sum(jnp.abs(sg(logp_BT) - jnp.where(on, logp_behaviour_BT, 0.0))
                                * mask),
      pg_loss=sg(jnp.sum(pg * is_w * mask * row_w_B[:, None])),
  )
  if entropy_BT is not None:
    stats["entropy_sum"] = jnp.sum(sg(entropy_BT) * mask)
  return loss, stats


def combine_stats(a: Mapping[str, jax.Array], b: Mapping[str, jax.Array]) -> dict:
  """Adds two micro-batches' stats (maxima for "_max" keys)."""
  return {k: (jnp.maximum(a[k], b[k]) if k.endswith("_max") else a[k] + b[k]) for k in a}


def finalize_stats(stats: Mapping[str, jax.Array]) -> dict:
  """Whole-batch metrics from summed stats: means over masked tokens / non-empty samples."""
  tok = jnp.maximum(stats["tokens"], 1.0)
  out = {
      "tokens": stats["tokens"],
      "samples": stats["samples"],
      "pg_loss": stats["pg_loss"],
      "clip_frac_low": stats["clip_low_sum"] / tok,
      "clip_frac_high": stats["clip_high_sum"] / tok,
      "ratio_mean": stats["ratio_sum"] / tok,
      "is_weight_mean": stats["is_weight_sum"] / tok,
      "is_weight_max": stats["is_weight_max"],
      "abs_logp_diff_mean": stats["abs_logp_diff_sum"] / tok,
      "nonzero_adv_frac": stats["nonzero_adv_samples"] / jnp.maximum(stats["samples"], 1.0),
  }
  if "kl_sum" in stats:
    out["kl_mean"] = stats["kl_sum"] / tok
  if "entropy_sum" in stats:
    out["entropy_mean"] = stats["entropy_sum"] / tok
  return out


# ---------------------------------------------------------------------------------------------
# Routing replay (a mixture-of-experts policy)


def routing_replay(segments, length: int) -> np.ndarray:
  """One row of the learner's `experts_BTLk`: the experts the sampler routed a conversation's
  tokens to, int16 [length, sparse layers, k], in token order from position 0, -1 (route
  afresh) past the given tokens.

  `segments` are, call by call, the sampler's `Output.prefill_experts[i]` and then
  `Output.experts[i, :Output.lengths[i] - 1]`: together every token of the conversation but its
  last, which predicts nothing. A left-padded batch row shifts the result by its padding.
  """
  parts = [np.asarray(s) for s in segments]
  if not parts or any(p.ndim != 3 or p.shape[1:] != parts[0].shape[1:] for p in parts):
    raise ValueError(f"routing segments must be [n, layers, k] arrays of one shape, got "
                     f"{[p.shape for p in parts]}")
  routed = np.concatenate(parts).astype(np.int16)
  if len(routed) > length:
    raise ValueError(f"{len(routed)} routed tokens do not fit a row of {length}")
  out = np.full((length, *routed.shape[1:]), -1, np.int16)
  out[:len(routed)] = routed
  return out
