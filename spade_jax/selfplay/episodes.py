"""Batched multi-turn agent episodes: sampler turns on the device, environment steps in the sandbox.

Each group is one environment instance (code + reset seed + optional hint) played G times; the G
plays share one prefill. Episodes alternate: the sampler writes a turn for every live episode,
the sandbox steps every one of them, observations are appended to the transcripts, and the
sampler continues only the live ones (ended ones are dropped from the cache for good).

To keep the device busy while environments run, groups are split into two cohorts that take
turns: while one cohort's actions execute in the sandbox's processes, the device samples the
other cohort. Time the host spends waiting for sandbox replies is reported as `env_wait_s`.

The return is outcome-only (docs/method.md §4): clip(last reward, -1, 1) if the episode terminated,
else 0; a crash or invalid reply ends the episode with -1.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from spade_jax.sandbox.contract import Status
from spade_jax.sandbox.pool import Pool, Start
from spade_jax import actions as actions_lib
from spade_jax import sampling
from spade_jax import tokenizer as tok_lib
from spade_jax.selfplay import progress as progress_lib
from spade_jax.selfplay import prompts, seeds


@dataclasses.dataclass(frozen=True)
class Group:
  """One environment instance, played `plays` times."""
  env_id: str
  code: str
  seed: int
  hint: str | None = None


@dataclasses.dataclass
class Episode:
  """One play: the training sequence (tokens, loss mask, behaviour log-probs) and its outcome."""
  group: int
  transcript: tok_lib.Transcript = tok_lib.Transcript()
  ret: float = 0.0
  turns: int = 0
  end: str = ""  # terminated | truncated | max_turns | context | crash | start_failed
  status: str = "OK"  # the sandbox status of the last reply
  won: bool = False
  routing: list = dataclasses.field(default_factory=list)  # MoE: experts of the fed tokens


@dataclasses.dataclass(frozen=True)
class Limits:
  max_turns: int
  context: int  # tokens of the whole episode


@dataclasses.dataclass
class Timing:
  sample_s: float = 0.0  # device: sampler calls
  env_wait_s: float = 0.0  # host blocked on sandbox replies
  tokens: int = 0  # assistant tokens sampled

  def add(self, other: "Timing") -> "Timing":
    return Timing(self.sample_s + other.sample_s, self.env_wait_s + other.env_wait_s,
                  self.tokens + other.tokens)


def _encodable(text: str) -> bool:
  """Whether a tokenizer can take this observation: valid UTF-8, no lone surrogates. The
  sandbox already refuses others; one that got through must end its episode, not the run."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError:
    return False
  return True


def won(status: Status, reward: float, terminated: bool) -> bool:
  """A win: the environment ended the episode at its goal (terminated) with a positive final
  reward, as admission's own check has it. The one rule for the agent's win rate, the held-out
  environment benchmarks and RLVE's accuracy."""
  return status is Status.OK and terminated and reward > 0


def outcome(status: Status, reward: float, terminated: bool) -> float:
  if status is not Status.OK:
    return -1.0
  return float(np.clip(reward, -1.0, 1.0)) if terminated else 0.0


class _Cohort:
  """A set of groups sampled together: their sampler state and per-episode bookkeeping."""

  def __init__(self, group_ids: list[int], plays: int):
    self.group_ids = group_ids
    self.rows = [g for g in group_ids for _ in range(plays)]  # row -> group
    self.conv = None
    self.episode_of_row: dict[int, int] = {}  # sandbox episode id -> row
    self.sandbox_id: dict[int, int] = {}  # row -> sandbox episode id
    self.live: set[int] = set()
    self.last_turn: dict[int, list[int]] = {}


def play(pool: Pool, sampler: sampling.Sampler, params, tokenizer, groups: Sequence[Group],
         plays: int, settings: sampling.Settings, limits: Limits, seed: int, *,
         progress: progress_lib.Progress | None = None, name: str = "plays"
         ) -> tuple[list[Episode], Timing]:
  """Plays every group `plays` times; returns episodes in (group, play) order. `progress`
  (quiet by default) counts episodes as they end, under the phase `name`."""
  progress = progress or progress_lib.quiet()
  episodes = [Episode(g) for g in range(len(groups)) for _ in range(plays)]
  if not groups:
    return episodes, Timing()
  with progress.phase(name, f"{len(groups)} environments x {plays} plays", total=len(episodes),
                      unit="episodes") as ph:
    timing = _play(pool, sampler, params, tokenizer, groups, plays, settings, limits, seed,
                   episodes, progress, ph)
    ph.note = _outcome_note(episodes)
  return episodes, timing


def _outcome_note(episodes: Sequence[Episode]) -> str:
  ends: dict[str, int] = {}
  for e in episodes:
    ends[e.end] = ends.get(e.end, 0) + 1
  won = sum(e.won for e in episodes)
  return f"won {won}; ends " + " ".join(f"{k} {v}" for k, v in sorted(ends.items()))


