"""Pictures of a run: PNG plots in `<workdir>/plots/`, drawn from metrics rows (`outputs.read`).

The loop rewrites them after every step, so a killed run still has pictures of the steps it
finished. Each file is written to a temporary name in the same folder and renamed over the old
one, so a reader (or a kill) never sees half a PNG. Rows come from several kinds of step
(regeneration or not, window-closing or not, learner skipped), so every figure takes only the
rows that carry its keys and is left out while none do.

Drawing uses matplotlib's object API on an Agg canvas chosen here, at call time: nothing needs a
display, and the process-wide pyplot backend and figure registry are left alone. matplotlib is
imported only when a figure is drawn.
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Any, Callable, Mapping, Sequence

from spade_jax.selfplay import progress as progress_lib

Row = Mapping[str, Any]
DIR = "plots"


def _num(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def series(rows: Sequence[Row], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of the rows where `key` is a finite number."""
  pts = [(r["step"], float(r[key])) for r in rows if _num(r.get(key)) and _num(r.get("step"))]
  return [s for s, _ in pts], [v for _, v in pts]


def skipped_steps(rows: Sequence[Row]) -> list[int]:
  """Steps whose learner did not update: nothing to train, or a non-finite step left undone."""
  return [r["step"] for r in rows if "learner_skipped" in r or r.get("skipped") == 1.0]


def rejections(rows: Sequence[Row]) -> tuple[list[int], dict[str, list[int]]]:
  """Regeneration steps and, per outcome ("admitted", then each check that rejected), counts."""
  regen = [r for r in rows if _num(r.get("designer_attempts"))]
  checks = sorted({k for r in regen for k in (r.get("designer_rejections") or {})})
  out = {"admitted": [int(r.get("designer_admitted") or 0) for r in regen]}
  for k in checks:
    out[f"rejected: {k}"] = [int((r.get("designer_rejections") or {}).get(k, 0)) for r in regen]
  return [r["step"] for r in regen], out


def time_parts(rows: Sequence[Row]) -> tuple[list[int], dict[str, list[float]]]:
  timed = [r for r in rows if _num(r.get("time_total_s"))]
  splits = [progress_lib.time_split(r) for r in timed]
  names = [n for n, _ in progress_lib.TIME_PARTS] + ["other"]
  return [r["step"] for r in timed], {n: [s[n] for s in splits] for n in names}


# ---- figures: rows -> (figure | None when no row carries the figure's keys)

