"""The episodes of many admissions, played at once, each environment under its own deadline.

An environment's validation is a set of scripted episodes (validate.py says which). Its deadline
starts when its first episode starts, and at most `parallel` environments are under validation
at a time; the rest wait their turn. So a program is judged within its own time, whatever the
number of programs in the call: sharing one deadline among all of them rejected slow but valid
programs as `deadline` under load. Within an environment, every episode sends its next request
as soon as its last one is answered, so a slow episode delays nobody else.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable

from .contract import Reply
from .pool import Pool, Start


@dataclasses.dataclass
class Script:
    code: str
    seed: int
    worker: int | None
    actions: list  # str for a step, ("reset", seed) for a reset
    solution: bool = False  # ask for solution() right after the first reset


@dataclasses.dataclass
class _Env:
    t0: float
    deadline: float
    scripts: dict = dataclasses.field(default_factory=dict)
    runs: dict = dataclasses.field(default_factory=dict)  # name -> [start reply, one per request]
    live: set = dataclasses.field(default_factory=set)  # episode ids


def run(pool: Pool, todo: list[int], first: Callable, after_main: Callable, judge: Callable,
        total_s: float, parallel: int) -> dict:
    """Validate environments `todo`: `first(i)` gives the first scripts ({"main": Script});
    when "main" ends, `after_main(i, replies)` gives (a verdict, or None and more scripts);
    when all scripts end, or the deadline passes, `judge(i, runs, cut)` gives the verdict.
    Returns {i: (verdict, seconds from the start of i's validation)}."""
    out: dict[int, tuple] = {}
    queue = collections.deque(todo)
    active: dict[int, _Env] = {}
    key_of: dict[int, tuple] = {}  # episode id -> (environment, script name)

    def left(e: _Env) -> float:
        return max(0.001, e.deadline - time.monotonic())

    def launch(i: int, e: _Env, scripts: dict) -> None:
        e.scripts.update(scripts)
        starts = {(i, n): Start(s.code, s.seed, s.worker, solution=s.solution) for n, s in scripts.items()}
        ids = pool.submit_starts(starts, timeout=min(pool.limits.load_s, left(e)))
        for eid, name in zip(ids, scripts):
            key_of[eid], e.runs[name] = (i, name), []
            e.live.add(eid)

    def finish(i: int, e: _Env, verdict) -> None:
        pool.end_many(e.live)
        for eid in e.live:
            key_of.pop(eid, None)
        e.live.clear()
        out[i] = (verdict, time.monotonic() - e.t0)
        del active[i]

    def answered(i: int, e: _Env, name: str, eid: int, r: Reply) -> None:
        rs = e.runs[name]
        rs.append(r)
        acts = e.scripts[name].actions
        j = len(rs) - 1  # index of the next request
        if not (r.done or j >= len(acts)):
            a = acts[j]
            if isinstance(a, str):
                pool.submit_steps({eid: a}, timeout=min(pool.limits.step_s, left(e)))
            else:
                pool.submit_resets({eid: a[1]}, timeout=min(pool.limits.reset_s, left(e)))
            return
        e.live.discard(eid)
        key_of.pop(eid, None)
        pool.end_many([eid])
        if name == "main":
            verdict, more = after_main(i, rs)
            if verdict is not None:
                finish(i, e, verdict)
                return
            launch(i, e, more)
        if not e.live:
            finish(i, e, judge(i, e.runs, False))

    while queue or active:
        while queue and len(active) < parallel:
            i, now = queue.popleft(), time.monotonic()
            active[i] = _Env(now, now + total_s)
            launch(i, active[i], first(i))
        now = time.monotonic()
        for i, e in list(active.items()):
            if now >= e.deadline:
                finish(i, e, judge(i, e.runs, True))
            elif not e.live:  # nothing was launched: nothing to wait for
                finish(i, e, judge(i, e.runs, False))
        if not active:
            continue
        live = [eid for e in active.values() for eid in e.live]
        until = min(e.deadline for e in active.values())
        for r in pool.wait(live, timeout=max(0.001, until - now)):
            k = key_of.get(r.episode)
            if k is not None and k[0] in active:
                answered(k[0], active[k[0]], k[1], r.episode, r)
    return out
