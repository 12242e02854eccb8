"""Admission of a generated environment (docs/method.md §2, made stricter).

An environment is admitted only if, within its own deadline (`Options.total_s`, counted from the
start of its own validation; at most `Options.parallel` environments are validated at once, so
the programs of one regeneration do not use up each other's time):
  1. its code loads: it compiles, exactly one `...Env` class is found (a base class and its
     subclass count as one) and it instantiates, with no arguments or else with max_turns=;
  2. `reset(s1)` returns (non-empty str, dict), its solution() (if defined) is taken right
     after, three probe actions each return a well-typed 5-tuple (stopping early if done), and
     `reset(s2)` succeeds;
  3. degenerate policies (empty, garbage, very long and "shotgun" actions) from `reset(s2)`
     neither win nor break it, and no win takes a single step;
  4. the solution taken in 2 is replayed in a fresh episode from `reset(s1)`, without calling
     solution() again, and wins: a solution() whose own call is what makes it win fails here;
  5. it is deterministic: every transcript above (2, each policy of 3, and 4) is played a second
     time on another worker, and the two must be identical, to the last step (each child
     reseeds `random` from fresh entropy and shifts its heap, so unseeded randomness and
     id()-based values show up here).
The seeds s1, s2 and the probe and garbage actions are drawn afresh for every environment from
a host-side RNG (probes.py; `Options.seed`, or the OS when it is None), so that a program that
knows this validator still cannot tell validation from training. Every episode also runs under
the pool's per-episode wall-time budget (`Limits.episode_s`). Every rejection names the failed
check and the typed outcome of the operation behind it, so admission rates and rejection
reasons aggregate directly (`rejection_stats`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
from typing import Iterable, Sequence

from .admission import Script, run
from .contract import Reply, Status, extract_code
from .pool import Pool
from .probes import degenerate_policies, draw
from .text import is_text

CHECKS = ("code", "compile", "exec", "class", "init", "reset", "solution", "probe_step", "reset_again",
          "determinism", "empty_probe", "garbage_probe", "long_probe", "shotgun_probe",
          "empty_wins", "garbage_wins", "long_wins", "shotgun_wins", "one_step_win", "deadline")
_degenerate_policies = degenerate_policies  # the fixed part; the name older callers used
POLICIES = ("empty", "garbage", "long", "shotgun")


@dataclasses.dataclass(frozen=True)
class Options:
    first_seed: int | None = None  # reset seed of the main episode; None: drawn per environment
    second_seed: int | None = None  # reset seed of reset_again and the policies; None: drawn
    probe_actions: tuple[str, ...] = ()  # the main episode's probes; empty: drawn
    degenerate_steps: int = 30  # more than the agent's 25-turn cap
    min_win_steps: int = 2  # a win must take more than one step
    total_s: float = 60.0  # the whole validation of one environment, from its own start
    seed: int | None = None  # of the host-side RNG that draws seeds and actions; None: the OS
    parallel: int = 0  # environments under validation at once; 0: max(2, CPUs)


@dataclasses.dataclass(frozen=True)
class Verdict:
    admitted: bool
    check: str  # "admitted", or the first check that failed (one of CHECKS)
    status: str  # typed outcome of the operation behind the failed check; "OK" if it ran fine
    reason: str
    seconds: float = 0.0  # from the start of this environment's validation to its verdict

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _won(r: Reply) -> bool:
    return r.ok and r.terminated and r.reward > 0


def _first_error(rs: list[Reply]) -> Reply | None:
    return next((r for r in rs if not r.ok), None)


def _reject(check: str, status, reason: str) -> Verdict:
    status = status.value if isinstance(status, Status) else status
    return Verdict(False, check, status, reason[:500])


def _compare(a: list[Reply], b: list[Reply]) -> str:
    if len(a) != len(b):
        return f"transcripts differ in length ({len(a)} vs {len(b)})"
    if a and a[0].solution != b[0].solution:
        return "solution() differs between two runs"
    for i, (x, y) in enumerate(zip(a, b)):
        ex, ey = x.transcript_entry(), y.transcript_entry()
        for field in ex:
            if ex[field] != ey[field]:
                return f"entry {i} differs in {field}: {str(ex[field])[:80]!r} vs {str(ey[field])[:80]!r}"
    return ""


def validate_many(pool: Pool, texts: Sequence[str], options: Options = Options()) -> list[Verdict]:
    """Judge many designer outputs at once (code is extracted from each), each environment
    under its own deadline, at most `options.parallel` at a time."""
    rng = random.Random(options.seed)
    codes = [extract_code(t) for t in texts]
    verdicts: dict[int, Verdict] = {}
    for i, c in enumerate(codes):
        if not c.strip():
            verdicts[i] = _reject("code", "OK", "no code")
        elif len(c) > pool.limits.max_code_chars:
            verdicts[i] = _reject("code", "OK", f"{len(c)} chars over {pool.limits.max_code_chars}")
        elif not is_text(c):
            verdicts[i] = _reject("code", "OK", "code has a lone surrogate (not UTF-8 text)")
    # Drawn for every program, in order, judged or not: the same seed gives each position the
    # same draws whatever the other programs are.
    draws = [draw(random.Random(rng.getrandbits(64)), pool.limits.max_action_chars,
                  options.degenerate_steps, options.first_seed, options.second_seed,
                  options.probe_actions) for _ in codes]
    todo = [i for i in range(len(codes)) if i not in verdicts]
    n_workers = pool.workers

    def main_script(i: int, twin: bool) -> Script:
        d = draws[i]
        return Script(codes[i], d.first_seed, (i + twin) % n_workers,
                      [*d.probes, ("reset", d.second_seed)], solution=True)

    def first(i: int) -> dict:
        return {"main": main_script(i, False)}

    def after_main(i: int, rs: list[Reply]) -> tuple[Verdict | None, dict]:
        v = _judge_main(rs, False, draws[i])
        if v is not None:
            return v, {}
        d = draws[i]
        more = {"main~": main_script(i, True)}
        for k, name in enumerate(POLICIES):
            w = (i + k) % n_workers
            more[name] = Script(codes[i], d.second_seed, w, d.policies[name])
            more[name + "~"] = Script(codes[i], d.second_seed, (w + 1) % n_workers, d.policies[name])
        if rs[0].solution is not None:
            sol = list(rs[0].solution)
            more["replay"] = Script(codes[i], d.first_seed, (i + 1) % n_workers, sol)
            more["replay~"] = Script(codes[i], d.first_seed, i % n_workers, sol)
        return None, more

    def judge(i: int, runs: dict, cut: bool) -> Verdict:
        if "main~" not in runs:
            return _judge_main(runs.get("main", []), True, draws[i])
        return _judge_rest(runs, cut, options)

    parallel = options.parallel or max(2, len(os.sched_getaffinity(0)))
    for i, (v, seconds) in run(pool, todo, first, after_main, judge, options.total_s, parallel).items():
        verdicts[i] = dataclasses.replace(v, seconds=round(seconds, 3))
    return [verdicts[i] for i in range(len(codes))]


def validate(pool: Pool, text: str, options: Options = Options()) -> Verdict:
    return validate_many(pool, [text], options)[0]


def _judge_main(rs: list[Reply], hit: bool, d) -> Verdict | None:
    if not rs:
        return _reject("deadline", Status.TIMEOUT, "validation deadline passed while loading")
    start = rs[0]
    if not start.ok:
        return _reject(start.phase or "reset", start.status, start.reason)
    err = _first_error(rs[1:])
    if err is not None:
        check = "reset_again" if len(rs) - 1 > len(d.probes) and rs[-1] is err else "probe_step"
        return _reject(check, err.status, err.reason)
    if len(rs) > 1 and _won(rs[1]):
        return _reject("one_step_win", "OK", f"the probe action {d.probes[0]!r} wins at once")
    if hit:
        return _reject("deadline", Status.TIMEOUT, "validation deadline passed")
    return None


def _judge_rest(runs: dict, hit: bool, options: Options) -> Verdict:
    if hit:  # a transcript cut short by the deadline would fail the checks below for no reason
        return _reject("deadline", Status.TIMEOUT, "validation deadline passed")
    for name in ("main", *POLICIES, "replay"):
        if name in runs:
            diff = _compare(runs[name], runs[name + "~"])
            if diff:
                err = _first_error(runs[name + "~"]) or _first_error(runs[name])
                return _reject("determinism", err.status if err else "OK", f"{name}: {diff}")
    for name in POLICIES:
        rs = runs[name]
        err = _first_error(rs)
        if err is not None:
            return _reject(f"{name}_probe", err.status, f"{name} actions: {err.reason}")
        wins = [j for j, r in enumerate(rs) if _won(r)]
        if wins:
            check = "one_step_win" if wins[0] < options.min_win_steps else f"{name}_wins"
            return _reject(check, "OK", f"{name} actions win after {wins[0]} steps")
    if "replay" in runs:
        rs = runs["replay"]
        err = _first_error(rs)
        if err is not None:
            return _reject("solution", err.status, f"replaying solution(): {err.reason}")
        if not rs or not _won(rs[-1]):
            return _reject("solution", "OK", f"solution() of {len(rs) - 1} actions does not win "
                                             "when replayed without calling it")
        if len(rs) - 1 < options.min_win_steps:
            return _reject("one_step_win", "OK", "solution() wins in a single step")
    return Verdict(True, "admitted", "OK", "")


def rejection_stats(verdicts: Iterable[Verdict]) -> dict:
    """Admission rate and rejection counts by check and by status, for metrics."""
    verdicts = list(verdicts)
    n = len(verdicts)
    rejected = [v for v in verdicts if not v.admitted]
    return {"n": n, "admitted": n - len(rejected), "admission_rate": (n - len(rejected)) / n if n else 0.0,
            "by_check": dict(collections.Counter(v.check for v in rejected)),
            "by_status": dict(collections.Counter(v.status for v in rejected))}
