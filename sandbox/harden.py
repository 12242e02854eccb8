"""What each episode child does to itself before any untrusted code runs (`harden_child`).

In order: a new session; inherited descriptors closed; its own temp dir, a tmpfs of its own
where the worker has a mount namespace (size- and inode-capped: file pages and inodes are memory
the address-space limit does not see); rlimits with hard = soft; its own identity, then no
capabilities; not dumpable; no_new_privs; parent-death signal; Landlock (reads limited to the
standard library, writes to the temp dir, no TCP, no signals out of the domain); the seccomp
filter (seccomp.py).

The identity: as real root, each episode runs under a uid of its own, UID_BASE + its host pid
(unique while the episode lives, since its pid is held until the host ends the episode). The
kernel then refuses on its own to let one episode signal, renice, re-limit or re-pin another,
whatever pool it belongs to, and RLIMIT_NPROC, which counts per uid, caps the episode's threads
and processes. Without root every child runs as the one unprivileged user, and only seccomp
keeps episodes apart. Everything here is best effort per mechanism and reported as facts; the
probe checks what is really in force, and the pool's `require` setting judges it.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import struct
import sysconfig

from . import cgroups, namespaces, seccomp

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
NOBODY = 65534
# Episode uids: UID_BASE + pid, pids below PID_SPAN (the kernel's largest pid_max). The range
# 0x70000000.. is one systemd documents as unused (below it: container ranges; above 2^31: trouble).
UID_BASE, PID_SPAN = 0x70000000, 1 << 22
SYS_LL_CREATE, SYS_LL_ADD, SYS_LL_RESTRICT = 444, 445, 446  # the same on every architecture


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def prctl(option: int, arg: int = 0) -> int:
    return _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def close_fds(keep: tuple[int, ...]) -> None:
    keep = sorted(set(keep))
    lo = 3
    for fd in keep:
        if fd >= lo:
            os.closerange(lo, fd)
            lo = fd + 1
    os.closerange(lo, 1 << 16)


def set_rlimits(memory_bytes: int, cpu_seconds: int, file_bytes: int, open_files: int) -> None:
    # hard = soft: the child cannot raise them back. RLIMIT_CPU with soft == hard is a SIGKILL.
    for res, n in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_seconds),
                   (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, open_files),
                   (resource.RLIMIT_CORE, 0), (resource.RLIMIT_MEMLOCK, 0)):
        hard = resource.getrlimit(res)[1]
        n = n if hard == resource.RLIM_INFINITY else min(n, hard)  # a limit can only go down
        resource.setrlimit(res, (n, n))


def set_task_limit(n: int) -> None:
    """RLIMIT_NPROC: tasks (processes and threads) of this uid; only meaningful under a uid that
    belongs to this episode alone."""
    resource.setrlimit(resource.RLIMIT_NPROC, (n, n))


def episode_uid(hostproc: int | None) -> int:
    """UID_BASE + this process's pid as the host's /proc names it (the worker may have its own
    pid namespace, where os.getpid() is small and shared with other workers' episodes)."""
    pid = int(os.readlink("self", dir_fd=hostproc)) if hostproc is not None else os.getpid()
    if not 0 < pid < PID_SPAN:
        raise OSError(f"pid {pid} outside the episode uid range")
    return UID_BASE + pid


def drop_privileges(uid: int) -> None:
    """No root, no capabilities. As root we become `uid`; in a user namespace, drop the caps."""
    if os.getuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # leaving uid 0 clears every capability
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two zeroed {effective, permitted, inheritable} words
    _check(_libc.capset(header, data), "capset")


def set_parent_death_signal(parent: int) -> None:
    # Must come after the uid change (which clears it); then close the race with an early death.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


# Landlock access rights (uapi/linux/landlock.h), by the ABI version that introduced them.
_LL_FS = [(1, (1 << 13) - 1), (2, 1 << 13), (3, 1 << 14), (5, 1 << 15)]
_LL_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read_file, read_dir
_LL_FILE_RW = (1 << 1) | (1 << 2)  # write_file, read_file
_LL_TRUNCATE = 1 << 14


def landlock(read_dirs: list[str], rw_dir: str, abi: int) -> None:
    """Allow reading the stdlib, writing the temp dir, nothing else; no TCP; signals stay inside."""
    fs = 0
    for v, bits in _LL_FS:
        if abi >= v:
            fs |= bits
    net = 3 if abi >= 4 else 0  # bind_tcp | connect_tcp
    scoped = 3 if abi >= 6 else 0  # abstract unix sockets | signals
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    attr = struct.pack("QQQ", fs, net, scoped)[:size]
    ruleset = _check(_libc.syscall(SYS_LL_CREATE, attr, size, 0), "landlock_create_ruleset")
    try:
        rules = [(d, _LL_READ) for d in read_dirs] + [(rw_dir, fs)]
        rules += [(p, _LL_FILE_RW | (_LL_TRUNCATE if abi >= 3 else 0)) for p in ("/dev/null", "/dev/zero")]
        rules += [("/dev/urandom", 1 << 2)]
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = struct.pack("=Qi", access, fd)  # the uapi struct is packed
                _check(_libc.syscall(SYS_LL_ADD, ruleset, 1, rule, 0), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        _check(_libc.syscall(SYS_LL_RESTRICT, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def stdlib_dirs() -> list[str]:
    """The standard library and its extension modules. Not sysconfig's platstdlib: in a venv
    that is the venv's lib directory, site-packages included."""
    dirs = {os.path.dirname(os.__file__), sysconfig.get_config_var("DESTSHARED") or ""}
    return sorted(d for d in dirs if d and os.path.isdir(d))


def make_tmp_dir(tmp_dir: str, uid: int, limits, facts: dict) -> None:
    os.mkdir(tmp_dir, 0o700)
    if facts.get("tmpfs") and namespaces.mount_episode_tmpfs(tmp_dir, limits.tmpfs_bytes,
                                                              limits.tmpfs_inodes, uid):
        return
    if os.getuid() == 0:
        os.chown(tmp_dir, uid, uid)


def harden_child(*, parent: int, keep_fds: tuple[int, ...], tmp_dir: str, limits, facts: dict,
                 seccomp_prog: bytes | None, hostproc: int | None,
                 cgroup: tuple[int, str] | None = None) -> dict:
    """Everything a freshly forked episode child does before it may read untrusted code.
    Returns what only the child can tell (whether it sits in its cgroup)."""
    os.setsid()
    uid = episode_uid(hostproc) if facts.get("own_uid") else NOBODY  # before the fds go
    notes = {"cgroup": bool(cgroup) and cgroups.join(*cgroup)}  # while still privileged
    close_fds(keep_fds)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    make_tmp_dir(tmp_dir, uid, limits, facts)
    os.chdir(tmp_dir)
    os.environ["TMPDIR"] = os.environ["HOME"] = tmp_dir
    set_rlimits(limits.memory_bytes, limits.cpu_seconds, limits.file_bytes, limits.open_files)
    drop_privileges(uid)
    if uid != NOBODY:
        set_task_limit(limits.max_tasks)
    set_parent_death_signal(parent)
    prctl(PR_SET_DUMPABLE, 0)  # /proc/<pid>/mem and ptrace closed to siblings of the same uid
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    # Optional mechanisms are best effort here: the start-up probe runs this same code and
    # reports what actually took effect, and the pool's `require` setting judges that.
    if facts.get("landlock_abi", 0) > 0:
        try:
            landlock(facts["read_dirs"], tmp_dir, facts["landlock_abi"])
        except OSError:
            pass
    if seccomp_prog:
        try:
            seccomp.load(seccomp_prog, os.getpid())
        except OSError:
            pass
    return notes
