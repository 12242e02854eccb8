"""RLVE's sliding-window difficulty controller (docs/method.md §9), as pure functions on a value.

Every environment (a parameterised family, `spade_jax.sandbox.families`) keeps a window
[low, high] of difficulty levels, starting at [1, 1]. Each episode's level is drawn uniformly
from the window. Results are counted per (environment, level). After each recorded result, if
the results at `high` number at least `tau_num` and their accuracy (wins / plays) is at least
`tau_acc`, `high` rises by one, the counts at the new `high` start from zero, and if the window
then spans more than `d_delta` levels, `low` rises so that it spans exactly `d_delta`. At most
one promotion follows one result. Results at levels below `high` (episodes drawn before a
promotion, or from the lower part of the window) are counted but never move the window; a
result above `high` cannot come from `draw` and is an error.

The thresholds live in the state (they define how it moves), so a checkpoint resumes with the
controller it was saved with. The state is immutable: every function returns a new one, and
`to_json` / `from_json` round-trip it exactly.

Metrics (`level_stats`): `rlve_level_mean` is the mean over environments of the window's
`high`, `rlve_level_max` its maximum: the frontier each environment has been promoted to, a
function of the state alone (not of which levels one step happened to draw), so it is the same
after a resume and moves only when the controller does.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import numpy as np

TAU_ACC, TAU_NUM, D_DELTA = 0.9, 128, 4  # the paper's values


@dataclasses.dataclass(frozen=True)
class Window:
  low: int
  high: int
  # level -> (wins, plays), sorted by level; levels never played are absent
  counts: tuple[tuple[int, int, int], ...] = ()

  def count(self, level: int) -> tuple[int, int]:
    for lv, wins, plays in self.counts:
      if lv == level:
        return wins, plays
    return 0, 0


@dataclasses.dataclass(frozen=True)
class State:
  windows: tuple[tuple[str, Window], ...]  # sorted by environment name
  tau_acc: float = TAU_ACC
  tau_num: int = TAU_NUM
  d_delta: int = D_DELTA

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(n for n, _ in self.windows)

  def window(self, name: str) -> Window:
    for n, w in self.windows:
      if n == name:
        return w
    raise KeyError(f"rlve: unknown environment {name!r}; known: {', '.join(self.names)}")


def new_state(env_names: Iterable[str], tau_acc: float = TAU_ACC, tau_num: int = TAU_NUM,
              d_delta: int = D_DELTA) -> State:
  names = sorted(env_names)
  if not names or len(set(names)) != len(names):
    raise ValueError(f"rlve: environment names must be distinct and non-empty, got {names}")
  if not 0.0 < tau_acc <= 1.0 or tau_num < 1 or d_delta < 1:
    raise ValueError(f"rlve: need 0 < tau_acc <= 1, tau_num >= 1, d_delta >= 1; got "
                     f"{tau_acc}, {tau_num}, {d_delta}")
  return State(tuple((n, Window(1, 1)) for n in names), float(tau_acc), int(tau_num), int(d_delta))


def draw(state: State, name: str, rng: np.random.Generator) -> int:
  """One episode's level: uniform over the environment's window."""
  w = state.window(name)
  return int(rng.integers(w.low, w.high + 1))


def _with_count(counts, level: int, wins: int, plays: int):
  rest = [c for c in counts if c[0] != level]
  return tuple(sorted(rest + [(level, wins, plays)]))


def record(state: State, name: str, level: int, won: bool) -> State:
  """The state after one episode of `name` at `level` ended, won or not."""
  w = state.window(name)
  level = int(level)
  if not 1 <= level <= w.high:
    raise ValueError(f"rlve: {name} played at level {level}, above its window [{w.low}, {w.high}]")
  wins, plays = w.count(level)
  wins, plays = wins + bool(won), plays + 1
  low, high, counts = w.low, w.high, _with_count(w.counts, level, wins, plays)
  # The small slack keeps e.g. 117 / 130 >= 0.9 from failing on float rounding.
  if level == high and plays >= state.tau_num and wins >= state.tau_acc * plays - 1e-9:
    high += 1
    counts = _with_count(counts, high, 0, 0)
    low = max(low, high - state.d_delta + 1)
  new = Window(low, high, counts)
  return dataclasses.replace(state, windows=tuple((n, new if n == name else x) for n, x in state.windows))


def record_many(state: State, results: Iterable[tuple[str, int, bool]]) -> State:
  """`record` for each (name, level, won), in the given order (the order matters when a
  promotion falls inside the batch: results after it at the old `high` no longer count)."""
  for name, level, won in results:
    state = record(state, name, level, won)
  return state


def accuracy(state: State, name: str, level: int) -> tuple[float, int]:
  """(accuracy, plays) of one environment at one level; (0.0, 0) if never played there."""
  wins, plays = state.window(name).count(level)
  return (wins / plays if plays else 0.0), plays


def level_stats(state: State) -> dict[str, float]:
  highs = [w.high for _, w in state.windows]
  return {"rlve_level_mean": float(np.mean(highs)), "rlve_level_max": float(max(highs))}


def to_json(state: State) -> dict:
  return {"tau_acc": state.tau_acc, "tau_num": state.tau_num, "d_delta": state.d_delta,
          "windows": {n: {"low": w.low, "high": w.high,
                          "counts": [[lv, wins, plays] for lv, wins, plays in w.counts]}
                      for n, w in state.windows}}


def from_json(d: Mapping) -> State:
  windows = []
  for n in sorted(d["windows"]):
    x = d["windows"][n]
    counts = tuple(sorted((int(lv), int(wins), int(plays)) for lv, wins, plays in x["counts"]))
    low, high = int(x["low"]), int(x["high"])
    if not 1 <= low <= high or any(not (0 <= wins <= plays) for _, wins, plays in counts):
      raise ValueError(f"rlve: bad window for {n!r} in checkpoint: {x}")
    windows.append((n, Window(low, high, counts)))
  return State(tuple(windows), float(d["tau_acc"]), int(d["tau_num"]), int(d["d_delta"]))


def windows(state: State) -> dict[str, tuple[int, int]]:
  """name -> (low, high), for logs and reports."""
  return {n: (w.low, w.high) for n, w in state.windows}

