"""Parameterised environment families and the held-out suite: every rendered level is admitted
as designer output is, solutions win through the sandbox and get longer with the level, and the
held-out suite is admitted and shares no environment with the starters or the families."""

import ast
import dataclasses
import os
import re

import pytest

from spade_jax.sandbox import families, heldout, starters
from spade_jax.sandbox.contract import Limits
from spade_jax.sandbox.pool import Pool, Start
from spade_jax.sandbox.validate import Options, validate_many

LIMITS = dataclasses.replace(Limits(), memory_bytes=256 << 20, load_s=3.0, reset_s=1.0, step_s=1.0)
LEVELS = (1, 5, 10)
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def pool():
  with Pool(workers=2, limits=LIMITS) as p:
    yield p


def _solve(pool, code, seed):
  """(first observation, solution, replies) of replaying the solution() taken at reset(seed)."""
  (first,) = list(pool.start_many({0: Start(code, seed, solution=True)}))
  pool.end_many([first.episode])
  assert first.ok, (first.status, first.reason)
  return first.observation, tuple(first.solution), pool.play(code, seed, first.solution)


@pytest.fixture(scope="module")
def plays(pool):
  """name -> level -> [((first observation, solution), number of solution steps, won)] over
  SEEDS."""
  out = {}
  for name in families.NAMES:
    for level in LEVELS:
      code = families.render(name, level)
      for seed in SEEDS:
        obs, sol, rs = _solve(pool, code, seed)
        won = rs[-1].ok and rs[-1].terminated and rs[-1].reward == 1.0
        assert all(r.reward == 0.0 and not r.terminated for r in rs[1:-1]), (name, level, seed)
        out.setdefault(name, {}).setdefault(level, []).append(((obs, sol), len(rs) - 1, won))
  return out


def _class_names(code):
  return {n.name for n in ast.walk(ast.parse(code)) if isinstance(n, ast.ClassDef)}


def test_index_covers_every_skill_twice():
  assert len(families.NAMES) >= 12 and len(set(families.NAMES)) == len(families.NAMES)
  for skill in starters.SKILLS:
    assert len(families.by_skill(skill)) >= 2, skill
    assert all(families.skill(n) == skill for n in families.by_skill(skill))
  files = {f[:-3] for f in os.listdir(families.DIR) if f.endswith(".py") and f[0] != "_"}
  assert files == set(families.NAMES)
  with pytest.raises(ValueError):
    families.by_skill("Juggling")
  with pytest.raises(KeyError):
    families.skill("nope")


def test_render_bakes_the_level_into_a_standalone_program():
  for name in families.NAMES:
    assert families.render(name, 1) == families.source(name)
    text = families.render(name, 7)
    assert re.findall(r"^LEVEL = \d+$", text, re.MULTILINE) == ["LEVEL = 7"], name
    tree = ast.parse(text)  # a whole program: standard library only, one ...Env class
    envs = [c for c in _class_names(text) if c.endswith("Env")]
    assert len(envs) == 1, (name, envs)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"random", "itertools", "collections", "math"}, (name, imported)
    assert text.splitlines()[0].startswith(f'"""{families.skill(name)}: '), name
    assert len(text.splitlines()) < 200, name
  for bad in (0, -1, 2.0, "3", True):
    with pytest.raises(ValueError):
      families.render("prime_factors", bad)
  with pytest.raises(KeyError):
    families.render("nope", 1)


def test_rendered_levels_are_admitted(pool):
  cases = [(n, lv) for n in families.NAMES for lv in LEVELS]
  verdicts = validate_many(pool, [families.render(n, lv) for n, lv in cases], Options(seed=0))
  rejected = [(c, v.check, v.reason) for c, v in zip(cases, verdicts) if not v.admitted]
  assert not rejected, rejected


def test_solutions_win_and_take_several_steps(plays):
  for name, by_level in plays.items():
    for level, rows in by_level.items():
      for obs, steps, won in rows:
        assert won, (name, level)
        assert steps >= (2 if level == 1 else 3), (name, level, steps)
        assert "\\boxed" in obs[0], name
        assert steps <= 25, (name, level, steps)  # winnable within the agent's turn cap


