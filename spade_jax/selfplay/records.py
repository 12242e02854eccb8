"""The named records that cross module lines in the self-play loop: pool cards and samples.

A `Card` is one environment of the pool (where it came from, its code, its hint, how the agent
did on it at its regeneration step); a `Sample` is one trained sequence (tokens, loss mask,
behaviour log-probs, the temperature they were sampled at, its advantage). Both are frozen and
have a JSON form, because they live in checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

DESIGNER, STARTER = "designer", "starter"  # where a pool environment came from
SOURCES = (DESIGNER, STARTER)
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
  return dataclasses.asdict(record)


def card_from_json(d: Mapping[str, Any]) -> Card:
  return Card(**d)


def sample_from_json(d: Mapping[str, Any]) -> Sample:
  return Sample(**{**d, "tokens": tuple(d["tokens"]), "mask": tuple(d["mask"]),
                   "logp": tuple(d["logp"])})