def figure(n_axes: int, title: str, rows: Sequence[Row]):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator

  fig = Figure(figsize=(6.4, 1.2 + 2.2 * n_axes), dpi=100, layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(n_axes, 1, sharex=True, squeeze=False)[:, 0]
  steps = [r["step"] for r in rows if _num(r.get("step"))]
  for ax in axes:
    ax.grid(alpha=0.3)
    if steps:  # every figure spans the whole run, so they line up (and one step is no sliver)
      lo, hi = int(min(steps)), int(max(steps))
      ax.set_xlim(lo - 0.6, hi + 0.6)
      if hi - lo < 16:  # the locator falls back to fractions below a span of ~1
        ax.set_xticks(range(lo, hi + 1))
      else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  axes[-1].set_xlabel("rollout step")
  fig.suptitle(title)
  return fig, axes


def _lines(ax, rows, keys: Sequence[tuple[str, str]]) -> bool:
  drawn = False
  for key, label in keys:
    x, y = series(rows, key)
    if x:
      ax.plot(x, y, marker="o", label=label)
      drawn = True
  if drawn:
    ax.legend(fontsize="small")
  return drawn


def _stacked(ax, steps, parts: Mapping[str, Sequence[float]]) -> None:
  bottom = [0.0] * len(steps)
  for name, vals in parts.items():
    ax.bar(steps, vals, bottom=bottom, width=0.8, label=name)
    bottom = [b + v for b, v in zip(bottom, vals)]
  ax.legend(fontsize="small")


def agent(rows):
  if not (series(rows, "agent_return_mean")[0] or series(rows, "agent_win_rate")[0]):
    return None
  fig, (a, b) = figure(2, "Agent (unhinted plays)", rows)
  _lines(a, rows, [("agent_return_mean", "mean return")])
  _lines(b, rows, [("agent_win_rate", "win rate")])
  b.set_ylim(-0.05, 1.05)
  return fig


def designer_admission(rows):
  steps, parts = rejections(rows)
  if not steps:
    return None
  fig, (a, b) = figure(2, "Designer admission (regeneration steps)", rows)
  _lines(a, rows, [("designer_admission_rate", "admission rate")])
  a.set_ylim(-0.05, 1.05)
  _stacked(b, steps, parts)
  b.set_ylabel("programs")
  return fig


def designer_reward(rows):
  keys = [("designer_reward_mean", "reward"), ("designer_regret_mean", "regret"),
          ("designer_anchor_mean", "anchor"), ("designer_win_rate_mean", "window win rate")]
  if not any(series(rows, k)[0] for k, _ in keys):
    return None
  fig, (a,) = figure(1, "Designer reward per window (at the step that closes it)", rows)
  _lines(a, rows, keys)
  return fig


def learner(rows):
  skipped = skipped_steps(rows)
  groups = [[("loss", "loss"), ("pg_loss", "policy-gradient loss")],
            [("clip_frac_low", "clipped low"), ("clip_frac_high", "clipped high")],
            [("is_weight_mean", "IS weight mean"), ("is_weight_max", "IS weight max"),
             ("ratio_mean", "ratio mean")]]
  if not skipped and not any(series(rows, k)[0] for g in groups for k, _ in g):
    return None
  fig, axes = figure(3, "Learner", rows)
  for ax, keys in zip(axes, groups):
    _lines(ax, rows, keys)
    for j, s in enumerate(skipped):
      ax.axvline(s, color="grey", linestyle="--", label="learner skipped" if j == 0 else None)
    if skipped:
      ax.legend(fontsize="small")
  axes[1].set_ylabel("fraction of tokens")
  return fig


def time_split(rows):
  steps, parts = time_parts(rows)
  if not steps:
    return None
  fig, (a,) = figure(1, "Wall time per step", rows)
  _stacked(a, steps, parts)
  a.set_ylabel("seconds")
  return fig


FIGURES: tuple[tuple[str, str, Callable], ...] = (  # file, caption, drawing
    ("agent.png", "Agent mean return and win rate per step", agent),
    ("designer_admission.png", "Designer admission rate and rejections by check, per "
     "regeneration step", designer_admission),
    ("designer_reward.png", "Designer reward, regret and anchor per window", designer_reward),
    ("learner.png", "Loss, clip fractions and IS weights per step (dashed: learner skipped)",
     learner),
    ("time.png", "Wall time per step: sampling, env wait, learner, regeneration, other",
     time_split),
)


def save_png(fig, path: str) -> None:
  """Writes `fig` to `path` through a temporary file in the same folder (one rename)."""
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                             dir=os.path.dirname(path) or ".")
  try:
    with os.fdopen(fd, "wb") as f:
      fig.savefig(f, format="png")
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the pictures are for everyone
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def write_all(workdir: str, rows: Sequence[Row]) -> dict[str, str]:
  """Draws every figure of FIGURES into `<workdir>/plots/`; a figure without data is removed
  (so the report never links a stale picture). Returns {file: error} of those that failed."""
  d = os.path.join(workdir, DIR)
  os.makedirs(d, exist_ok=True)
  failed = {}
  for name, _, draw in FIGURES:
    path = os.path.join(d, name)
    try:
      fig = draw(rows)
      if fig is None:
        if os.path.exists(path):
          os.unlink(path)
        continue
      save_png(fig, path)
    except Exception as e:  # noqa: BLE001 -- one bad figure must not cost the others
      failed[name] = f"{type(e).__name__}: {e}"
  return failed


def existing(workdir: str) -> list[tuple[str, str]]:
  """(relative path, caption) of each figure file present in the workdir, in FIGURES order."""
  return [(f"{DIR}/{name}", caption) for name, caption, _ in FIGURES
          if os.path.isfile(os.path.join(workdir, DIR, name))]
