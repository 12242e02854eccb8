"""Environment suites as benchmarks: `envs:DIR` plays every environment program of DIR as the agent.

Items: the `*.py` files of DIR (sorted; `__init__.py` skipped), one per environment, each played
`Sampling.n` episodes (smoke 2, paper 8; `--samples` overrides). The row is named
`envs:<DIR's base name>`.

Protocol: the self-play agent's, by running its code — `selfplay.episodes.play` (the first-turn
instruction of `selfplay.prompts.agent_first_turn`, the model's chat template, the action of
`spade_jax.actions.boxed_action`, observations as user turns, the outcome-only return), in the
sandbox, at most `Protocol.max_turns` agent turns (the environment's own limit ends an episode
sooner), `Sampling.max_new_tokens` per turn and `Protocol.context` tokens per episode (both capped
by the model's context). Episode k of file F resets with seed `reset_seed(run seed, F, k)`, so
two models evaluated separately play the same instances.

Win: the episode's own `Episode.won` (`episodes.won`): terminated with a positive final reward,
the self-play win rate's rule. Score: the
win rate, problems = environments. A program that cannot be read, compiled or reset gives one
sample per episode with its error (`error`, and `end` "start_failed"), each a loss.

Check players: `oracle` plays each environment's own `solution()` (returned by the sandbox at
start); environments without one are not scored and are named in the row (`unscored`); `empty`
sends "" every turn. Both drive the sandbox directly (no model, so no agent turns to sample).

Saved per episode (the sample's `completion`): env, episode, seed, program_sha256, turns (each
{"assistant": decoded text, "action": what was sent, "observation", "reward"}), return, end
(terminated | truncated | max_turns | context | crash | start_failed | out_of_actions), status,
won, error. The sample's `messages` are the first-turn prompt the agent saw. Re-scoring reads the
saved `won`; it needs neither the model nor DIR.

In-process use (several checkpoints, no re-spawning): `evaluate(model, tokenizer, DIR, preset)`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import zlib
from typing import Any, Iterator

from .generation import EmptyGenerator, OracleGenerator, Prompt
from .presets import ENVS_PREFIX
from .protocol import Benchmark, Context, Protocol, Unavailable

ROWS = 32  # episodes played together (two cohorts of 16, as ModelGenerator's max_rows)
NO_SOLUTION = "no solution() (the oracle plays an environment's own solution)"


@dataclasses.dataclass(frozen=True)
class Agent:
  """What playing needs from a model: its sampler, parameters and tokenizer."""

  sampler: Any
  params: Any
  tokenizer: Any
  rows: int = ROWS


def name_of(directory: str) -> str:
  return ENVS_PREFIX + os.path.basename(os.path.abspath(directory))


def reset_seed(run_seed: int, file_name: str, episode: int) -> int:
  from spade_jax.selfplay import seeds

  return seeds.derive(run_seed, zlib.crc32(file_name.encode("utf-8")), episode)


def programs(directory: str) -> list[str]:
  """File names of DIR's environment programs; Unavailable naming DIR if there are none."""
  if not directory:
    raise Unavailable(f"{ENVS_PREFIX} needs a directory: {ENVS_PREFIX}DIR")
  if not os.path.isdir(directory):
    raise Unavailable(f"{ENVS_PREFIX}{directory}: no such directory")
  names = sorted(n for n in os.listdir(directory) if n.endswith(".py") and n != "__init__.py"
                 and os.path.isfile(os.path.join(directory, n)))
  if not names:
    raise Unavailable(f"{ENVS_PREFIX}{directory}: no environment programs (*.py) in it")
  return names


def _read(path: str) -> tuple[str | None, str | None]:
  """(code, None) or (None, why it cannot be sent to the sandbox)."""
  from spade_jax.sandbox.contract import Limits

  try:
    with open(path, "rb") as f:
      code = f.read().decode("utf-8")
  except OSError as e:
    return None, f"read: cannot open ({e.strerror})"
  except UnicodeDecodeError as e:
    return None, f"read: not UTF-8 text ({e.reason} at byte {e.start})"
  if len(code) > Limits.max_code_chars:
    return None, f"read: {len(code)} chars, over the sandbox's {Limits.max_code_chars}"
  return code, None


def load(directory: str, ctx: Context) -> list[dict]:
  items = []
  for name in programs(directory):
    code, error = _read(os.path.join(directory, name))
    sha = hashlib.sha256((code or "").encode("utf-8")).hexdigest()[:16] if code else None
    items.append({"id": name, "prompt": Prompt(()), "gold": None, "code": code,
                  "error": error, "sha": sha})
  return items


