"""What a benchmark is (load, prompt, grade) and how much of it a preset runs.

A benchmark is a `Benchmark` value: `load(ctx)` returns its items (each a dict with at least
"id", "prompt" — a `generation.Prompt` — and "gold"); `grade(pairs, ctx)` scores a batch of
(item, completion) pairs; multi-turn benchmarks also have `play`, which drives the generator
through each episode and yields (item, sample index, completion). Completions are whatever the
benchmark saves and re-grades: a string, for tool use the responses of every step of every turn,
for environment suites the episode record. A `self_contained` benchmark's completions carry all
that grading needs, so re-scoring them loads no data. `Unavailable` means "this benchmark cannot
run here" (data file absent, sandbox missing) and becomes an "unavailable" row, never a crash.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterator

from .generation import Sampling


class Unavailable(Exception):
  """The benchmark cannot run here; the message says why and what to supply."""


@dataclasses.dataclass(frozen=True)
class Protocol:
  problems: int | None  # the first N items in the benchmark's fixed order (None: all)
  sampling: Sampling
  max_steps: int = 20  # tool use: model steps per user turn (BFCL's own limit is 20)
  timeout_s: float = 10.0  # code: wall seconds per executed program
  episodes: int = 8  # Reasoning-Gym: problems per task
  subset: tuple[str, ...] = ()  # Reasoning-Gym: only these tasks (empty: the whole bucket)
  max_turns: int = 25  # environment suites: agent turns per episode (the env's own limit first)
  context: int = 0  # environment suites: tokens of one whole episode (0: the model's context)


@dataclasses.dataclass
class Context:
  """What graders share during one run: the protocol, user data, and a lazily started sandbox."""

  protocol: Protocol
  data_dir: str | None = None
  sandbox_workers: int = 2
  notes: dict = dataclasses.field(default_factory=dict)  # what a benchmark adds to its row
  _pool: Any = None

  def pool(self):
    if self._pool is None:
      from spade_jax.sandbox.pool import Pool, SandboxUnavailable

      try:
        self._pool = Pool(workers=self.sandbox_workers)
      except (SandboxUnavailable, RuntimeError, OSError) as e:
        raise Unavailable(f"code cannot be executed safely here: {e}") from None
    return self._pool

  def close(self) -> None:
    if self._pool is not None:
      self._pool.close()
      self._pool = None


@dataclasses.dataclass(frozen=True)
class Benchmark:
  name: str
  family: str
  load: Callable[["Context"], list[dict]]
  grade: Callable[[list[tuple[dict, Any]], Context], list[dict]]
  play: Callable[..., Iterator[tuple[dict, int, Any]]] | None = None
  offline: bool = True  # data ships in an installed package (False: user-supplied file)
  self_contained: bool = False  # completions hold all grading needs: re-scoring loads no data


def user_file(data_dir: str | None, names: tuple[str, ...], what: str) -> str:
  """The first of `names` that exists in data_dir, or Unavailable naming what to supply."""
  if data_dir:
    for n in names:
      path = os.path.join(data_dir, n)
      if os.path.isfile(path):
        return path
  where = data_dir or "--data_dir (not given)"
  raise Unavailable(f"{what}: no {' or '.join(names)} in {where}")
