"""The pool's batched API and its housekeeping: finishing order, abandonment, no leaks over many
episodes, recovery from a dead worker, the start-up probe and `require`."""

import dataclasses
import os
import signal
import textwrap
import time

import pytest

from spade_jax.sandbox.contract import Limits, Status
from spade_jax.sandbox.pool import DEFAULT_REQUIRE, PROTECTIONS, Pool, SandboxUnavailable, Start

LIMITS = dataclasses.replace(Limits(), memory_bytes=256 << 20, load_s=3.0, reset_s=1.0, step_s=1.0)

SLEEPY = textwrap.dedent('''
    import time
    class SleepyEnv:
        def __init__(self, max_turns=5):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.seed, self.t = seed, 0
            return f"seed {seed}: put the delay in ms in \\\\boxed{{...}}", {"seed": seed}
        def step(self, action):
            self.t += 1
            time.sleep(int(action.strip("\\\\boxed{}") or 0) / 1000)
            return f"slept {action}", 0.0, False, self.t >= self.max_turns, {"t": self.t}
''')


def _children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except OSError:
                pass
    return out


def _wait_no_children(pool, timeout=3.0):
    deadline = time.monotonic() + timeout
    while [c for w in pool.worker_pids() for c in _children(w)] and time.monotonic() < deadline:
        time.sleep(0.02)
    return [c for w in pool.worker_pids() for c in _children(w)]


@pytest.fixture(scope="module")
def pool():
    with Pool(workers=2, limits=LIMITS) as p:
        yield p


def test_probe_reports_every_protection(pool):
    assert set(PROTECTIONS) <= set(pool.protections)
    assert all(pool.protections[p] for p in DEFAULT_REQUIRE)
    assert pool.protections["threads"], "the seccomp filter must not break threads (clone3 -> ENOSYS)"


def test_start_and_step_many_return_in_finishing_order(pool):
    starts = {f"k{i}": Start(SLEEPY, seed=i) for i in range(4)}
    replies = list(pool.start_many(starts))
    assert sorted(r.key for r in replies) == sorted(starts)
    assert all(r.ok and r.observation.startswith(f"seed {r.info['seed']}") for r in replies)
    eps = {r.key: r.episode for r in replies}
    delays = {eps["k0"]: 400, eps["k1"]: 0, eps["k2"]: 200, eps["k3"]: 0}
    order = [r.episode for r in pool.step_many({e: f"\\boxed{{{d}}}" for e, d in delays.items()})]
    assert set(order[:2]) == {eps["k1"], eps["k3"]} and order[2:] == [eps["k2"], eps["k0"]]
    pool.end_many(eps.values())
    assert pool.live == 0


def test_submit_and_wait_overlap(pool):
    ids = pool.submit_starts({i: Start(SLEEPY, seed=i) for i in range(3)})
    got = []
    while len(got) < 3:
        got += pool.wait(ids)
    pool.submit_steps({ids[0]: "\\boxed{300}", ids[1]: "\\boxed{0}"})
    assert pool.wait([ids[2]], timeout=0.05) == []  # nothing of episode 2 is out
    first = pool.wait(ids)
    assert [r.episode for r in first] == [ids[1]]
    with pytest.raises(ValueError):
        pool.submit_steps({ids[0]: "again"})  # one request at a time per episode
    pool.end_many(ids)
    assert pool.live == 0 and pool.wait(ids, timeout=0.01) == []


def test_truncation_ends_the_episode(pool):
    replies = pool.play(SLEEPY, 1, ["\\boxed{0}"] * 10)
    assert len(replies) == 6 and replies[-1].truncated and not replies[-1].terminated
    assert pool.live == 0


def test_abandoning_mid_iteration_kills_the_rest(pool):
    eps = [r.episode for r in pool.start_many({i: SLEEPY for i in range(6)})]
    it = pool.step_many({e: "\\boxed{2000}" if i else "\\boxed{0}" for i, e in enumerate(eps)})
    first = next(it)
    assert first.episode == eps[0]
    it.close()
    assert pool.live == 1  # the episode whose reply was consumed lives on
    pool.end_many([first.episode])
    assert pool.live == 0
    assert _wait_no_children(pool) == []


