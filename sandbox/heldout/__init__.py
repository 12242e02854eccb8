"""Held-out environments: for evaluation only, never in a training pool or an SFT source.

Each file is a complete environment program as the designer is asked to write one
(docs/method.md §1), like sandbox/starters/, and each passes the same admission. They are fairly
easy (small numbers, a few rounds, retries within a short turn limit), so that a small model
that follows the \\boxed{} protocol can win some, and their mechanics differ from the starters'
and from the parameterised families' (sandbox/families/), so a win here measures transfer
rather than recall of a trained game:

  pair_sums        Mathematical_Reasoning  pick two listed numbers that add to each of 3 totals
  digit_sum        Mathematical_Reasoning  name unused two-digit numbers with a given digit sum
  truth_boxes      Logical_Deduction       3 rounds of 4 labelled boxes, exactly one label true
  weigh_coins      Logical_Deduction       find the heavy coin of 8 with a balance
  knight_hop       Spatial_Reasoning       jump a chess knight to a square 2-3 jumps away
  odd_one_out      Pattern_Recognition     3 rounds: the number without the others' property
  palindrome_fill  Pattern_Recognition     fill 3 gaps of a palindrome from their mirrors
  meeting_point    Optimization            3 rounds: the house minimising total walking
  plant_doctor     Causal_Inference        find the 2 of 4 conditions that matter, set them right
"""

from __future__ import annotations

import os

from ..starters import SKILLS

# file -> skill
HELDOUT = {
    "pair_sums.py": "Mathematical_Reasoning",
    "digit_sum.py": "Mathematical_Reasoning",
    "truth_boxes.py": "Logical_Deduction",
    "weigh_coins.py": "Logical_Deduction",
    "knight_hop.py": "Spatial_Reasoning",
    "odd_one_out.py": "Pattern_Recognition",
    "palindrome_fill.py": "Pattern_Recognition",
    "meeting_point.py": "Optimization",
    "plant_doctor.py": "Causal_Inference",
}

DIR = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    return os.path.join(DIR, name)


def code(name: str) -> str:
    with open(path(name), encoding="utf-8") as f:
        return f.read()


def by_skill(skill: str) -> list[str]:
    """File names of the held-out environments of one skill, in a fixed order."""
    if skill not in SKILLS:
        raise ValueError(f"unknown skill {skill!r}; known: {SKILLS}")
    return sorted(n for n, s in HELDOUT.items() if s == skill)
