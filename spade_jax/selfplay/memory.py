"""The designer's memory of its past environments (docs/method.md §8).

One record per admitted environment: skill, the first `code_chars` characters of its code, the
agent's win rate at the regeneration step, the unfloored regret, and the step. The memory is a
FIFO of `capacity` records. For a designer prompt of a given skill it offers positives (sampled
from the highest-regret records whose win rate is inside the learnable band) and one negative
(from records the agent always or never wins). It is plain JSON: saved in the workdir and in
checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Record:
  skill: str
  code: str
  win_rate: float
  regret: float
  step: int
  env_id: str = ""


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
  capacity: int = 200
  code_chars: int = 2000
  n_positive: int = 2
  top_regret: int = 10
  band: tuple[float, float] = (0.15, 0.85)
  n_negative: int = 1
  negative_above: float = 0.9
  negative_below: float = 0.1


def add(records: Sequence[Record], record: Record, cfg: MemoryConfig) -> list[Record]:
  """A new list with `record` appended (code truncated) and the oldest dropped past capacity."""
  record = dataclasses.replace(record, code=record.code[:cfg.code_chars])
  return (list(records) + [record])[-cfg.capacity:]


def examples(records: Sequence[Record], skill: str, cfg: MemoryConfig, rng: np.random.Generator
             ) -> tuple[list[Record], list[Record]]:
  """(positives, negatives) for a designer prompt of `skill`, sampled without replacement."""
  same = [r for r in records if r.skill == skill]
  lo, hi = cfg.band
  learnable = [r for r in same if lo <= r.win_rate <= hi]
  learnable.sort(key=lambda r: (-r.regret, -r.step))  # ties: the newer record first
  top = learnable[:cfg.top_regret]
  bad = [r for r in same if r.win_rate > cfg.negative_above or r.win_rate < cfg.negative_below]

  def pick(pool, n):
    if not pool:
      return []
    idx = rng.choice(len(pool), size=min(n, len(pool)), replace=False)
    return [pool[i] for i in sorted(idx)]

  return pick(top, cfg.n_positive), pick(bad, cfg.n_negative)


def to_json(records: Sequence[Record]) -> list[dict[str, Any]]:
  return [dataclasses.asdict(r) for r in records]


def from_json(data: Sequence[dict[str, Any]]) -> list[Record]:
  return [Record(**d) for d in data]


def save(path: str, records: Sequence[Record]) -> None:
  """Atomic write: a crash leaves the previous file intact."""
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(to_json(records), f, indent=1)
  os.replace(tmp, path)


def load(path: str) -> list[Record]:
  with open(path) as f:
    return from_json(json.load(f))