def test_difficulty_grows_with_level(plays):
  for name, by_level in plays.items():
    mean = {lv: sum(s for _, s, _ in rows) / len(rows) for lv, rows in by_level.items()}
    assert mean[1] < mean[5] <= mean[10], (name, mean)
    assert mean[1] <= 3, (name, mean)  # level 1 stays short
    # Instances differ by seed (task or answer), and the task text changes with the level.
    assert len({inst for inst, _, _ in by_level[10]}) == len(SEEDS), name
    assert by_level[1][0][0][0] != by_level[10][0][0][0], name


def _repeat_wins(pool, cases, steps=30, batch=24):
  """For each (code, seed, action): does sending the same action again and again win?"""
  wins = []
  for i in range(0, len(cases), batch):
    chunk = cases[i:i + batch]
    live = {r.episode: r.key for r in pool.start_many({k: Start(c, seed) for k, (c, seed, _) in
                                                      enumerate(chunk, i)})}
    for _ in range(steps):
      if not live:
        break
      for r in list(pool.step_many({e: cases[k][2] for e, k in live.items()})):
        if r.ok and r.terminated and r.reward > 0:
          wins.append(live[r.episode])
        if r.done:
          del live[r.episode]
    pool.end_many(list(live))
  return wins


def test_repeating_one_action_never_wins(pool, plays):
  # Every distinct action of a winning play, sent every turn: a policy that found one good move
  # and spams it must not win (admission's degenerate policies cannot know the good moves).
  cases = []
  for name, by_level in plays.items():
    for level in (1, 5):
      for seed, ((_, sol), _, _) in zip(SEEDS, by_level[level]):
        cases += [(families.render(name, level), seed, a) for a in sorted(set(sol))]
  for n in heldout.HELDOUT:
    for seed in SEEDS:
      (first,) = list(pool.start_many({0: Start(heldout.code(n), seed, solution=True)}))
      pool.end_many([first.episode])
      cases += [(heldout.code(n), seed, a) for a in sorted(set(first.solution))]
  wins = _repeat_wins(pool, cases)
  assert not wins, [(cases[k][1], cases[k][2], cases[k][0].splitlines()[0]) for k in wins]


def test_levels_past_ten_still_play(pool):
  for name in families.NAMES:
    _, _, rs = _solve(pool, families.render(name, 40), 5)
    assert rs[-1].terminated and rs[-1].reward == 1.0 and len(rs) - 1 <= 25, name


def test_heldout_suite_is_admitted_and_solvable(pool):
  names = sorted(heldout.HELDOUT)
  assert len(names) >= 8 and set(heldout.HELDOUT.values()) == set(starters.SKILLS)
  assert set(names) == {f for f in os.listdir(heldout.DIR) if f.endswith(".py") and f[0] != "_"}
  verdicts = validate_many(pool, [heldout.code(n) for n in names], Options(seed=1))
  assert all(v.admitted for v in verdicts), [(n, v) for n, v in zip(names, verdicts) if not v.admitted]
  for n in names:
    for seed in SEEDS:
      _, _, rs = _solve(pool, heldout.code(n), seed)
      assert rs[-1].terminated and rs[-1].reward == 1.0 and len(rs) - 1 >= 2, (n, seed)


def test_heldout_is_disjoint_from_training_environments():
  train = {f"{n}.py": families.source(n) for n in families.NAMES}
  train.update({n: starters.code(n) for n in starters.STARTERS})
  held = {n: heldout.code(n) for n in heldout.HELDOUT}
  assert not set(held) & set(train)
  train_classes = set().union(*(_class_names(c) for c in train.values()))
  for n, code in held.items():
    assert not _class_names(code) & train_classes, n
    assert code not in train.values(), n
    # No training program's opening line (its one-line description) reappears.
    first = code.splitlines()[0]
    assert all(first != c.splitlines()[0] for c in train.values()), n
