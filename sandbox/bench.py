"""`python -m spade_jax.sandbox bench`: episode throughput through the pool against a fresh process per
episode, and the step round trip, measured in one run on the same small environment.

Both paths run the same work (load + reset + 10 steps) with the same number of episodes in
flight, so the ratio compares the mechanisms, not the machine's load at two different times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .pool import PROTECTIONS, Pool, Start

BENCH_ENV = r'''
class CounterEnv:
    """Reach the target by adding numbers; actions go in \boxed{...}."""

    def __init__(self, max_turns=50):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.total, self.turns = 0, 0
        return "Add numbers to reach 10**9. Put your number in \\boxed{...}.", {"total": 0}

    def step(self, action):
        self.turns += 1
        digits = "".join(ch for ch in action if ch.isdigit())
        self.total += int(digits[:6] or 0)
        won = self.total >= 10**9
        return f"total={self.total}", float(won), won, self.turns >= self.max_turns, {"total": self.total}
'''

STEPS = 10

# The same episode in a fresh interpreter: what running each environment in its own process costs.
_SPAWN_RUNNER = r'''
import json, sys
ns = {"__name__": "__env__"}
exec(compile(sys.stdin.read(), "<env>", "exec"), ns)
env = ns["CounterEnv"]()
out = [env.reset(seed=0)]
for i in range(%d):
    out.append(env.step("\\boxed{%%d}" %% i))
print(json.dumps(out))
''' % STEPS


def _pool_episodes(pool: Pool, n: int, in_flight: int) -> float:
    t0, done = time.perf_counter(), 0
    while done < n:
        k = min(in_flight, n - done)
        live = {r.episode for r in pool.start_many({i: Start(BENCH_ENV, 0) for i in range(k)}) if r.ok}
        assert len(live) == k, "bench episode failed to start"
        for step in range(STEPS):
            for r in pool.step_many({e: f"\\boxed{{{step}}}" for e in live}):
                assert r.ok, r.reason
        pool.end_many(live)
        done += k
    return n / (time.perf_counter() - t0)


def _spawn_episodes(n: int, in_flight: int) -> float:
    env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}
    t0, done = time.perf_counter(), 0
    while done < n:
        k = min(in_flight, n - done)
        procs = [subprocess.Popen([sys.executable, "-c", _SPAWN_RUNNER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env) for _ in range(k)]
        for p in procs:
            out, _ = p.communicate(BENCH_ENV.encode())
            assert p.returncode == 0 and len(json.loads(out)) == STEPS + 1
        done += k
    return n / (time.perf_counter() - t0)


def _step_rtt(pool: Pool, n: int) -> tuple[float, float]:
    (first,) = list(pool.start_many({0: Start(BENCH_ENV, 0)}))
    lat = []
    for i in range(n):
        t = time.perf_counter()
        (r,) = list(pool.step_many({first.episode: "\\boxed{1}"}))
        lat.append(time.perf_counter() - t)
        if r.done:
            (first,) = list(pool.start_many({0: Start(BENCH_ENV, 0)}))
    pool.end_many([first.episode])
    lat.sort()
    return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


def run(episodes: int = 200, spawn_episodes: int = 40, in_flight: int = 8, rtt_steps: int = 2000,
        workers: int | None = None) -> dict:
    workers = workers or min(4, os.cpu_count() or 1)
    with Pool(workers=workers) as pool:
        _pool_episodes(pool, in_flight, in_flight)  # warm-up: page cache, first forks
        pool_eps = _pool_episodes(pool, episodes, in_flight)
        spawn_eps = _spawn_episodes(spawn_episodes, in_flight)
        p50, p99 = _step_rtt(pool, rtt_steps)
        protections = [k for k in PROTECTIONS if pool.protections.get(k)]
    return {"episodes_per_s": round(pool_eps, 1), "spawn_episodes_per_s": round(spawn_eps, 1),
            "speedup": round(pool_eps / spawn_eps, 2), "step_rtt_us_p50": round(p50, 1),
            "step_rtt_us_p99": round(p99, 1), "steps_per_episode": STEPS, "in_flight": in_flight,
            "workers": workers, "cpus": os.cpu_count(), "protections": protections}
