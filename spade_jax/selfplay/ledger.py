"""Delayed designer rewards (docs/method.md §5–6): what a regeneration window records and pays out.

A window starts at a regeneration step t and lasts k steps. It records, per new environment,
the hinted returns (measured at t only) and the unhinted returns of every step, keyed by the
offset within the window; it also holds the designer samples written at t (tokens and their
behaviour log-probs). When the window closes (at t + k, or when the run ends), each designer
sample is paid:

  regret   = mean(hinted) - mean(unhinted at offset 0)     (0 if the hint failed)
  win_rate = mean(all unhinted returns of the window)
  reward   = blend / solve_rate / regret / learning_potential variant

A window is plain JSON data, so it lives in checkpoints as is.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from spade_jax import rl

Window = dict[str, Any]


def new_window(start: int) -> Window:
  return {"start": start, "envs": {}, "designer": []}


def add_env(w: Window, env_id: str, skill: str, hinted: list[float] | None) -> None:
  """A new environment of this window; `hinted=None` means hint generation failed."""
  w["envs"][env_id] = {"skill": skill, "hinted": hinted, "unhinted": {}}


def add_designer_sample(w: Window, sample: Mapping[str, Any]) -> None:
  """A designer sample (env_id, skill, tokens, mask, logp, temperature), paid at window close."""
  w["designer"].append(dict(sample))


def record_unhinted(w: Window, step: int, returns: Mapping[str, list[float]]) -> None:
  """Unhinted returns of this step for the window's environments (others are ignored)."""
  offset = str(step - w["start"])
  for env_id, rs in returns.items():
    if env_id in w["envs"]:
      w["envs"][env_id]["unhinted"][offset] = [float(r) for r in rs]


def env_stats(env: Mapping[str, Any]) -> dict[str, float]:
  """Unfloored regret at offset 0, window win rate, and the two means the variants use."""
  unhinted = env["unhinted"]
  first = unhinted.get("0", [])
  everything = [r for rs in unhinted.values() for r in rs]
  if not first:
    raise ValueError("an environment of the window has no unhinted plays at offset 0")
  hinted = env["hinted"]
  reg = rl.regret(hinted, first) if hinted else 0.0
  return {"regret": float(reg), "win_rate": float(np.mean(everything)),
          "win_rate_0": float(np.mean(first)),
          "hinted_mean": float(np.mean(hinted)) if hinted else float(np.mean(first)),
          "unhinted_mean": float(np.mean(everything))}


def rewards(w: Window, rcfg, lp_state: dict[str, list[float]]
            ) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, list[float]]]:
  """({env_id: designer reward}, {env_id: stats}, updated learning-potential EMAs)."""
  env_ids = sorted(w["envs"])
  if not env_ids:
    return {}, {}, lp_state
  stats = {e: env_stats(w["envs"][e]) for e in env_ids}
  reg = np.array([stats[e]["regret"] for e in env_ids])
  win = np.array([stats[e]["win_rate"] for e in env_ids])
  band = dict(low=rcfg.band_low, high=rcfg.band_high, width=rcfg.ramp)
  lp_state = {k: list(v) for k, v in lp_state.items()}
  if rcfg.variant == "blend":
    r = rl.blend(reg, win, rcfg.regret_weight, rcfg.anchor_weight, rcfg.regret_scale, **band)
  elif rcfg.variant == "solve_rate":
    r = rl.solve_rate_reward(win, **band)
  elif rcfg.variant == "regret":
    r = rl.regret_reward([stats[e]["hinted_mean"] for e in env_ids],
                         [stats[e]["unhinted_mean"] for e in env_ids])
  elif rcfg.variant == "learning_potential":
    skills = [w["envs"][e]["skill"] for e in env_ids]
    potential = {}
    for skill in sorted(set(skills)):
      rate = float(np.mean([s for s, k in zip(win, skills) if k == skill]))
      fast, slow = lp_state.get(skill, [rate, rate])  # first sighting: potential 0
      fast, slow, pot = rl.learning_potential([fast], [slow], [rate], rcfg.lp_fast, rcfg.lp_slow)
      lp_state[skill] = [float(fast[0]), float(slow[0])]
      potential[skill] = float(pot[0])
    r = np.array([potential[k] for k in skills])
  else:
    raise ValueError(f"unknown designer reward variant {rcfg.variant!r}; "
                     f"known: {rl.DESIGNER_REWARDS}")
  for e, value, a in zip(env_ids, np.atleast_1d(r), rl.anchor(win, **band)):
    stats[e].update(reward=float(value), anchor=float(a))
  return {e: stats[e]["reward"] for e in env_ids}, stats, lp_state


def paid_samples(w: Window, reward_of: Mapping[str, float], n_agent: int, k: int,
                 scale_cap: float) -> list[dict[str, Any]]:
  """The window's designer samples with their advantages: per-skill mean-centred reward times
  min(n_agent / n_designer * k, cap). Samples of environments without a reward are dropped."""
  samples = [s for s in w["designer"] if s["env_id"] in reward_of]
  if not samples:
    return []
  scale = rl.designer_scale(n_agent, len(samples), k, scale_cap)
  adv = rl.designer_advantages([reward_of[s["env_id"]] for s in samples],
                               [s["skill"] for s in samples], scale)
  return [dict(s, advantage=float(a)) for s, a in zip(samples, adv)]
