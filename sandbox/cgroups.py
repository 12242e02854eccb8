"""cgroup v2 accounting per episode, where a delegated cgroup v2 directory is available.

RLIMIT_AS bounds an episode's address space, not the memory the kernel spends for it (page
cache, tmpfs and shmem pages, slab, page tables, pipe buffers). A cgroup counts all of them. The
pool uses one only when told where: `SPADE_SANDBOX_CGROUP` names a cgroup v2 directory delegated
to this user, with the memory and pids controllers available and no processes of its own (e.g.
a systemd unit or scope with Delegate=yes). The pool makes a child cgroup there with both
controllers enabled for its leaves; each episode joins a leaf of its own with memory.max
(address space + tmpfs + 64 MiB of kernel slack), memory.swap.max = 0 and pids.max = max_tasks,
before it drops its privileges. Nothing is assumed: the probe reports whether an episode really
sat in its leaf, and why not (`cgroup_error`).
"""

from __future__ import annotations

import os
import tempfile

ENV = "SPADE_SANDBOX_CGROUP"
SLACK = 64 << 20
_NEEDED = {"memory", "pids"}


def _read(path: str, dir_fd: int | None = None) -> str:
    fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def _write(path: str, text: str, dir_fd: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def pool_dir() -> tuple[str | None, str]:
    """(the pool's cgroup, "") or (None, why there is none). Host side, at pool start."""
    base = os.environ.get(ENV, "")
    if not base:
        return None, f"not configured: set {ENV} to a delegated cgroup v2 directory with memory and pids"
    try:
        have = set(_read(os.path.join(base, "cgroup.controllers")).split())
    except OSError as e:
        return None, f"{base}: not a cgroup v2 directory ({e.strerror})"
    if not _NEEDED <= have:
        return None, f"{base}: controllers {sorted(have)}, needs memory and pids"
    try:
        d = tempfile.mkdtemp(prefix=f"sandbox-{os.getpid()}-", dir=base)
    except OSError as e:
        return None, f"{base}: cannot create a cgroup ({e.strerror})"
    try:
        _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")  # may be on already
    except OSError:
        pass
    try:
        _write(os.path.join(d, "cgroup.subtree_control"), "+memory +pids")
    except OSError as e:
        remove(d)
        return None, f"{d}: cannot enable memory and pids for episodes ({e.strerror})"
    return d, ""


def remove(d: str) -> None:
    """Remove the pool's cgroup and any leaf left in it (all empty once the workers are gone)."""
    try:
        for name in os.listdir(d):
            if os.path.isdir(os.path.join(d, name)):
                try:
                    os.rmdir(os.path.join(d, name))
                except OSError:
                    pass
        os.rmdir(d)
    except OSError:
        pass


def make_leaf(fd: int, name: str, limits) -> bool:
    """The episode's leaf with its caps (zygote side, before the fork)."""
    try:
        os.mkdir(name, dir_fd=fd)
        _write(f"{name}/memory.max", str(limits.memory_bytes + limits.tmpfs_bytes + SLACK), fd)
        _write(f"{name}/pids.max", str(limits.max_tasks), fd)
        try:
            _write(f"{name}/memory.swap.max", "0", fd)
        except OSError:
            pass  # no swap accounting on this kernel
        return True
    except OSError:
        remove_leaf(fd, name)
        return False


def join(fd: int, name: str) -> bool:
    """Move the calling process into its leaf; True only if the kernel lists it there."""
    try:
        _write(f"{name}/cgroup.procs", "0", fd)
        return str(os.getpid()) in _read(f"{name}/cgroup.procs", fd).split()
    except OSError:
        return False


def oom_killed(fd: int, name: str) -> bool:
    try:
        for line in _read(f"{name}/memory.events", fd).splitlines():
            key, _, n = line.partition(" ")
            if key == "oom_kill":
                return int(n) > 0
    except (OSError, ValueError):
        pass
    return False


def remove_leaf(fd: int, name: str) -> None:
    try:
        os.rmdir(name, dir_fd=fd)
    except OSError:
        pass
