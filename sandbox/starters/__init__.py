"""Hand-written starter environments: the self-play starter pool and the designer's few-shots.

Each file is a complete environment program exactly as the designer is asked to write one
(docs/method.md §1): one `...Env` class, standard library only, actions in \\boxed{...}, reward in
[0, 1] with 1 only on the goal, `terminated` only on the goal, `truncated` at its own turn
limit, at least three interactions to win, deterministic given the seed, and a `solution()`.
"""

from __future__ import annotations

import os

SKILLS = ("Mathematical_Reasoning", "Logical_Deduction", "Spatial_Reasoning",
          "Pattern_Recognition", "Optimization", "Causal_Inference")

# file -> skill
STARTERS = {
    "remainder_oracle.py": "Mathematical_Reasoning",
    "target_number.py": "Mathematical_Reasoning",
    "code_breaker.py": "Logical_Deduction",
    "guess_who.py": "Logical_Deduction",
    "maze_walk.py": "Spatial_Reasoning",
    "sliding_tiles.py": "Spatial_Reasoning",
    "next_term.py": "Pattern_Recognition",
    "tile_pattern.py": "Pattern_Recognition",
    "knapsack.py": "Optimization",
    "cheapest_route.py": "Optimization",
    "switchboard.py": "Causal_Inference",
    "gene_knockout.py": "Causal_Inference",
}

DIR = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    return os.path.join(DIR, name)


def code(name: str) -> str:
    with open(path(name), encoding="utf-8") as f:
        return f.read()


def by_skill(skill: str) -> list[str]:
    """File names of the starters for one skill, in a fixed order."""
    if skill not in SKILLS:
        raise ValueError(f"unknown skill {skill!r}; known: {SKILLS}")
    return sorted(n for n, s in STARTERS.items() if s == skill)
