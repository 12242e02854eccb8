"""The warm start's training data: solution transcripts and designer examples (`spade_jax.sft`).

Agent examples: each source program is started in the sandbox with `Start(code, seed,
solution=True)`, which also returns the environment's own `solution()`; each solution action
becomes an assistant turn, a short reasoning line plus `\\boxed{action}`, and the action sent to
the environment is read back out of that reply exactly as the self-play agent's is
(`actions.boxed_action`), so a kept transcript is one the agent could have played. The chat
sequence is built as `selfplay/episodes.py` builds an episode: `prompts.agent_first_turn` of the
first observation, each reply as the template renders the assistant turn through its stop token
(`tokenizer.reply_tokens`), each later observation as a user turn (`tokenizer.add_user`); the
loss mask is 1 on the replies' tokens only. Only won plays within the turn limit are kept.

Designer examples: the designer's real prompt (`prompts.designer`, a skill, a corpus document and
an empty or starter memory block) answered with a complete program (`prompts.designer_reply`),
over the distinct programs of the sources.

No environment code runs in this process: programs execute only in the sandbox. The held-out
suite (`sandbox/heldout/`) is never a source: a directory inside it and a program whose text is
one of its programs are refused.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
from typing import Iterable, Sequence

import numpy as np

from spade_jax import actions as actions_lib
from spade_jax import tokenizer as tok_lib
from spade_jax.sandbox import starters
from spade_jax.sandbox.pool import Pool, Start
from spade_jax.selfplay import prompts, records

HELDOUT_DIR = os.path.join(os.path.dirname(starters.DIR), "heldout")
MEMORY_MODES = ("empty", "starter", "mixed")
FAMILIES_MISSING = ("data.families: spade_jax.sandbox.families is not there yet; the agent and "
                    "designer examples come from the other sources only")


class DataError(ValueError):
  """The sources cannot make a training set (a held-out program among them; no example)."""


@dataclasses.dataclass(frozen=True)
class Source:
  """One environment program to learn from."""
  name: str  # starter:NAME, family:NAME@LEVEL or dir:PATH
  skill: str  # one of prompts.SKILL_DESCRIPTIONS, or "" (unknown: agent examples only)
  code: str


@dataclasses.dataclass(frozen=True)
class Play:
  """One sandbox episode played with the environment's own solution."""
  source: int  # index into the sources
  seed: int
  observations: tuple[str, ...]  # observation i comes before reply i
  replies: tuple[str, ...]
  end: str  # won | not_won | no_solution | too_many_turns | start_failed | step_failed

  @property
  def won(self) -> bool:
    return self.end == "won"


# ---------------------------------------------------------------------------------------------
# Sources


def _digest(code: str) -> str:
  return hashlib.sha256(code.strip().encode("utf-8", "surrogatepass")).hexdigest()


def _inside(path: str, directory: str) -> bool:
  path, directory = os.path.realpath(path), os.path.realpath(directory)
  return os.path.commonpath([path, directory]) == directory


def heldout_digests(heldout_dir: str = HELDOUT_DIR) -> set[str]:
  """The texts of the held-out programs, to refuse any copy of one as a source."""
  paths = glob.glob(os.path.join(heldout_dir, "**", "*.py"), recursive=True)
  out = set()
  for p in paths:
    with open(p, encoding="utf-8", errors="surrogateescape") as f:
      out.add(_digest(f.read()))
  return out


def check_dirs(dirs: Iterable[str], heldout_dir: str = HELDOUT_DIR) -> list[str]:
  """Problems with `data.dirs` (empty when fine): missing directories, and any inside the
  held-out suite, which is never trained on."""
  problems = []
  for d in dirs:
    if not os.path.isdir(d):
      problems.append(f"data.dirs: {d!r} is not a directory")
    elif _inside(d, heldout_dir) or _inside(heldout_dir, d):
      problems.append(f"data.dirs: {d!r} holds the held-out suite ({heldout_dir}); held-out "
                      "environments are never a training source")
  return problems


def skill_of(code: str) -> str:
  """A program's skill from its docstring's first word ("Logical_Deduction: ..."), else ""."""
  m = re.match(r'\s*(?:[rRbBuU]?)("""|\'\'\')\s*(\w+)\s*:', code)
  return m.group(2) if m and m.group(2) in prompts.SKILL_DESCRIPTIONS else ""


def load_families():
  """The parameterised families module, or None while it does not exist."""
  try:
    from spade_jax.sandbox import families
  except ModuleNotFoundError as e:
    if e.name not in ("spade_jax.sandbox.families",):
      raise
    return None
  return families


