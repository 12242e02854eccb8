"""The paper's agent-only baselines (docs/method.md §9): what the agent plays when nothing is
designed.

  fixed_grpo  a frozen pool of programs (a directory; default: the starter environments), each
              passed through the same admission as designer output once at start; every step
              plays `envs_per_regen` of the admitted ones, drawn at random (seeded per step).
  fixed_rlve  parameterised environment families (`spade_jax.sandbox.families`), each with
              RLVE's sliding-window difficulty controller (`rlve.py`): every step draws
              `envs_per_regen` families, a level from each one's window, renders that instance
              and plays it; the wins move the windows.

Both go through the same loop, schedule, batch, learner, checkpoints and outputs as SPADE, with
no designer sampling, no hints and no designer samples.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
from typing import Sequence

import numpy as np

from spade_jax.sandbox import families, starters
from spade_jax.sandbox import validate as validate_lib
from spade_jax.selfplay import records, rlve

METHODS = ("spade", "fixed_grpo", "fixed_rlve")


@dataclasses.dataclass(frozen=True)
class Rejected:
  name: str
  check: str
  reason: str


def pool_programs(directory: str) -> list[tuple[str, str]]:
  """(file name, program) of a fixed pool: the `.py` files of `directory`, sorted; the starter
  environments when `directory` is empty."""
  if not directory:
    return [(n, starters.code(n)) for n in sorted(starters.STARTERS)]
  paths = sorted(p for p in glob.glob(os.path.join(directory, "*.py"))
                 if os.path.basename(p) != "__init__.py")
  if not paths:
    raise ValueError(f"fixed_pool: no .py files in {directory!r}")
  out = []
  for p in paths:
    with open(p, encoding="utf-8") as f:
      out.append((os.path.basename(p), f.read()))
  return out


def _skill(name: str, code: str) -> str:
  """A starter's skill, else the one its docstring opens with ("Optimization: ..."), else ""."""
  if name in starters.STARTERS:
    return starters.STARTERS[name]
  head = code.lstrip().lstrip("\"'rbu").split(":", 1)[0].strip()
  return head if head.replace("_", "").isalpha() and " " not in head else ""


def admit_pool(pool, programs: Sequence[tuple[str, str]], validation: validate_lib.Options
               ) -> tuple[list[records.Card], list[Rejected]]:
  """The admitted programs of a fixed pool as cards, and the rejected ones with their reasons."""
  verdicts = validate_lib.validate_many(pool, [code for _, code in programs], validation)
  cards, rejected = [], []
  for (name, code), v in zip(programs, verdicts):
    if v.admitted:
      digest = hashlib.sha256(code.encode()).hexdigest()[:8]
      cards.append(records.Card(f"fixed-{name[:-3]}-{digest}", _skill(name, code), code,
                                records.FIXED, 0))
    else:
      rejected.append(Rejected(name, v.check, v.reason))
  return cards, rejected


def rlve_cards(state: rlve.State, n: int, step: int, seed: int) -> list[records.Card]:
  """This step's `n` family instances: the families in a seeded order (cycled when `n` is
  larger), each at a level drawn from its window, rendered as standalone programs."""
  rng = np.random.default_rng(seed)
  order = [state.names[i] for i in rng.permutation(len(state.names))]
  cards = []
  for i in range(n):
    name = order[i % len(order)]
    level = rlve.draw(state, name, rng)
    cards.append(records.Card(f"rlve-{name}-L{level}-{i:02d}", families.skill(name),
                              families.render(name, level), records.FAMILY, step, level=level))
  return cards


def family_of(card: records.Card) -> str:
  """The family name of an `rlve_cards` card."""
  return card.env_id[len("rlve-"):card.env_id.rindex("-L")]


def sample_pool(cards: Sequence[records.Card], n: int, seed: int) -> list[records.Card]:
  """`n` of the cards (all of them if fewer), drawn without replacement, in pool order."""
  if len(cards) <= n:
    return list(cards)
  pick = np.sort(np.random.default_rng(seed).choice(len(cards), size=n, replace=False))
  return [cards[i] for i in pick]