# ----------------------------------------------------------------------------- records


def _record(item: dict, k: int, seed: int, **fields) -> dict:
  base = {"env": item["id"], "episode": k, "seed": seed, "program_sha256": item["sha"],
          "turns": [], "return": 0.0, "end": "start_failed", "status": "OK", "won": False,
          "error": None}
  return {**base, **fields}


def _with_prompt(item: dict, first_observation: str | None) -> dict:
  """The item as saved for one episode: its messages are the first turn that episode showed."""
  from spade_jax.selfplay import prompts

  if first_observation is None:
    return item
  return {**item, "prompt": Prompt(tuple(prompts.agent_first_turn(first_observation)))}


def _start_error(reply) -> str:
  where = f"{reply.phase}: " if reply.phase else ""
  return f"{where}{reply.status.value}: {reply.reason}".strip()


def _note(ctx: Context, key: str, env: str, value) -> None:
  ctx.notes.setdefault(key, {}).setdefault(env, value)


def _count_end(ctx: Context, rec: dict) -> None:
  ends = ctx.notes.setdefault("ends", {})
  ends[rec["end"]] = ends.get(rec["end"], 0) + 1
  if rec["end"] == "start_failed":
    _note(ctx, "failed_to_start", rec["env"], rec["error"])


# ----------------------------------------------------------------------------- the agent


class _Recorder:
  """The pool as `episodes.play` sees it, keeping every reply: the saved transcript gets the
  environment's own observations, rewards and start errors without a second episode loop."""

  def __init__(self, pool):
    self._pool = pool
    self.starts: dict = {}  # caller's key -> start reply
    self.steps: dict[int, list] = {}  # sandbox episode id -> [(action, reply)]
    self._sent: dict[int, str] = {}

  def __getattr__(self, name):
    return getattr(self._pool, name)

  def _keep(self, r):
    if r.episode in self._sent:
      self.steps.setdefault(r.episode, []).append((self._sent.pop(r.episode), r))
    else:
      self.starts[r.key] = r
    return r

  def start_many(self, starts, timeout=None):
    return (self._keep(r) for r in self._pool.start_many(starts, timeout))

  def submit_steps(self, actions, timeout=None):
    self._sent.update(actions)
    self._pool.submit_steps(actions, timeout)

  def step_many(self, actions, timeout=None):
    self._sent.update(actions)
    return (self._keep(r) for r in self._pool.step_many(actions, timeout))

  def wait(self, episodes=None, timeout=None):
    return [self._keep(r) for r in self._pool.wait(episodes, timeout)]


def agent_of(model, tokenizer=None) -> Agent:
  """An Agent from an Agent, a `loading.Loaded`, or eval's ModelGenerator."""
  from spade_jax import sampling

  if isinstance(model, Agent):
    return model
  if hasattr(model, "sampler") and hasattr(model, "loaded"):  # eval's ModelGenerator
    return Agent(model.sampler, model.loaded.params, model.loaded.tokenizer, 2 * model.max_rows)
  if hasattr(model, "params") and hasattr(model, "cfg"):  # loading.Loaded
    tok = tokenizer if tokenizer is not None else model.tokenizer
    if isinstance(tok, str):  # a tokenizer SPEC
      from spade_jax import checkpoint
      from spade_jax import tokenizer as tok_lib

      tok = tok_lib.load_tokenizer(checkpoint.tokenizer_path(tok))
    if tok is None:
      raise ValueError(f"model {getattr(model, 'source', '?')!r} has no tokenizer: pass one")
    loaded = dataclasses.replace(model, tokenizer=tok)  # its stop tokens go to the sampler
    return Agent(sampling.Sampler.for_model(loaded), model.params, tok)
  raise TypeError(f"cannot play environments with {type(model).__name__}: pass an envs.Agent, a "
                  "loading.Loaded, a ModelGenerator, or 'oracle' / 'empty'")


def _assistant_texts(transcript, tokenizer, stops: set[int]) -> list[str]:
  """Each sampled turn decoded: the runs of trained tokens, stop tokens dropped."""
  runs, cur = [], None
  for t, m in zip(transcript.tokens, transcript.mask):
    if m and cur is None:
      cur = []
      runs.append(cur)
    if m:
      cur.append(t)
    else:
      cur = None
  return [tokenizer.decode([t for t in r if t not in stops]) for r in runs]


