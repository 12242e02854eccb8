"""The start-up probe: what a hardened child could actually not do, and what the pool reports.

`checks` runs in a hardened episode child of worker 0 when the pool starts, with the same code
path as every episode, and tries each forbidden thing for real. `report` (host side) turns its
answers and the worker's facts into `Pool.protections`: one boolean per protection (the names
in PROTECTIONS, which `require=` may demand), plus a few details (Landlock ABI, why seccomp or
cgroups are unavailable).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import select
import signal
import socket
import sys
import threading
import time

from . import harden

# Every protection the probe reports, in the order the README lists them.
PROTECTIONS = ("rlimits", "seccomp", "landlock", "unprivileged", "no_new_privs", "pdeathsig",
               "netns", "userns", "tmpfs", "sysv_ipc", "memfd", "other_pids", "inotify", "own_uid",
               "tasks", "episode_tmpfs", "ipcns", "pidns", "host_view", "cgroup")
# What every pool requires unless told otherwise: these hold wherever seccomp and rlimits do.
DEFAULT_REQUIRE = ("rlimits", "seccomp", "unprivileged", "no_new_privs", "pdeathsig", "sysv_ipc",
                   "memfd", "other_pids", "inotify")
_CHILD = ("rlimits", "seccomp", "landlock", "unprivileged", "no_new_privs", "pdeathsig", "sysv_ipc",
          "memfd", "other_pids", "inotify", "own_uid", "tasks", "episode_tmpfs", "cgroup")
_libc = ctypes.CDLL(None, use_errno=True)


def _denied(fn) -> bool:
    try:
        fn()
    except OSError:
        return True
    return False


def _refused(fn) -> bool:
    """Refused as not permitted (not merely: no such process)."""
    try:
        fn()
    except OSError as e:
        return e.errno == errno.EPERM
    return False


def _fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _threads_work() -> bool:
    box = []
    t = threading.Thread(target=lambda: box.append(1))
    t.start()
    t.join()
    return box == [1]


def _sysv_refused() -> bool:
    made = [_libc.shmget(0, 4096, 0o1600), _libc.msgget(0, 0o1600), _libc.semget(0, 1, 0o1600)]
    return all(m < 0 for m in made)


def checks(tmp_dir: str, limits, facts: dict) -> dict:
    """Run in a hardened child: True where the forbidden thing failed (or the limit is set)."""

    def outside_write():
        with open(os.path.join(os.path.dirname(tmp_dir), "escape"), "w") as f:
            f.write("x")

    own_uid = os.getuid() >= harden.UID_BASE
    try:
        st = os.statvfs(".")
        own_tmpfs = st.f_files == limits.tmpfs_inodes and st.f_blocks * st.f_frsize <= limits.tmpfs_bytes
    except OSError:
        own_tmpfs = False
    other = 1  # pid 1: the worker in its own pid namespace, init otherwise; never this child
    return {
        "rlimits": resource.getrlimit(resource.RLIMIT_AS) == (limits.memory_bytes, limits.memory_bytes),
        "seccomp": _denied(lambda: socket.socket().close()) and _denied(_fork)
        and _denied(lambda: os.kill(os.getppid(), 0)),
        # A world-readable file outside the allowed directories: only Landlock refuses it.
        "landlock": _denied(outside_write) and bool(facts.get("landlock_probe"))
        and _denied(lambda: open(facts["landlock_probe"], "rb").close()),
        "unprivileged": os.geteuid() != 0,
        "no_new_privs": _libc.prctl(39, 0, 0, 0, 0) == 1,
        "pdeathsig": _pdeathsig() == signal.SIGKILL,
        "threads": _threads_work(),
        "fs_write_in_tmp": not _denied(lambda: open("probe.txt", "w").close()),
        "sysv_ipc": _sysv_refused(),
        "memfd": _denied(lambda: os.close(os.memfd_create("probe"))),
        "other_pids": all(_refused(fn) for fn in (
            lambda: resource.prlimit(other, resource.RLIMIT_NOFILE),
            lambda: os.setpriority(os.PRIO_PROCESS, other, 0),
            lambda: os.sched_setaffinity(other, os.sched_getaffinity(0)))),
        "inotify": _libc.inotify_init1(0) < 0,
        "own_uid": own_uid,
        "tasks": own_uid and resource.getrlimit(resource.RLIMIT_NPROC) == (limits.max_tasks,) * 2,
        "episode_tmpfs": own_tmpfs,
        "host_view": not any(os.path.lexists(p) for p in (sys.executable, "/proc/self", "/etc")),
    }


def _pdeathsig() -> int:
    out = ctypes.c_int(0)
    _libc.prctl(2, ctypes.byref(out), 0, 0, 0)
    return out.value


def answer(rfd: int, reader, timeout: float = 30.0) -> dict:
    """The probe child's checks, read from its reply pipe (host side)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([rfd], [], [], left)[0]:
            raise RuntimeError("sandbox probe did not answer")
        frames, eof = reader.feed()
        if frames or eof:
            break
    checks = frames[0].get("probe") if frames and isinstance(frames[0], dict) else None
    if not isinstance(checks, dict):
        reason = frames[0].get("reason") if frames and isinstance(frames[0], dict) else "probe child died"
        raise RuntimeError(f"sandbox probe failed: {reason}")
    return checks


def report(child: dict, facts: dict, cgroup_error: str = "") -> dict:
    """Pool.protections from the probe child's answers and worker 0's facts."""
    out = {k: bool(child.get(k)) for k in _CHILD}
    out.update({k: bool(facts.get(k)) for k in ("netns", "userns", "tmpfs", "ipcns", "pidns")})
    out["landlock"] = out["landlock"] and facts.get("landlock_abi", 0) > 0
    out["host_view"] = bool(facts.get("host_view")) and bool(child.get("host_view"))
    out["threads"] = bool(child.get("threads"))
    out["landlock_abi"] = facts.get("landlock_abi", 0)
    if facts.get("seccomp_error"):
        out["seccomp_error"] = facts["seccomp_error"]
    if not out["cgroup"]:
        out["cgroup_error"] = cgroup_error or "the probe episode was not in its cgroup"
    return out