def sources(use_starters: bool, use_families: bool, levels: Sequence[int],
            dirs: Sequence[str] = (), log=print, heldout_dir: str = HELDOUT_DIR) -> list[Source]:
  """Every source program, in a fixed order; refuses the held-out suite (ValueError)."""
  problems = check_dirs(dirs, heldout_dir)
  if problems:
    raise DataError("; ".join(problems))
  out = []
  if use_starters:
    out += [Source(f"starter:{n[:-3]}", s, starters.code(n))
            for n, s in sorted(starters.STARTERS.items())]
  if use_families:
    fam = load_families()
    if fam is None:
      log(FAMILIES_MISSING)
    else:
      for name in fam.NAMES:
        try:
          out += [Source(f"family:{name}@{level}", fam.skill(name), fam.render(name, level))
                  for level in levels]
        except (OSError, ValueError) as e:  # reported, and the run says which ones it skipped
          log(f"data.families: family {name} skipped ({type(e).__name__}: {e})")
  for d in dirs:
    for p in sorted(glob.glob(os.path.join(d, "*.py"))):
      if os.path.basename(p) != "__init__.py":
        with open(p, encoding="utf-8") as f:
          code = f.read()
        out.append(Source(f"dir:{p}", skill_of(code), code))
  held = heldout_digests(heldout_dir)
  copies = [s.name for s in out if _digest(s.code) in held]
  if copies:
    raise DataError(f"sources {copies} are copies of held-out environments ({heldout_dir}); "
                     "held-out environments are never a training source")
  return out


def distinct(srcs: Sequence[Source]) -> list[Source]:
  """The sources with distinct program texts (first of each), in order."""
  seen, out = set(), []
  for s in srcs:
    d = _digest(s.code)
    if d not in seen:
      seen.add(d)
      out.append(s)
  return out


# ---------------------------------------------------------------------------------------------
# Agent examples


def reply_text(solution_action: str, reasoning: str) -> str:
  """The assistant turn for one solution action: the reasoning line, then \\boxed{action}."""
  content = actions_lib.last_boxed(solution_action)
  content = solution_action.strip() if content is None else content
  return f"{reasoning.format(action=content)} \\boxed{{{content}}}"


def _text_ok(text: str) -> bool:
  try:
    text.encode("utf-8")
  except UnicodeEncodeError:
    return False
  return True


def play_solutions(pool: Pool, srcs: Sequence[Source], seeds_per_env: int, max_turns: int,
                   reasoning: str, seed: int, on_done=None) -> list[Play]:
  """Plays every source `seeds_per_env` times (distinct reset seeds drawn from `seed`) with its
  own solution, all episodes at once; returns the plays in (source, seed) order. `on_done(n)`
  counts episodes as they end."""
  on_done = on_done or (lambda n: None)
  rng = np.random.default_rng(seed)
  keys = [(i, int(s)) for i in range(len(srcs))
          for s in rng.choice(1 << 30, size=seeds_per_env, replace=False)]
  ended: dict[tuple[int, int], Play] = {}
  live: dict[int, tuple[tuple[int, int], list[str], list[str]]] = {}  # id -> key, replies, obs

  def end(key, obs, replies, how):
    ended[key] = Play(key[0], key[1], tuple(obs), tuple(replies), how)
    on_done(1)

  starts = {k: Start(srcs[k[0]].code, k[1], solution=True) for k in keys}
  for r in pool.start_many(starts):
    if not r.ok or not _text_ok(r.observation):
      if r.ok:
        pool.end_many([r.episode])
      end(r.key, [], [], "start_failed")
    elif not r.solution:
      pool.end_many([r.episode])
      end(r.key, [], [], "no_solution")
    elif len(r.solution) > max_turns:
      pool.end_many([r.episode])
      end(r.key, [], [], "too_many_turns")
    else:
      live[r.episode] = (r.key, [reply_text(str(a), reasoning) for a in r.solution],
                         [r.observation])
  while live:
    acts = {e: actions_lib.boxed_action(replies[len(obs) - 1])
            for e, (_, replies, obs) in live.items()}
    stop = []
    for r in pool.step_many(acts):
      key, replies, obs = live.pop(r.episode)
      used = replies[:len(obs)]
      if not r.ok:
        end(key, obs, used, "step_failed")
      elif r.done:
        end(key, obs, used, "won" if r.terminated and r.reward >= 1.0 else "not_won")
      elif len(obs) == len(replies) or not _text_ok(r.observation):
        stop.append(r.episode)
        end(key, obs, used, "not_won")
      else:
        live[r.episode] = (key, replies, obs + [r.observation])
    pool.end_many(stop)
  return [ended[k] for k in keys]


