"""The self-play loop's host state: one immutable value that each phase takes and returns.

It holds what the next step needs and cannot derive: the next step, the pool, the memory, the
open regeneration window, the skills' win-rate averages (the `learning_potential` variant) and
the corpus position. The regeneration index is not stored: it is `step // k`. It is saved in
every checkpoint as JSON, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from spade_jax.selfplay import ledger, memory as memory_lib, records, rlve


@dataclasses.dataclass(frozen=True)
class HostState:
  step: int = 0  # the next rollout step
  pool: tuple[records.Card, ...] = ()
  memory: tuple[memory_lib.Record, ...] = ()
  window: ledger.Window | None = None
  skill_emas: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
  corpus: Mapping[str, Any] | None = None  # the corpus iterator's state
  rlve: rlve.State | None = None  # fixed_rlve: each family's difficulty window


def to_json(h: HostState) -> dict[str, Any]:
  return {"step": h.step, "pool": [records.to_json(c) for c in h.pool],
          "memory": memory_lib.to_json(h.memory), "window": ledger.to_json(h.window),
          "skill_emas": {s: list(v) for s, v in h.skill_emas.items()},
          "corpus": None if h.corpus is None else dict(h.corpus),
          "rlve": None if h.rlve is None else rlve.to_json(h.rlve)}


def from_json(d: Mapping[str, Any]) -> HostState:
  missing = {"step", "pool", "memory", "window", "skill_emas", "corpus", "rlve"} - set(d)
  if missing:
    raise ValueError(f"checkpoint host state lacks {sorted(missing)}: it was written by another "
                     "version of the loop")
  return HostState(int(d["step"]), tuple(records.card_from_json(c) for c in d["pool"]),
                   tuple(memory_lib.from_json(d["memory"])), ledger.from_json(d["window"]),
                   {s: (float(v[0]), float(v[1])) for s, v in d["skill_emas"].items()},
                   d["corpus"], None if d["rlve"] is None else rlve.from_json(d["rlve"]))
