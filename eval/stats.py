"""Score summaries: mean over samples, standard error and a bootstrap 95% CI over problems.

Samples of one problem are correlated (same question), so the error bars treat the problem as
the unit: the standard error is that of the mean of per-problem means (equal to the plain
binomial standard error when every problem has one sample), and the bootstrap resamples
problems with all of their samples. The bootstrap uses a fixed seed so a summary is
reproducible from its samples.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

BOOTSTRAP_ROUNDS = 2000
BOOTSTRAP_SEED = 0


def summarize(scores: Mapping[str, Sequence[float]]) -> dict:
  """scores: problem id -> its samples' scores in [0, 1]. Returns mean, stderr, ci95, n."""
  groups = [np.asarray(v, np.float64) for v in scores.values() if len(v)]
  n = int(sum(len(g) for g in groups))
  if not groups:
    return {"score": float("nan"), "stderr": float("nan"), "ci95": [float("nan")] * 2,
            "n": 0, "problems": 0}
  per_problem = np.asarray([g.mean() for g in groups])
  weights = np.asarray([len(g) for g in groups], np.float64)
  mean = float(np.concatenate(groups).mean())
  P = len(groups)
  stderr = float(per_problem.std(ddof=1) / math.sqrt(P)) if P > 1 else 0.0
  rng = np.random.default_rng(BOOTSTRAP_SEED)
  picks = rng.integers(0, P, size=(BOOTSTRAP_ROUNDS, P))
  sums = (per_problem * weights)[picks].sum(axis=1)
  boot = sums / weights[picks].sum(axis=1)
  lo, hi = np.percentile(boot, [2.5, 97.5])
  return {"score": mean, "stderr": stderr, "ci95": [float(lo), float(hi)], "n": n,
          "problems": P}
