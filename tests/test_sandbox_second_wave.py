"""A second wave of hostile environments: System V IPC, lone surrogates and forged numbers,
cleanup-crashing trees, siblings' limits and priorities, thread floods, memory outside the
address-space limit, and what an episode can learn about the host. Each case must end in the
right typed outcome, leave nothing on the host and keep the pool serving."""

import dataclasses
import os
import sys

import pytest

from spade_jax.sandbox.contract import Limits, Status
from spade_jax.sandbox.pool import Pool, Start

from .sandbox_helpers import GOOD, env, episode_pids, no_leftovers, step_once, still_serves, sysv_objects

LIMITS = dataclasses.replace(Limits(), memory_bytes=256 << 20, load_s=3.0, reset_s=1.0, step_s=2.0,
                             cpu_seconds=20, tmpfs_bytes=8 << 20)


@pytest.fixture(scope="module")
def ipc_before():
    return sysv_objects()


@pytest.fixture(scope="module")
def pool(ipc_before):
    with Pool(workers=2, limits=LIMITS) as p:
        yield p
    assert sysv_objects() <= ipc_before, "System V IPC objects outlived the pool"


@pytest.fixture
def checked(pool):
    pids = pool.worker_pids()
    yield pool
    # Without an episode tmpfs, trees on disk are removed by throw-away processes: wait for them.
    no_leftovers(pool, timeout=3 if pool.protections["episode_tmpfs"] else 60)
    still_serves(pool)
    assert pool.worker_pids() == pids, "a worker died"


# --------------------------------------------------------------------------- System V IPC

SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
"""


def test_sysv_ipc_is_refused(checked, ipc_before):
    body = """
    made = []
    shm = libc.shmget(0, 192 << 20, IPC_CREAT | 0o600)
    if shm >= 0:
        made.append("shm")
        addr = ctypes.c_void_p(libc.shmat(shm, None, 0))
        if addr.value not in (None, ctypes.c_void_p(-1).value):
            ctypes.memset(addr, 1, 8 << 20)
    if libc.msgget(0x5EED, IPC_CREAT | 0o600) >= 0:
        made.append("msg")
    if libc.semget(0x5EEE, 1, IPC_CREAT | 0o600) >= 0:
        made.append("sem")
    mq = libc.mq_open(b"/spade-mq", os.O_CREAT | os.O_RDWR, 0o600, None)
    if mq >= 0:
        made.append("mq")
        libc.mq_unlink(b"/spade-mq")
    result = "made:" + ",".join(made)
    """
    r = step_once(checked, env(body, prelude=SYSV + "import os\n"))
    assert r.ok, r.reason
    assert r.observation == "made:", r.observation
    assert sysv_objects() <= ipc_before


def test_a_semaphore_cannot_count_episodes(checked):
    reset = """
    sem = libc.semget(0x5EEF, 1, IPC_CREAT | 0o666)
    if sem >= 0:
        class Sembuf(ctypes.Structure):
            _fields_ = [("num", ctypes.c_ushort), ("op", ctypes.c_short), ("flg", ctypes.c_short)]
        libc.semop(sem, ctypes.byref(Sembuf(0, 1, 0)), 1)
        self.plays = libc.semctl(sem, 0, 12)  # GETVAL
    else:
        self.plays = -1
    """
    code = env("result = self.plays", reset_body=reset, prelude=SYSV)
    seen = [step_once(checked, code).observation for _ in range(2)]
    assert seen == ["-1", "-1"], seen


# --------------------------------------------------------------------------- strings and numbers


@pytest.mark.parametrize("ret", [
    "('\\ud800 lone', 0.0, False, False, {})",
    "('o', 0.0, False, False, {'k': '\\udc00'})",
    "('o', 0.0, False, False, {'\\udfff': 1})",
    "('o', 0.0, False, False, {'deep': [[{'x': 'ok\\ud83d'}]]})",
])
def test_lone_surrogates_are_invalid_returns(checked, ret):
    r = step_once(checked, env("return " + ret))
    assert r.status is Status.INVALID_RETURN, r
    r.observation.encode("utf-8")


def test_forged_frames_with_bad_strings_or_numbers(checked):
    forge = """
    import sys
    proto = sys.modules["sandbox.protocol"]
    def forged(obj, body={body!r}):
        return proto.HEADER.pack(len(body)) + body
    proto.encode = forged
    """
    bodies = [b'{"ret":["o",0.0,false,false,{"x":1e999}]}',
              b'{"ret":["o",0.0,false,false,{"x":[-1e999]}]}',
              b'{"ret":["\\ud800",0.0,false,false,{}]}',
              b'{"ret":["\xed\xa0\x80",0.0,false,false,{}]}',
              b'{"ret":["\xff",0.0,false,false,{}]}']
    for body in bodies:  # the patched encoder writes the reply after the one that patches it
        replies = checked.play(env(forge.format(body=body)), 0, ["\\boxed{1}"] * 2)
        assert replies[1].ok and replies[2].status in (Status.INVALID_RETURN, Status.PROTOCOL_ERROR), (body, replies)


def test_error_reasons_are_valid_text(checked):
    r = step_once(checked, env("raise ValueError('bad \\ud800 \\x1b]52;c;aGk=\\x07 end')"))
    assert r.status is Status.ENV_ERROR
    r.reason.encode("utf-8")
    assert "end" in r.reason


# --------------------------------------------------------------------------- the worker's cleanup


def test_a_deep_tree_cannot_crash_the_worker(checked):
    body = """
    import os
    depth = 0
    try:  # as deep as the episode's inode cap allows
        while depth < 3000:
            os.mkdir("d")
            os.chdir("d")
            depth += 1
    except OSError:
        pass
    result = depth
    """
    r = step_once(checked, env(body), worker=0, timeout=20)
    assert r.ok and int(r.observation) > 1000, r
    still_serves(checked, worker=0)


def test_close_removes_a_deep_tree_on_disk():
    """Where episode dirs are on disk (no private tmpfs), the host's own cleanup must not crash."""
    p = Pool(workers=1, limits=LIMITS)
    path = os.path.join(p._root, "planted")
    os.makedirs(path)
    fd = os.open(path, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    root = p._root
    p.close()
    assert not os.path.exists(root)


# --------------------------------------------------------------------------- siblings


PROBE_SELF = """
    import os, resource
    result = (resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0),
              sorted(os.sched_getaffinity(0)))
"""

ATTACK = """
    import os, resource, signal
    done = []
    for name, fn in (("prlimit", lambda: resource.prlimit({pid}, resource.RLIMIT_NOFILE, (3, 3))),
                     ("renice", lambda: os.setpriority(os.PRIO_PROCESS, {pid}, 19)),
                     ("affinity", lambda: os.sched_setaffinity({pid}, {{0}})),
                     ("kill", lambda: os.kill({pid}, signal.SIGSTOP)),
                     ("killpg", lambda: os.killpg({pid}, signal.SIGSTOP))):
        try:
            fn()
            done.append(name)
        except OSError:
            pass
    result = "done:" + ",".join(done)
"""


def _victim(pool, worker=None):
    (v,) = list(pool.start_many({0: Start(env(PROBE_SELF, prelude="import os\n")
                                            .replace("'hostile: actions go in \\\\boxed{...}'",
                                                     "f'pid {os.getpid()} \\\\boxed{{}}'"), 0, worker)}))
    assert v.ok, v.reason
    (before,) = list(pool.step_many({v.episode: "x"}))
    return v, before.observation


def test_an_episode_cannot_touch_a_sibling_in_its_worker(checked):
    v, before = _victim(checked, worker=0)
    pid = int(v.observation.split()[1])
    r = step_once(checked, env(ATTACK.format(pid=pid)), worker=0)
    (after,) = list(checked.step_many({v.episode: "x"}))
    checked.end_many([v.episode])
    assert r.ok and r.observation == "done:", r
    assert after.ok and after.observation == before


def test_an_episode_cannot_touch_another_pools_episode(checked):
    with Pool(workers=1, limits=LIMITS) as other:
        v, before = _victim(other)
        (pid,) = episode_pids(other)
        r = step_once(checked, env(ATTACK.format(pid=pid)))
        (after,) = list(other.step_many({v.episode: "x"}))
        other.end_many([v.episode])
    assert r.ok and r.observation == "done:", r
    assert after.ok and after.observation == before


# --------------------------------------------------------------------------- processes and memory


def test_thread_flood_is_capped(checked):
    if not checked.protections.get("tasks", True):
        pytest.skip(f"no per-episode task cap here (probe: {checked.protections})")
    body = """
    import threading
    threading.stack_size(1 << 16)
    stop, n = threading.Event(), 0
    try:
        for _ in range(2000):
            threading.Thread(target=stop.wait, daemon=True).start()
            n += 1
    except RuntimeError:
        pass
    stop.set()
    result = n
    """
    r = step_once(checked, env(body))
    assert r.ok, r.reason
    assert int(r.observation) < LIMITS.max_tasks, r.observation


def test_memfd_is_refused(checked):
    body = """
    import os
    total, fds = 0, []
    try:
        while total < (384 << 20):
            fd = os.memfd_create("x")
            fds.append(fd)
            for _ in range(16):
                os.write(fd, bytes(1 << 20))
                total += 1 << 20
    except OSError:
        pass
    result = total >> 20
    """
    r = step_once(checked, env(body), timeout=20)
    assert r.ok and r.observation == "0", r


def test_tmpfs_files_are_capped_per_episode(checked):
    if not checked.protections.get("episode_tmpfs", True):
        pytest.skip(f"no per-episode tmpfs here (probe: {checked.protections})")
    fill = """
    import os
    n = 0
    try:
        while n < 30000:
            open(f"f{n}", "w").close()
            n += 1
    except OSError:
        pass
    try:
        with open("big", "wb") as f:
            for _ in range(64):
                f.write(bytes(1 << 20))
                f.flush()
    except OSError:
        pass
    result = n
    """
    (filler,) = list(checked.start_many({0: Start(env(fill), 0, worker=0)}))
    (r,) = list(checked.step_many({filler.episode: "x"}, timeout=20))
    assert r.ok and int(r.observation) <= LIMITS.tmpfs_inodes, r
    # A sibling on the same worker still has its own space while the filler lives.
    write = "with open('mine', 'wb') as f:\n    f.write(bytes(1 << 20))\nresult = 'wrote'"
    s = step_once(checked, env(write), worker=0)
    checked.end_many([filler.episode])
    assert s.ok and s.observation == "wrote", s


# --------------------------------------------------------------------------- the host's view


def test_host_pids_files_and_inotify_are_out_of_reach(checked, tmp_path):
    if not checked.protections.get("host_view", True):
        pytest.skip(f"the host's files are visible by name here (probe: {checked.protections})")
    (tmp_path / "marker").write_text("x")
    body = f"""
    import ctypes, os
    seen = []
    for path in ("/proc/{os.getpid()}", {str(tmp_path / 'marker')!r}, "/etc/passwd", "/work", "/usr/bin/env"):
        if os.path.lexists(path):
            seen.append(path)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    if fd >= 0 and libc.inotify_add_watch(fd, b"/tmp", 0xfff) >= 0:
        seen.append("inotify")
    result = "seen:" + ",".join(seen)
    """
    r = step_once(checked, env(body))
    assert r.ok and r.observation == "seen:", r


def test_inotify_is_refused(checked, tmp_path):
    body = f"""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    ok = fd >= 0 and libc.inotify_add_watch(fd, b"/tmp", 0xfff) >= 0
    result = "watching" if ok else "refused"
    """
    r = step_once(checked, env(body))
    assert r.ok and r.observation == "refused", r


def test_still_serves_after_everything(checked):
    replies = checked.play(GOOD, 0, ["\\boxed{a}"] * 3)
    assert replies[-1].terminated


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_an_innocent_program_beside_hostile_ones_is_admitted(ipc_before):
    from spade_jax.sandbox import starters
    from spade_jax.sandbox.validate import validate_many

    hostile = [env("import os\nfor _ in range(2000):\n    os.mkdir('d'); os.chdir('d')"),
               env("import threading\nthreading.stack_size(1 << 16)\n"
                   "[threading.Thread(target=lambda: __import__('time').sleep(9)).start() for _ in range(500)]"),
               env("libc.semget(0x5EF0, 1, IPC_CREAT | 0o666)", prelude=SYSV),
               env("return '\\ud800', 0.0, False, False, {}"),
               env("import os\nos.write(os.memfd_create('x'), bytes(64 << 20))"),
               env("import ctypes\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\nimport time\ntime.sleep(60)")]
    with Pool(workers=2, limits=LIMITS) as p:
        pids = p.worker_pids()
        verdicts = validate_many(p, hostile + [starters.code("remainder_oracle.py")])
        assert verdicts[-1].admitted, verdicts[-1]
        assert p.worker_pids() == pids
        # Without an episode tmpfs, trees on disk are removed by throw-away processes: wait.
        no_leftovers(p, timeout=3 if p.protections["episode_tmpfs"] else 60)
        still_serves(p)
    assert sysv_objects() <= ipc_before


def test_file_locks_cannot_signal_between_episodes(checked):
    """Every episode sees the same read-only standard library: a lock held on one of its files
    would tell other episodes that this one is running."""
    body = """
    import fcntl, os
    done = []
    fd = os.open(os.__file__, os.O_RDONLY)
    for name, fn in (("flock", lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                     ("lockf", lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                     ("lease", lambda: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK))):
        try:
            fn()
            done.append(name)
        except OSError:
            pass
    result = "done:" + ",".join(done)
    """
    r = step_once(checked, env(body))
    assert r.ok and r.observation == "done:", r