def _play(pool, sampler, params, tokenizer, groups, plays, settings, limits, seed, episodes,
          progress: progress_lib.Progress, ph: progress_lib.Phase) -> Timing:
  """The body of `play`: fills `episodes` in place, returns the timing."""
  timing = Timing()

  # Start one sandbox episode per play (all plays of a group reset with the group's seed).
  starts = {(g, p): Start(groups[g].code, groups[g].seed)
            for g in range(len(groups)) for p in range(plays)}
  t0 = time.perf_counter()
  first: dict[int, str] = {}  # group -> first observation
  sandbox_ids: dict[int, int] = {}  # episode index -> sandbox episode id
  for r in pool.start_many(starts):
    g, p = r.key
    idx = g * plays + p
    if r.ok and _encodable(r.observation):
      first.setdefault(g, r.observation)
      sandbox_ids[idx] = r.episode
    elif r.ok:
      pool.end_many([r.episode])
      episodes[idx].end, episodes[idx].status = "start_failed", Status.INVALID_RETURN.value
    else:
      episodes[idx].end, episodes[idx].status = "start_failed", r.status.value
  timing.env_wait_s += time.perf_counter() - t0
  # A group whose instance fails to start for some plays is dropped whole (it is one instance).
  good = [g for g in range(len(groups)) if all(g * plays + p in sandbox_ids for p in range(plays))]
  for g in set(range(len(groups))) - set(good):
    for p in range(plays):
      idx = g * plays + p
      episodes[idx].end = episodes[idx].end or "start_failed"
  # A first prompt (instruction + first observation) with no room for a turn ends its plays
  # at once, at return 0, like an episode that outgrew its context later.
  start = {g: tok_lib.start(tokenizer, prompts.agent_first_turn(first[g], groups[g].hint))
           for g in good}
  for g in [g for g in good if len(start[g]) + settings.max_new_tokens > limits.context]:
    good.remove(g)
    for p in range(plays):
      episodes[g * plays + p].end = "context"
  ph.update(sum(e.end in ("start_failed", "context") for e in episodes))
  pool.end_many([sandbox_ids.pop(i) for i in list(sandbox_ids) if i // plays not in good])

  cohorts = [c for c in (_Cohort(good[0::2], plays), _Cohort(good[1::2], plays)) if c.group_ids]
  step_seed = 0

  def idx_of(cohort, row):
    g = cohort.rows[row]
    return g * plays + row % plays

  def sample(cohort: _Cohort, new_tokens):
    nonlocal step_seed
    t = time.perf_counter()
    if cohort.conv is None:
      prompts_ = []
      for g in cohort.group_ids:
        prompts_.append(list(start[g].tokens))
        for p in range(plays):
          episodes[g * plays + p].transcript = start[g]
      with progress.compiling("sampler (agent first turn)"):
        cohort.conv, out = sampler.start(params, prompts_, settings,
                                         seeds.derive(seed, step_seed), num_samples=plays)
      cohort.live = set(range(len(cohort.rows)))
    else:
      with progress.compiling("sampler (agent next turns)"):
        cohort.conv, out = sampler.extend(params, cohort.conv, new_tokens, settings,
                                          seeds.derive(seed, step_seed))
    step_seed += 1
    timing.sample_s += time.perf_counter() - t
    lists, lps = out.token_lists(), np.asarray(out.logprobs)
    actions = {}
    for row in cohort.live:
      e = episodes[idx_of(cohort, row)]
      toks = lists[row]
      if out.experts is not None:  # the call's fed tokens, then its sampled ones but the last
        e.routing += [out.prefill_experts[row], out.experts[row, :max(len(toks) - 1, 0)]]
      e.transcript = tok_lib.add_assistant(e.transcript, toks, lps[row, :len(toks)])
      e.turns += 1
      timing.tokens += len(toks)
      cohort.last_turn[row] = toks
      action = actions_lib.boxed_action(tokenizer.decode(toks))
      actions[sandbox_ids[idx_of(cohort, row)]] = action
    return actions

  def finish(e: Episode, how: str, ret: float, status: str = "OK"):
    e.end, e.ret, e.status = how, ret, status

  pending = {}  # cohort index -> actions submitted
  for ci, c in enumerate(cohorts):
    pending[ci] = sample(c, None)
    pool.submit_steps(pending[ci])
  while any(c.live for c in cohorts):
    for ci, c in enumerate(cohorts):
      if not c.live:
        continue
      row_of = {sandbox_ids[idx_of(c, row)]: row for row in c.live}
      replies = {}
      t = time.perf_counter()
      while len(replies) < len(pending[ci]):
        for r in pool.wait(list(set(pending[ci]) - set(replies))):
          replies[r.episode] = r
      timing.env_wait_s += time.perf_counter() - t
      new_tokens: list[list[int] | None] = [None] * len(c.rows)
      ended = []
      n_live = len(c.live)
      for sid, r in replies.items():
        row = row_of[sid]
        e = episodes[idx_of(c, row)]
        if r.done:  # the environment ended it (goal, its own turn limit) or it failed
          how = "crash" if not r.ok else "terminated" if r.terminated else "truncated"
          finish(e, how, outcome(r.status, r.reward, r.terminated), r.status.value)
          e.won = won(r.status, r.reward, r.terminated)
        elif e.turns >= limits.max_turns:
          finish(e, "max_turns", 0.0)
          ended.append(sid)
        elif not _encodable(r.observation):
          finish(e, "crash", -1.0, Status.INVALID_RETURN.value)  # behind the sandbox's own check
          ended.append(sid)
        else:
          nxt = tok_lib.user_turn_tokens(tokenizer, r.observation, c.last_turn[row])
          if len(e.transcript) + len(nxt) + settings.max_new_tokens > limits.context:
            finish(e, "context", 0.0)
            ended.append(sid)
          else:
            e.transcript = e.transcript.add(nxt, trained=False)
            new_tokens[row] = nxt
            continue
        c.live.discard(row)
      pool.end_many(ended)  # episodes the environment did not end itself
      ph.update(n_live - len(c.live))  # one count per batch of replies, not per episode
      if c.live:
        pending[ci] = sample(c, new_tokens)
        pool.submit_steps(pending[ci])
      else:
        pending[ci] = {}
  return timing
