"""Reasoning-Gym "hard" split in SPADE's four buckets (from the `reasoning-gym` package).

Buckets (docs/method.md §10: Math, Algorithmic, Cognition, Logic) are unions of the package's own task
categories, so they follow the installed release rather than a hand-kept list:

  math         algebra, arithmetic, geometry, graphs, probability
  algorithmic  algorithmic, code
  cognition    cognition, games
  logic        logic, induction

(ARC tasks are left out: their grids need far longer contexts than the rest.) With
reasoning-gym 0.1.25 that is 33 / 36 / 24 / 9 tasks; the paper's 31 math tasks come from an
older release.

"Hard": the package ships difficulty curricula, not the paper's hand-written eval configs, so the
hard configuration of a task is its curriculum with every attribute at level `HARD_LEVEL` (the
third level, capped at the attribute's last), taking the upper segment of each range. A few
tasks cannot build or generate (in reasonable time) at that level in this release and use the
level in `LEVELS`.
Tasks without a curriculum use their default configuration. Episode i of a task is item i of its
dataset with seed `SEED` — fixed, so every checkpoint sees the same problems.

Prompt: the package's default system prompt (answer inside <answer></answer>). Grading: the
package's own `score_answer` on the last <answer> tag; a win only at full score (1.0), the raw
score is kept in each sample.

Oracle: the gold answer. Tasks whose dataset gives no single gold answer (several valid
solutions; `NO_GOLD`) have a constructive oracle where one is cheap to write (`graph_color`) and
are otherwise excluded from the oracle check (their oracle answers the package's gold field,
which scores below 1.0).
"""

from __future__ import annotations

import functools

from . import extract
from .generation import Prompt
from .protocol import Benchmark, Unavailable

SEED = 20260401
HARD_LEVEL = 2
# Tasks that fail to build, fail to generate, or take minutes at HARD_LEVEL in 0.25 (None: the
# task's default configuration, its curriculum cannot build any level).
LEVELS = {"caesar_cipher": 1, "letter_jumble": 1, "number_sequence": 1, "countdown": 0, "jugs": 0,
          "knight_swap": None}
BUCKETS = {
    "math": ("algebra", "arithmetic", "geometry", "graphs", "probability"),
    "algorithmic": ("algorithmic", "code"),
    "cognition": ("cognition", "games"),
    "logic": ("logic", "induction"),
}
NO_GOLD = ("boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour")


def _rg():
  try:
    import reasoning_gym  # noqa: F401
    from reasoning_gym import factory, utils
  except ModuleNotFoundError as e:
    raise Unavailable(f"the reasoning-gym package is not installed ({e})") from None
  return factory, utils


def tasks(bucket: str) -> list[str]:
  factory, _ = _rg()
  cats = BUCKETS[bucket]
  return sorted(name for name, (cls, _) in factory.DATASETS.items()
                if cls.__module__.split(".")[1] in cats)


@functools.lru_cache(maxsize=None)
def dataset(task: str, size: int):
  """The hard-configured dataset of `size` items of one task (cached: generation is slow)."""
  factory, _ = _rg()
  from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode

  if not factory.has_curriculum(task) or LEVELS.get(task, HARD_LEVEL) is None:
    return factory.create_dataset(task, seed=SEED, size=size)
  cur = factory.create_curriculum(task)
  cur.set_global_level(LEVELS.get(task, HARD_LEVEL))
  cfg = cur.generate_configuration({"seed": SEED, "size": size},
                                   DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND))
  return factory.DATASETS[task][0](cfg)


def _graph_color_oracle(entry: dict) -> str | None:
  """A proper colouring by backtracking over the puzzle's (small) graph."""
  import json

  meta = entry["metadata"]
  puzzle = meta["puzzle"]
  verts, edges, colors = puzzle["vertices"], puzzle["edges"], puzzle["color_options"]
  nbrs = {v: set() for v in verts}
  for a, b in edges:
    nbrs[a].add(b)
    nbrs[b].add(a)
  assign: dict = {}

  def solve(i: int) -> bool:
    if i == len(verts):
      return True
    v = verts[i]
    for c in colors:
      if all(assign.get(u) != c for u in nbrs[v]):
        assign[v] = c
        if solve(i + 1):
          return True
        del assign[v]
    return False

  return json.dumps({str(v): c for v, c in assign.items()}) if solve(0) else None


CONSTRUCTIVE = {"graph_color": _graph_color_oracle}


def _oracle(task: str, entry: dict) -> str:
  answer = CONSTRUCTIVE[task](entry) if task in CONSTRUCTIVE else entry.get("answer")
  return f"<answer>{'' if answer is None else answer}</answer>"


def load(bucket: str, ctx) -> list[dict]:
  _, utils = _rg()
  names = tasks(bucket)
  if ctx.protocol.subset:
    names = [t for t in names if t in ctx.protocol.subset]
  n = ctx.protocol.episodes
  items = []
  for task in names:
    ds = dataset(task, n)
    for i in range(n):
      entry = ds[i]
      items.append({
          "id": f"{task}/{i}", "task": task, "gold": entry.get("answer"), "_ds": ds,
          "_entry": entry,
          "prompt": Prompt(({"role": "system", "content": utils.SYSTEM_PROMPTS["default"]},
                            {"role": "user", "content": entry["question"]}),
                           oracle=_oracle(task, entry))})
  return items


def grade(pairs, ctx) -> list[dict]:
  out = []
  for item, completion in pairs:
    ans = extract.answer_tag(completion)
    raw = 0.0
    if ans is not None:
      ds = item["_ds"]
      try:
        raw = float(ds.score_answer(ans, item["_entry"]))
      except Exception:  # noqa: BLE001 - a malformed answer a task's scorer chokes on is wrong
        raw = 0.0
    out.append({"extracted": ans, "raw_score": raw, "score": float(raw >= 1.0)})
  return out


BENCHMARKS = [Benchmark(f"rg_{b}", "reasoning", functools.partial(load, b), grade)
              for b in BUCKETS]