def test_nothing_leaks_over_many_episodes(pool):
    fds_before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        eps = [r.episode for r in pool.start_many({i: SLEEPY for i in range(30)})]
        for r in pool.step_many({e: "\\boxed{0}" for e in eps}):
            assert r.ok
        pool.end_many(eps[::2])  # abandon half, finish the other half by truncation
        for _ in range(4):
            for r in pool.step_many({e: "\\boxed{0}" for e in eps[1::2]}):
                assert r.ok
    assert pool.live == 0
    assert _wait_no_children(pool) == []
    assert len(os.listdir("/proc/self/fd")) == fds_before
    if not pool.protections["tmpfs"]:  # otherwise temp dirs live in a private mount namespace
        for w in os.listdir(pool._root):  # no episode's temp dir is left
            assert [n for n in os.listdir(os.path.join(pool._root, w)) if n.startswith("ep")] == []


def test_a_dead_worker_is_replaced(pool):
    (r,) = list(pool.start_many({0: Start(SLEEPY, worker=0)}))
    victim = pool.worker_pids()[0]
    it = pool.step_many({r.episode: "\\boxed{1000}"})
    os.kill(victim, signal.SIGKILL)
    (dead,) = list(it)
    assert dead.status is Status.CRASHED
    assert pool.worker_pids()[0] != victim
    replies = pool.play(SLEEPY, 0, ["\\boxed{0}"] * 2, worker=0)
    assert all(r.ok for r in replies)
    assert _wait_no_children(pool) == []


def test_require_fails_loudly():
    with pytest.raises(ValueError):
        Pool(workers=1, limits=LIMITS, require=("no-such-protection",))
    probe = Pool(workers=1, limits=LIMITS, require=())
    missing = [p for p in PROTECTIONS if not probe.protections[p]]
    probe.close()
    if not missing:
        pytest.skip("every protection is in force on this machine; nothing to require in vain")
    with pytest.raises(SandboxUnavailable):
        Pool(workers=1, limits=LIMITS, require=(missing[0],))


def test_pool_close_leaves_nothing():
    p = Pool(workers=2, limits=LIMITS)
    pids, root = p.worker_pids(), p._root
    eps = [r.episode for r in p.start_many({i: SLEEPY for i in range(5)})]
    assert len(eps) == 5
    p.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
    assert not os.path.exists(root)


def test_cpu_time_limit_is_a_timeout():
    limits = dataclasses.replace(LIMITS, cpu_seconds=1, step_s=30)
    spin = SLEEPY.replace("time.sleep(int(action.strip(\"\\\\boxed{}\") or 0) / 1000)", "while True: pass")
    assert "while True" in spin
    with Pool(workers=1, limits=limits) as p:
        replies = p.play(spin, 0, ["\\boxed{0}"])
        assert replies[-1].status is Status.TIMEOUT and "CPU" in replies[-1].reason, replies[-1]
        assert _wait_no_children(p) == []


def test_a_reply_in_time_is_not_a_timeout_when_read_late(pool):
    """The host may be busy (sampling on the device) past a step's deadline; a reply the child
    sent in time is still delivered, not turned into a TIMEOUT."""
    (r,) = list(pool.start_many({0: Start(SLEEPY, 1)}))
    pool.submit_steps({r.episode: "\\boxed{0}"})
    time.sleep(LIMITS.step_s + 0.5)
    (reply,) = pool.wait([r.episode])
    assert reply.status is Status.OK and reply.observation.startswith("slept")
    pool.submit_steps({r.episode: "\\boxed{3000}"})  # a child that really is late is still killed
    (late,) = pool.wait([r.episode])
    assert late.status is Status.TIMEOUT


def test_cgroup_accounting_is_probed_not_assumed(tmp_path, monkeypatch):
    """Without a delegated cgroup v2 directory the probe says so and why; a directory that is
    not a real cgroup is not taken for one; `require` can demand the protection."""
    from spade_jax.sandbox import cgroups

    monkeypatch.delenv(cgroups.ENV, raising=False)
    with Pool(workers=1, limits=LIMITS) as p:
        assert p.protections["cgroup"] is False and "not configured" in p.protections["cgroup_error"]
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "cgroup.controllers").write_text("memory pids\n")
    (fake / "cgroup.subtree_control").write_text("")
    monkeypatch.setenv(cgroups.ENV, str(fake))
    with Pool(workers=1, limits=LIMITS) as p:
        assert p.protections["cgroup"] is False and p.protections["cgroup_error"]
        assert p.play(SLEEPY, 0, ["\\boxed{0}"])[-1].ok
    with pytest.raises(SandboxUnavailable):
        Pool(workers=1, limits=LIMITS, require=("cgroup",))
    assert sorted(f.name for f in fake.iterdir()) == ["cgroup.controllers", "cgroup.subtree_control"]
