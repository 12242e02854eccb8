"""The named records that cross module lines in the self-play loop: pool cards and samples.

A `Card` is one environment of the pool (where it came from, its code, its hint, how the agent
did on it at its regeneration step); a `Sample` is one trained sequence (tokens, loss mask,
behaviour log-probs, the temperature they were sampled at, its advantage). Both are frozen and
have a JSON form, because they live in checkpoints.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, Mapping

import numpy as np

# Where a pool environment came from: the designer, the hand-written starters, a frozen pool
# (fixed_grpo) or a parameterised family at some level (fixed_rlve).
DESIGNER, STARTER, FIXED, FAMILY = "designer", "starter", "fixed", "family"
SOURCES = (DESIGNER, STARTER, FIXED, FAMILY)
AGENT = "agent"  # the role of a sample: AGENT or DESIGNER
ROLES = (AGENT, DESIGNER)


@dataclasses.dataclass(frozen=True)
class Card:
  env_id: str
  skill: str
  code: str
  source: str  # one of SOURCES
  step: int  # the regeneration step that put it in the pool
  hint: str | None = None  # None: not hinted (starters) or hint generation failed
  doc_id: str = ""  # the corpus document the designer was given
  win_rate: float | None = None  # unhinted win rate at the regeneration step
  regret: float | None = None  # unfloored, at the regeneration step
  level: int | None = None  # a family instance's difficulty level (fixed_rlve)

  def __post_init__(self):
    if self.source not in SOURCES:
      raise ValueError(f"card {self.env_id}: source {self.source!r} is not one of {SOURCES}")


@dataclasses.dataclass(frozen=True)
class Sample:
  tokens: tuple[int, ...]
  mask: tuple[int, ...]  # 1 on trained (sampled) tokens
  logp: tuple[float, ...]  # behaviour log-prob of each trained token, 0 elsewhere
  temperature: float  # the sampling temperature; the learner scores at the same one
  role: str  # one of ROLES
  env_id: str
  skill: str = ""
  advantage: float = 0.0
  group: int = 0  # agent samples: the index of the environment they played this step
  # A MoE policy with routing replay: the experts the sampler routed each token to, int16
  # [len(tokens), sparse layers, k], -1 where it routed nothing (rl.routing_replay); else None.
  experts: np.ndarray | None = dataclasses.field(default=None, compare=False)

  def __post_init__(self):
    if self.role not in ROLES:
      raise ValueError(f"sample of {self.env_id}: role {self.role!r} is not one of {ROLES}")
    if not len(self.tokens) == len(self.mask) == len(self.logp):
      raise ValueError(f"sample of {self.env_id}: tokens, mask and logp lengths differ "
                       f"({len(self.tokens)}, {len(self.mask)}, {len(self.logp)})")

  @property
  def trained_tokens(self) -> int:
    return sum(self.mask)


def to_json(record) -> dict[str, Any]:
  d = dataclasses.asdict(record)
  if d.get("experts") is not None:  # int16 bytes, not a list of lists: 2 bytes per entry
    e = np.ascontiguousarray(d["experts"], np.int16)
    d["experts"] = {"shape": list(e.shape), "int16": base64.b64encode(e.tobytes()).decode()}
  return d


def card_from_json(d: Mapping[str, Any]) -> Card:
  return Card(**d)


def sample_from_json(d: Mapping[str, Any]) -> Sample:
  experts = d.get("experts")
  if experts is not None:
    experts = np.frombuffer(base64.b64decode(experts["int16"]), np.int16).reshape(
        experts["shape"]).copy()
  return Sample(**{**d, "tokens": tuple(d["tokens"]), "mask": tuple(d["mask"]),
                   "logp": tuple(d["logp"]), "experts": experts})
