"""Delayed designer rewards (docs/method.md §5–6): what a regeneration window records and pays.

A window opens at a regeneration step t and lasts k steps. It holds, per new environment, the
hinted returns (measured at t only) and the unhinted returns of every step keyed by the offset
within the window, and the designer samples written at t. When it closes (at t + k; the run's
last window at its last step, if complete), each environment's designer sample is paid:

  regret   = mean(hinted) - mean(unhinted at offset 0)     (0 if the hint failed)
  win_rate = mean(all unhinted returns of the window)
  reward   = the configured variant (rl.DESIGNER_REWARDS), centred per skill, times the scale

An environment that was never played at offset 0 (its plays failed to start at the regeneration
step) was never measured: its designer sample is dropped, not paid zero. It was admitted, so the
designer is not to blame for a crash the validator could not see, and a zero would push every
other sample of its skill up by the centring; the method's rule for failed attempts (no sample,
no penalty) is applied instead, and the window counts it as `unmeasured`.

Windows are immutable values: every function returns a new one. Plain JSON in checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from spade_jax import rl
from spade_jax.selfplay import records


@dataclasses.dataclass(frozen=True)
class EnvTrack:
  skill: str
  hinted: tuple[float, ...] | None  # None: no hint, or none of its hinted plays ran
  unhinted: Mapping[int, tuple[float, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Window:
  start: int
  envs: Mapping[str, EnvTrack]
  designer: tuple[records.Sample, ...]


@dataclasses.dataclass(frozen=True)
class Payout:
  samples: list[records.Sample]  # the paid designer samples, with advantages
  stats: dict[str, dict[str, float]]  # env_id -> regret, win_rate, anchor, reward, ...
  unmeasured: list[str]  # environments never played at offset 0: not paid
  skill_emas: dict[str, tuple[float, float]]  # updated (fast, slow) win-rate averages


def new_window(start: int, envs: Mapping[str, tuple[str, Sequence[float] | None]],
               designer: Sequence[records.Sample]) -> Window:
  """envs: env_id -> (skill, hinted returns or None when the hint failed)."""
  tracks = {e: EnvTrack(skill, None if h is None else tuple(float(x) for x in h))
            for e, (skill, h) in envs.items()}
  return Window(start, tracks, tuple(designer))


def record_unhinted(w: Window, step: int, returns: Mapping[str, Sequence[float]]) -> Window:
  """The window with this step's unhinted returns of its environments (others are ignored)."""
  offset = step - w.start
  envs = dict(w.envs)
  for env_id, rs in returns.items():
    if env_id in envs and rs:
      t = envs[env_id]
      envs[env_id] = dataclasses.replace(
          t, unhinted={**t.unhinted, offset: tuple(float(r) for r in rs)})
  return dataclasses.replace(w, envs=envs)


def complete(w: Window, k: int) -> bool:
  """Whether every step of the window has been played (offsets 0 .. k-1 recorded)."""
  offsets = {o for t in w.envs.values() for o in t.unhinted}
  return bool(w.envs) and max(offsets, default=-1) >= k - 1


def env_stats(env: EnvTrack) -> dict[str, float] | None:
  """Unfloored regret at offset 0, window win rate and the means the variants use; None for an
  environment never played at offset 0."""
  first = env.unhinted.get(0, ())
  if not first:
    return None
  everything = [r for rs in env.unhinted.values() for r in rs]
  hint_ok = bool(env.hinted)
  return {"regret": rl.regret(env.hinted, first) if hint_ok else 0.0,
          "win_rate": float(np.mean(everything)), "win_rate_0": float(np.mean(first)),
          "hinted_mean": float(np.mean(env.hinted)) if hint_ok else 0.0,
          "unhinted_mean": float(np.mean(everything)), "hint_ok": float(hint_ok)}


def close(w: Window, cfg: rl.RewardConfig, skill_emas: Mapping[str, Sequence[float]],
          n_agent: int, k: int) -> Payout:
  """Pays the window: rewards of the measured environments, per-skill centred advantages times
  min(n_agent / n_paid * k, cap), and the skills' win-rate averages moved by this window."""
  stats = {e: s for e in sorted(w.envs) if (s := env_stats(w.envs[e])) is not None}
  unmeasured = sorted(set(w.envs) - set(stats))
  emas = {s: (float(v[0]), float(v[1])) for s, v in skill_emas.items()}
  if not stats:
    return Payout([], {}, unmeasured, emas)
  ids = list(stats)
  skill = [w.envs[e].skill for e in ids]
  col = lambda key: np.array([stats[e][key] for e in ids])
  skill_rate = {s: float(np.mean([stats[e]["win_rate"] for e, k_ in zip(ids, skill) if k_ == s]))
                for s in sorted(set(skill))}
  # A skill seen for the first time starts its averages at this window's rate.
  before = {s: emas.get(s, (r, r)) for s, r in skill_rate.items()}
  signals = rl.EnvSignals(col("regret"), col("win_rate"), col("hinted_mean"),
                          col("unhinted_mean"), col("hint_ok") > 0,
                          np.array([before[s][1] for s in skill]))
  reward = rl.designer_reward(signals, cfg)
  for s, r in skill_rate.items():
    fast, slow = before[s]
    emas[s] = (float(rl.ema(fast, r, cfg.lp_fast)), float(rl.ema(slow, r, cfg.lp_slow)))
  for e, value, a in zip(ids, reward, rl.anchor(signals.win_rate_N, **cfg.band())):
    stats[e].update(reward=float(value), anchor=float(a))
  paid = [s for s in w.designer if s.env_id in stats]
  if not paid:
    return Payout([], stats, unmeasured, emas)
  scale = rl.designer_scale(n_agent, len(paid), k, cfg.scale_cap)
  adv = rl.designer_advantages([stats[s.env_id]["reward"] for s in paid],
                               [s.skill for s in paid], scale)
  paid = [dataclasses.replace(s, advantage=float(a)) for s, a in zip(paid, adv)]
  return Payout(paid, stats, unmeasured, emas)


def to_json(w: Window | None) -> dict[str, Any] | None:
  if w is None:
    return None
  return {"start": w.start, "designer": [records.to_json(s) for s in w.designer],
          "envs": {e: {"skill": t.skill, "hinted": None if t.hinted is None else list(t.hinted),
                       "unhinted": {str(o): list(rs) for o, rs in t.unhinted.items()}}
                   for e, t in w.envs.items()}}


def from_json(d: Mapping[str, Any] | None) -> Window | None:
  if d is None:
    return None
  envs = {e: EnvTrack(t["skill"], None if t["hinted"] is None else tuple(t["hinted"]),
                      {int(o): tuple(rs) for o, rs in t["unhinted"].items()})
          for e, t in d["envs"].items()}
  return Window(d["start"], envs, tuple(records.sample_from_json(s) for s in d["designer"]))
