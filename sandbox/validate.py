"""Admission of a generated environment (docs/method.md §2, made stricter).

An environment is admitted only if, within one overall deadline:
  1. its code loads: it compiles, exactly one `...Env` class is found (a base class and its
     subclass count as one) and it instantiates, with no arguments or else with max_turns=;
  2. `reset(42)` returns (non-empty str, dict), three probe actions each return a well-typed
     5-tuple (stopping early if done), and `reset(123)` succeeds;
  3. it is deterministic: the same seed and actions give an identical transcript in a second
     episode on a different worker (each child reseeds the global `random` from fresh entropy,
     so unseeded randomness shows up here);
  4. degenerate policies (empty, garbage, very long and "shotgun" actions) neither win nor break
     it, and no win (from any probe or its own solution()) takes a single step;
  5. if it defines solution(), playing that solution from reset(42) wins.
Every rejection names the failed check and the typed outcome of the operation behind it, so
admission rates and rejection reasons aggregate directly (`rejection_stats`).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Iterable, Sequence

from .contract import Reply, Status, extract_code
from .pool import Pool, Start

CHECKS = ("code", "compile", "exec", "class", "init", "reset", "probe_step", "reset_again",
          "determinism", "empty_probe", "garbage_probe", "long_probe", "shotgun_probe",
          "empty_wins", "garbage_wins", "long_wins", "shotgun_wins", "one_step_win", "solution",
          "deadline")


def _degenerate_policies(max_action_chars: int) -> dict[str, list[str]]:
    long_n = max(16, max_action_chars - 16)
    words = ("yes no true false up down left right north south east west A B C D E "
             "red green blue on off open close left right swap move add remove 0 1 x y")
    return {
        "empty": ["", "\\boxed{}", " ", "\\boxed{ }"],
        "garbage": ["\\boxed{asdf}", "lorem ipsum", "\\boxed{?!#%}", "}{", "\\boxed{None}",
                    "\\boxed{\\boxed{}}", "\\boxed{-1}", "\\boxed{0}", "\\boxed{3.5e300}",
                    "\\boxed{\u00e9\u4e2d\U0001F600}", "\\boxed{[[[}", "\\boxed{zzz}"],
        "long": ["\\boxed{" + ("7 " * long_n)[:long_n] + "}", "\\boxed{" + "a" * long_n + "}",
                 "x" * (long_n + 8)],
        "shotgun": ["\\boxed{" + " ".join(str(i) for i in range(-10, 201)) + "}",
                    "\\boxed{" + ", ".join(words.split()) + "}",
                    "\\boxed{" + ",".join(str(i) for i in range(0, 1000)) + "}",
                    "\\boxed{" + " ".join(f"{a}{b}" for a in "ABCDEFGH" for b in range(1, 9)) + "}"],
    }


@dataclasses.dataclass(frozen=True)
class Options:
    first_seed: int = 42
    second_seed: int = 123
    probe_actions: tuple[str, ...] = ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}")
    degenerate_steps: int = 30  # more than the agent's 25-turn cap
    min_win_steps: int = 2  # a win must take more than one step
    total_s: float = 60.0  # the whole validation of one environment


@dataclasses.dataclass(frozen=True)
class Verdict:
    admitted: bool
    check: str  # "admitted", or the first check that failed (one of CHECKS)
    status: str  # typed outcome of the operation behind the failed check; "OK" if it ran fine
    reason: str
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Script:
    code: str
    seed: int
    worker: int | None
    actions: list  # str for a step, ("reset", seed) for a reset
    use_solution: bool = False  # ask for solution() at start, then play it as the actions


def _run(pool: Pool, scripts: dict, deadline: float, then=None,
         finished: dict | None = None) -> tuple[dict[object, list[Reply]], set]:
    """Play scripts concurrently; each episode sends its next request as soon as its last one is
    answered, so a slow environment delays nobody else. `then(key, transcript)` may return more
    scripts to start when one finishes. Returns transcripts (the start reply, then one reply per
    request until done) and the keys the deadline cut short."""
    out: dict[object, list[Reply]] = {}
    left = lambda: max(0.001, deadline - time.monotonic())  # noqa: E731
    key_of: dict[int, object] = {}
    acts: dict[object, list] = {}
    live: set[int] = set()
    finished = {} if finished is None else finished  # key -> when its episode ended

    def launch(batch: dict) -> None:
        starts = {k: Start(s.code, s.seed, s.worker, solution=s.use_solution) for k, s in batch.items()}
        ids = pool.submit_starts(starts, timeout=min(pool.limits.load_s, left()))
        for e, k in zip(ids, batch):
            key_of[e], out[k] = k, []
            live.add(e)

    launch(scripts)
    while live:
        if deadline - time.monotonic() <= 0:
            pool.end_many(live)
            return out, {key_of[e] for e in live}
        for r in pool.wait(live, timeout=left()):
            k = key_of[r.episode]
            out[k].append(r)
            if len(out[k]) == 1:
                s = scripts[k]
                acts[k] = list(r.solution or []) if s.use_solution else s.actions
            i = len(out[k]) - 1  # index of the next request
            if r.done or i >= len(acts[k]):
                live.discard(r.episode)
                pool.end_many([r.episode])
                finished[k] = time.monotonic()
                more = then(k, out[k]) if then else None
                if more:
                    scripts.update(more)
                    launch(more)
            elif isinstance(acts[k][i], str):
                pool.submit_steps({r.episode: acts[k][i]}, timeout=min(pool.limits.step_s, left()))
            else:
                pool.submit_resets({r.episode: acts[k][i][1]}, timeout=min(pool.limits.reset_s, left()))
    return out, set()


def _won(r: Reply) -> bool:
    return r.ok and r.terminated and r.reward > 0


def _first_error(rs: list[Reply]) -> Reply | None:
    return next((r for r in rs if not r.ok), None)


def _reject(check: str, status, reason: str, t0: float) -> Verdict:
    status = status.value if isinstance(status, Status) else status
    return Verdict(False, check, status, reason[:500], round(time.monotonic() - t0, 3))


def _compare(a: list[Reply], b: list[Reply]) -> str:
    if len(a) != len(b):
        return f"transcripts differ in length ({len(a)} vs {len(b)})"
    for i, (x, y) in enumerate(zip(a, b)):
        ex, ey = x.transcript_entry(), y.transcript_entry()
        for field in ex:
            if ex[field] != ey[field]:
                return f"entry {i} differs in {field}: {str(ex[field])[:80]!r} vs {str(ey[field])[:80]!r}"
    return ""


def validate_many(pool: Pool, texts: Sequence[str], options: Options = Options()) -> list[Verdict]:
    """Judge many designer outputs at once (code is extracted from each). All environments are
    validated concurrently, each under its own overall deadline."""
    t0 = time.monotonic()
    deadline = t0 + options.total_s
    codes = [extract_code(t) for t in texts]
    verdicts: dict[int, Verdict] = {}
    for i, c in enumerate(codes):
        if not c.strip():
            verdicts[i] = _reject("code", "OK", "no code", t0)
        elif len(c) > pool.limits.max_code_chars:
            verdicts[i] = _reject("code", "OK", f"{len(c)} chars over {pool.limits.max_code_chars}", t0)
    todo = [i for i in range(len(codes)) if i not in verdicts]
    w_a, w_b = 0, 1 % pool.workers
    main = [*options.probe_actions, ("reset", options.second_seed)]
    policies = _degenerate_policies(pool.limits.max_action_chars)
    scripts = {(i, "main"): _Script(codes[i], options.first_seed, w_a, main) for i in todo}

    def then(key, rs: list[Reply]) -> dict | None:
        # The reference checks first, on one worker; only what passes them is probed further:
        # determinism, degenerate policies and its own solution, all at once.
        i, what = key
        if what != "main":
            return None
        v = _judge_main(rs, False, options, t0)
        if v is not None:
            verdicts[i] = v
            return None
        more = {(i, "twin"): _Script(codes[i], options.first_seed, w_b, main)}
        if rs[0].solution is not None:
            more[(i, "solution")] = _Script(codes[i], options.first_seed, None, [], use_solution=True)
        for name, acts in policies.items():
            seq = [acts[j % len(acts)] for j in range(options.degenerate_steps)]
            more[(i, name)] = _Script(codes[i], options.second_seed, None, seq)
        return more

    finished: dict = {}
    runs, cut = _run(pool, scripts, deadline, then, finished)
    for i in todo:
        if i in verdicts:
            continue
        t_i = max([t for k, t in finished.items() if k[0] == i] or [time.monotonic()])
        if (i, "main") in cut or (i, "twin") not in runs:
            verdicts[i] = _judge_main(runs[(i, "main")], True, options, t0)
            continue
        hit = any(k[0] == i for k in cut)
        v = _judge_rest(i, runs[(i, "main")], runs, hit, policies, options, t0)
        verdicts[i] = dataclasses.replace(v, seconds=round(t_i - t0, 3))
    return [verdicts[i] for i in range(len(codes))]


def validate(pool: Pool, text: str, options: Options = Options()) -> Verdict:
    return validate_many(pool, [text], options)[0]


def _judge_main(rs: list[Reply], hit: bool, options: Options, t0: float) -> Verdict | None:
    if not rs:
        return _reject("deadline", Status.TIMEOUT, "validation deadline passed while loading", t0)
    start = rs[0]
    if not start.ok:
        return _reject(start.phase or "reset", start.status, start.reason, t0)
    err = _first_error(rs[1:])
    if err is not None:
        check = "reset_again" if len(rs) - 1 > len(options.probe_actions) and rs[-1] is err else "probe_step"
        return _reject(check, err.status, err.reason, t0)
    if len(rs) > 1 and _won(rs[1]):
        return _reject("one_step_win", "OK", f"the probe action {options.probe_actions[0]!r} wins at once", t0)
    if hit:
        return _reject("deadline", Status.TIMEOUT, "validation deadline passed", t0)
    return None


def _judge_rest(i, main: list[Reply], second: dict, hit: bool, policies: dict, options: Options,
                t0: float) -> Verdict:
    if hit:  # a transcript cut short by the deadline would fail the checks below for no reason
        return _reject("deadline", Status.TIMEOUT, "validation deadline passed", t0)
    diff = _compare(main, second[(i, "twin")])
    if diff:
        err = _first_error(second[(i, "twin")])
        return _reject("determinism", err.status if err else "OK", diff, t0)
    for name, acts in policies.items():
        rs = second[(i, name)]
        err = _first_error(rs)
        if err is not None:
            return _reject(f"{name}_probe", err.status, f"{name} actions: {err.reason}", t0)
        wins = [j for j, r in enumerate(rs) if _won(r)]
        if wins:
            check = "one_step_win" if wins[0] < options.min_win_steps else f"{name}_wins"
            return _reject(check, "OK", f"{name} actions win after {wins[0]} steps, "
                                        f"e.g. {acts[(wins[0] - 1) % len(acts)][:60]!r}", t0)
    if (i, "solution") in second:
        rs = second[(i, "solution")]
        err = _first_error(rs)
        if err is not None:
            return _reject("solution", err.status, f"playing solution(): {err.reason}", t0)
        if not rs or not _won(rs[-1]):
            return _reject("solution", "OK", f"solution() of {len(rs) - 1} actions does not win", t0)
        if len(rs) - 1 < options.min_win_steps:
            return _reject("one_step_win", "OK", "solution() wins in a single step", t0)
    return Verdict(True, "admitted", "OK", "", round(time.monotonic() - t0, 3))


def rejection_stats(verdicts: Iterable[Verdict]) -> dict:
    """Admission rate and rejection counts by check and by status, for metrics."""
    verdicts = list(verdicts)
    n = len(verdicts)
    rejected = [v for v in verdicts if not v.admitted]
    return {"n": n, "admitted": n - len(rejected), "admission_rate": (n - len(rejected)) / n if n else 0.0,
            "by_check": dict(collections.Counter(v.check for v in rejected)),
            "by_status": dict(collections.Counter(v.status for v in rejected))}