def agent_transcript(tokenizer, observations: Sequence[str],
                     replies: Sequence[str]) -> tok_lib.Transcript:
  """The episode as the agent sees and writes it: mask 1 on the replies' tokens only."""
  if len(observations) != len(replies) or not replies:
    raise ValueError(f"{len(observations)} observations for {len(replies)} replies")
  messages = prompts.agent_first_turn(observations[0])
  t = tok_lib.start(tokenizer, messages)
  for i, reply in enumerate(replies):
    if i:
      t = tok_lib.add_user(tokenizer, t, observations[i], last)
      messages = messages + [{"role": "user", "content": observations[i]}]
    last = tok_lib.reply_tokens(tokenizer, messages, reply)
    t = tok_lib.add_assistant(t, last)
    messages = messages + [{"role": "assistant", "content": reply}]
  return t


def sample(t: tok_lib.Transcript, role: str, src: Source) -> records.Sample:
  """An example as the learner's packing takes it (temperature 1, no behaviour log-probs)."""
  return records.Sample(t.tokens, t.mask, (0.0,) * len(t), 1.0, role, src.name, src.skill)


# ---------------------------------------------------------------------------------------------
# Designer examples


def few_shot(skill: str, code: str) -> list[str]:
  """The starter memory block's example: the skill's shortest starter that is not `code`."""
  others = [starters.code(n) for n in starters.by_skill(skill)]
  others = [o for o in others if _digest(o) != _digest(code)]
  return [min(others, key=len)] if others else []


def designer_transcript(tokenizer, src: Source, document: str | None, memory: str,
                        min_turns: int) -> tok_lib.Transcript:
  """The designer prompt for the program's skill and `document`, answered with the program."""
  shots = few_shot(src.skill, src.code) if memory == "starter" else []
  messages = prompts.designer(src.skill, document, prompts.memory_block([], [], shots), min_turns)
  t = tok_lib.start(tokenizer, messages)
  return tok_lib.add_assistant(
      t, tok_lib.reply_tokens(tokenizer, messages, prompts.designer_reply(src.code)))


def base_name(src: Source) -> str:
  """The program a source renders: a family's name without its level, else the source."""
  return src.name.split("@", 1)[0]


def designer_order(srcs: Sequence[Source], memory: str, seed: int
                   ) -> list[tuple[Source, str]]:
  """(program, memory mode) candidates for designer examples, best first: the distinct programs
  with a known skill in a seeded order that takes every base program (a family, a starter)
  once before a second level of any, then the rest; "mixed" alternates empty and starter
  memory blocks. Callers take examples from the front until they have enough that fit."""
  if memory not in MEMORY_MODES:
    raise ValueError(f"designer memory {memory!r} is not one of {MEMORY_MODES}")
  progs = [s for s in distinct(srcs) if s.skill]
  rng = np.random.default_rng(seed)
  progs = [progs[i] for i in rng.permutation(len(progs))]
  rank, seen = [], {}
  for s in progs:  # the k-th level drawn of a base goes in round k
    b = base_name(s)
    rank.append(seen.get(b, 0))
    seen[b] = rank[-1] + 1
  progs = [s for _, s in sorted(zip(rank, progs), key=lambda x: x[0])]
  modes = {"empty": ["empty"], "starter": ["starter"], "mixed": ["empty", "starter"]}[memory]
  return [(s, modes[j % len(modes)]) for j, s in enumerate(progs)]


# ---------------------------------------------------------------------------------------------
# Batches


def plan_batches(lengths: Sequence[int], batch: int, epochs: int, seed: int,
                 bucket) -> list[list[int]]:
  """Example indices of each optimizer step, epoch after epoch. Within an epoch the examples
  are ordered by length bucket (random order inside a bucket) and cut into batches of `batch`,
  so a batch's rows have similar lengths and little padding; the batches' order is shuffled."""
  out = []
  for e in range(epochs):
    rng = np.random.default_rng([seed, e])
    perm = rng.permutation(len(lengths))
    order = sorted(perm.tolist(), key=lambda i: bucket(lengths[i]))  # stable: random in a bucket
    # Cut from the long end, so the one short batch holds the shortest rows.
    cuts = list(range(len(order), 0, -batch))
    chunks = [order[max(0, i - batch):i] for i in cuts]
    out += [chunks[j] for j in rng.permutation(len(chunks))]
  return out
