"""Shared helpers for the sandbox's hostile-program tests: environment builders and host-side
checks (processes under a pool, System V IPC objects, the pool still serving)."""

import os
import textwrap
import time

from spade_jax.sandbox.contract import Status

GOOD = textwrap.dedent('''
    class CountEnv:
        def reset(self, seed=None):
            self.n = 0
            return "Say anything three times, in \\\\boxed{...}.", {}
        def step(self, action):
            self.n += 1
            return f"n={self.n}", float(self.n >= 3), self.n >= 3, False, {"n": self.n}
''')


def env(step_body: str, reset_body: str = "", prelude: str = "") -> str:
    """An environment whose step (and optionally reset) runs the given code; `result` is what
    step reports back as its observation when the code returns normally."""
    return (textwrap.dedent(prelude) + "\nclass HostileEnv:\n    def reset(self, seed=None):\n"
            + textwrap.indent(textwrap.dedent(reset_body) or "pass", " " * 8)
            + "\n        return 'hostile: actions go in \\\\boxed{...}', {}\n"
            + "    def step(self, action):\n        result = ''\n"
            + textwrap.indent(textwrap.dedent(step_body), " " * 8)
            + "\n        return str(result), 0.0, False, False, {}\n")


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...), zombies included."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            p = _ppid(int(d))
            if p is not None:
                parent[int(d)] = p
    out, frontier = [], {pid}
    while frontier:
        kids = [c for c, p in parent.items() if p in frontier]
        out += kids
        frontier = set(kids)
    return out


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def episode_pids(pool) -> list[int]:
    """Host pids of the episode processes of a pool (everything below its workers)."""
    return [p for w in pool.worker_pids() for p in descendants(w)]


def no_leftovers(pool, timeout: float = 3.0) -> None:
    assert pool.live == 0
    deadline = time.monotonic() + timeout
    while episode_pids(pool) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert episode_pids(pool) == [], f"left-over processes {episode_pids(pool)}"


def still_serves(pool, worker=None) -> None:
    replies = pool.play(GOOD, 0, ["\\boxed{a}"] * 3, worker=worker)
    assert [r.status for r in replies] == [Status.OK] * 4, replies
    assert replies[-1].terminated and replies[-1].reward == 1.0


def sysv_objects() -> set:
    """(kind, key, id) of every System V IPC object in this IPC namespace."""
    out = set()
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                next(f)
                out |= {(kind, *line.split()[:2]) for line in f}
        except OSError:
            pass
    return out


def step_once(pool, code, action="\\boxed{1}", timeout=None, worker=None):
    replies = pool.play(code, 0, [action], timeout=timeout, worker=worker)
    assert replies[0].ok, replies[0].reason
    return replies[-1]