def _settings(agent: Agent, proto: Protocol):
  from spade_jax import sampling
  from spade_jax.selfplay import episodes

  limit = agent.sampler.cfg.max_seq_len
  context = min(proto.context or limit, limit)
  s = proto.sampling
  settings = sampling.Settings(max_new_tokens=min(s.max_new_tokens, context // 2),
                               temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
  return settings, episodes.Limits(proto.max_turns, context)


def _agent_records(chunk, played, rec: _Recorder, agent: Agent) -> Iterator[tuple]:
  stops = set(agent.sampler.eos_ids) | set(agent.sampler.stop_ids)
  for g, ((item, k, seed), e) in enumerate(zip(chunk, played)):
    start = rec.starts.get((g, 0))
    steps = rec.steps.get(start.episode, []) if start is not None else []
    texts = _assistant_texts(e.transcript, agent.tokenizer, stops)
    turns = [{"assistant": text, "action": steps[i][0] if i < len(steps) else None,
              "observation": steps[i][1].observation if i < len(steps) else None,
              "reward": steps[i][1].reward if i < len(steps) else None}
             for i, text in enumerate(texts)]
    error = None
    if e.end == "start_failed":
      error = (_start_error(start) if start is not None and not start.ok
               else "reset: the first observation is not text a tokenizer takes")
    out = _record(item, k, seed, turns=turns, **{"return": e.ret}, end=e.end,
                  status=e.status, won=bool(e.won), error=error)
    first = start.observation if start is not None and start.ok and not error else None
    yield _with_prompt(item, first), k, out


def _play_agent(eps, agent: Agent, proto: Protocol, ctx: Context, gen=None) -> Iterator[tuple]:
  from spade_jax.selfplay import episodes, seeds

  settings, limits = _settings(agent, proto)
  ctx.notes.update(max_new_tokens=settings.max_new_tokens, context=limits.context)
  pool = ctx.pool()
  for start in range(0, len(eps), agent.rows):
    chunk = eps[start:start + agent.rows]
    rec = _Recorder(pool)
    groups = [episodes.Group(item["id"], item["code"], seed) for item, _, seed in chunk]
    key = zlib.crc32(",".join(f"{it['id']}/{k}" for it, k, _ in chunk).encode("utf-8"))
    played, timing = episodes.play(rec, agent.sampler, agent.params, agent.tokenizer, groups, 1,
                                   settings, limits, seeds.derive(proto.sampling.seed, key))
    ctx.notes["env_wait_s"] = round(ctx.notes.get("env_wait_s", 0.0) + timing.env_wait_s, 2)
    if gen is not None and hasattr(gen, "tokens_out"):  # the generator's own run statistics
      gen.tokens_out += timing.tokens
      gen.device_s += timing.sample_s
    yield from _agent_records(chunk, played, rec, agent)


# ----------------------------------------------------------------------------- check players


def won(reply) -> bool:
  """`selfplay.episodes`' win rule, for the check players (which play without that loop)."""
  from spade_jax.selfplay import episodes

  return episodes.won(reply.status, reply.reward, reply.terminated)


@dataclasses.dataclass
class _Script:
  index: int  # into the episode list
  actions: list[str]
  first: str
  turns: list = dataclasses.field(default_factory=list)


def _play_scripted(eps, oracle: bool, proto: Protocol, ctx: Context) -> Iterator[tuple]:
  from spade_jax.sandbox.pool import Start
  from spade_jax.selfplay import episodes

  pool = ctx.pool()
  live: dict[int, _Script] = {}
  starts = {i: Start(item["code"], seed, solution=oracle) for i, (item, _, seed) in enumerate(eps)}
  for r in pool.start_many(starts):
    item, k, seed = eps[r.key]
    if not r.ok:
      yield item, k, _record(item, k, seed, status=r.status.value, error=_start_error(r))
    elif oracle and r.solution is None:
      pool.end_many([r.episode])
      _note(ctx, "unscored", item["id"], NO_SOLUTION)
    else:
      script = [str(a) for a in r.solution] if oracle else [""] * proto.max_turns
      live[r.episode] = _Script(r.key, script, r.observation)

  def done(sid: int, **fields):
    s = live.pop(sid)
    item, k, seed = eps[s.index]
    return _with_prompt(item, s.first), k, _record(item, k, seed, turns=s.turns, **fields)

  while live:
    over = [sid for sid, s in live.items()
            if len(s.turns) >= min(len(s.actions), proto.max_turns)]
    pool.end_many(over)
    for sid in over:
      end = "max_turns" if len(live[sid].turns) >= proto.max_turns else "out_of_actions"
      yield done(sid, end=end)
    actions = {sid: s.actions[len(s.turns)] for sid, s in live.items()}
    for r in (pool.step_many(actions) if actions else ()):
      s = live[r.episode]
      s.turns.append({"assistant": actions[r.episode], "action": actions[r.episode],
                      "observation": r.observation, "reward": r.reward})
      if r.done:
        end = "crash" if not r.ok else "terminated" if r.terminated else "truncated"
        yield done(r.episode, **{"return": episodes.outcome(r.status, r.reward, r.terminated)},
                   end=end, status=r.status.value, won=won(r))


# ----------------------------------------------------------------------------- the benchmark


def play(items, gen, proto: Protocol, ctx: Context) -> Iterator[tuple]:
  """Every episode of every item; yields (item as saved, episode index, episode record)."""
  eps = [(it, k, reset_seed(proto.sampling.seed, it["id"], k))
         for it in items for k in range(proto.sampling.n)]
  runnable = []
  for item, k, seed in eps:
    if item["error"]:  # never sent to the sandbox
      yield item, k, _record(item, k, seed, status="UNREADABLE", error=item["error"])
    else:
      runnable.append((item, k, seed))
  if not runnable:
    return
  if not isinstance(gen, (OracleGenerator, EmptyGenerator)):
    yield from _play_agent(runnable, agent_of(gen), proto, ctx, gen)
    return
  scored = len(eps) - len(runnable)
  for out in _play_scripted(runnable, isinstance(gen, OracleGenerator), proto, ctx):
    scored += 1
    yield out
  if not scored:
    raise Unavailable("no environment defines solution(), so the oracle has nothing to play: "
                      f"{', '.join(sorted(ctx.notes.get('unscored', {})))}")


def _counted(items, gen, proto, ctx) -> Iterator[tuple]:
  for out in play(items, gen, proto, ctx):
    _count_end(ctx, out[2])
    yield out


def grade(pairs, ctx) -> list[dict]:
  """The saved episode's own verdict (its `won`); a record that is not one scores 0."""
  out = []
  for _, c in pairs:
    if not isinstance(c, dict) or not isinstance(c.get("won"), bool):
      out.append({"extracted": None, "score": 0.0, "error": "not an episode record"})
      continue
    turns = c.get("turns") or []
    g = {"extracted": turns[-1].get("action") if turns else None, "score": float(c["won"]),
         "return": c.get("return"), "end": c.get("end")}
    if c.get("error"):
      g["error"] = c["error"]
    out.append(g)
  return out


def benchmark(directory: str) -> Benchmark:
  """The `envs:` benchmark of DIR; ValueError naming DIR if it holds no programs."""
  try:
    programs(directory)
  except Unavailable as e:
    raise ValueError(str(e)) from None
  return Benchmark(name_of(directory), "envs", lambda ctx: load(directory, ctx), grade,
                   play=_counted, offline=False, self_contained=True)


def _no_data(ctx):
  raise Unavailable("an environment suite is re-scored from its saved episodes only")


def saved(name: str) -> Benchmark:
  """An `envs:` benchmark for re-scoring saved samples (its directory is not needed)."""
  return Benchmark(name, "envs", _no_data, grade, offline=False, self_contained=True)


def evaluate(model, tokenizer, directory: str, preset: str = "smoke", *, out: str | None = None,
             overrides: dict | None = None, pool=None) -> dict:
  """Plays DIR's environments in this process; returns the summary row ({"name", "score",
  "ci95", "stderr", "n", "problems", "status", ...}).

  model: an `Agent` (reuse one sampler across checkpoints: `Agent(sampler, params, tok)`), a
  `loading.Loaded`, a model SPEC, or "oracle" / "empty"; tokenizer: a tokenizer object for a
  Loaded without one (random:*), or a tokenizer SPEC with a model SPEC.
  out: a directory for samples/<name>.jsonl (resumable); default a temporary one.
  overrides: protocol fields, e.g. {"n": 4, "max_turns": 10, "seed": 1}. pool: a running
  sandbox pool to use (left open); default a fresh one."""
  from . import generation, presets, run

  bench = benchmark(directory)
  proto = presets.override(presets.protocol(preset, bench.name), overrides)
  if isinstance(model, str):  # oracle, empty, or a SPEC loaded here
    gen = generation.make_generator(model, tokenizer=tokenizer)
  else:
    gen = agent_of(model, tokenizer)
  ctx = Context(proto, None, _pool=pool)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(out or tmp, "samples", f"{bench.name}.jsonl")
    try:
      row = run.run_benchmark(bench, gen, proto, ctx, path)
    except Unavailable as e:
      row = {"score": None, "n": 0, "stderr": None, "status": "unavailable", "reason": str(e)}
    finally:
      if pool is None:
        ctx.close()
  return {"name": bench.name, **row}
