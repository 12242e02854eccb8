"""Parameterised environment families: the environments of the fixed-environment RLVE baseline
(docs/method.md §9), and a source of many distinct standalone programs.

Each family is one file here that is itself a complete environment program at level 1, written
as the designer is asked to write one (docs/method.md §1): one `...Env` class built with no
arguments, standard library only, actions in \\boxed{...}, reward 1.0 only on the goal,
`terminated` only then, `truncated` at its own turn limit, deterministic given the seed and the
actions, and a `solution()` from the current reset. The file's single `LEVEL = 1` line is the
only parameter: `render(name, level)` returns the program with that line set to `level`, so an
instance is plain program text that goes through the sandbox and admission exactly as designer
output does. Every level from 1 up is valid; what a level changes is said in each file's
docstring, and most parameters stop growing a little past level 10. Level 1 is won in two or
three turns with small numbers; from level 2 every win takes at least three. No instance is
won by repeating one action, and admission's degenerate policies win none.

  family             skill                   a level adds
  prime_factors      Mathematical_Reasoning  prime factors (L + 1) and larger primes
  running_total      Mathematical_Reasoning  operations (L + 1), larger operands, x, // and %
  seat_lineup        Logical_Deduction       people (3 to 7) and indirect clue kinds
  latin_square       Logical_Deduction       grid size (3 to 6) and blanks (2 to 14)
  robot_heading      Spatial_Reasoning       grid size, walls and route length (turns count)
  box_push           Spatial_Reasoning       grid size, walls, pushes and route length
  string_rule        Pattern_Recognition     rule depth (1 to 3 operations), candidates, queries
  automaton          Pattern_Recognition     row width, rule families, rows to predict
  job_order          Optimization            jobs (L + 1), durations, then weights
  cable_network      Optimization            towns (L + 2) and candidate links
  domino_chain       Causal_Inference        blocks and the pushes the target needs (2 to 5)
  effect_trials      Causal_Inference        factors (1 to 6), effect sizes, hidden baseline

Why our own family rather than RLVE's gym or Reasoning-Gym: RLVE's environments are not a
package we can install here. Reasoning-Gym's procedural tasks do take difficulty parameters,
but each is a single question with a single answer; wrapped as an episode it would be won or
lost in one step, which admission rejects and which does not train what SPADE's agent does
(several turns that act on feedback from hidden state). Wrapping them as multi-turn games would
mean inventing the feedback anyway, and the result would depend on a package outside the
sandbox's standard-library-only contract. A family written as one standalone program per level
is multi-turn by construction, is checked by the same admission as designer output, needs
nothing beyond the standard library, and doubles as designer examples for the warm start.
"""

from __future__ import annotations

import os
import re

from ..starters import SKILLS

# name -> skill; the file is <name>.py
FAMILIES = {
    "prime_factors": "Mathematical_Reasoning",
    "running_total": "Mathematical_Reasoning",
    "seat_lineup": "Logical_Deduction",
    "latin_square": "Logical_Deduction",
    "robot_heading": "Spatial_Reasoning",
    "box_push": "Spatial_Reasoning",
    "string_rule": "Pattern_Recognition",
    "automaton": "Pattern_Recognition",
    "job_order": "Optimization",
    "cable_network": "Optimization",
    "domino_chain": "Causal_Inference",
    "effect_trials": "Causal_Inference",
}
NAMES = tuple(FAMILIES)

DIR = os.path.dirname(os.path.abspath(__file__))
_LEVEL_LINE = re.compile(r"^LEVEL = 1$", re.MULTILINE)


def skill(name: str) -> str:
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(NAMES)}")
    return FAMILIES[name]


def by_skill(skill: str) -> list[str]:
    """Family names of one skill, in a fixed order."""
    if skill not in SKILLS:
        raise ValueError(f"unknown skill {skill!r}; known: {SKILLS}")
    return sorted(n for n, s in FAMILIES.items() if s == skill)


def path(name: str) -> str:
    skill(name)
    return os.path.join(DIR, name + ".py")


def source(name: str) -> str:
    """The family's file: its program at level 1."""
    with open(path(name), encoding="utf-8") as f:
        return f.read()


def render(name: str, level: int) -> str:
    """The standalone program of family `name` at difficulty `level` (an int >= 1)."""
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise ValueError(f"level must be an int >= 1, got {level!r}")
    text, n = _LEVEL_LINE.subn(f"LEVEL = {level}", source(name))
    if n != 1:  # a family file must carry exactly one level line
        raise ValueError(f"family {name!r} has {n} 'LEVEL = 1' lines, expected one")
    return text
