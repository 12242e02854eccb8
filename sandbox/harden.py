"""Kernel-level isolation for episode children, and for the worker processes that fork them.

Two layers. A worker ("zygote") sets up what is shared by all its children once, at start:
a network namespace with nothing in it, and a private mount namespace with a size-capped tmpfs
for episode temp dirs (as root directly; otherwise inside a user namespace, where the kernel
allows one). Each child then hardens itself, in `harden_child`, before any untrusted code runs:
new session, inherited descriptors closed, rlimits with hard = soft, a private temp dir, no root
and no capabilities, not dumpable, no_new_privs, parent-death signal, Landlock (reads limited to
the standard library, writes to the temp dir, no TCP, no signals out of the domain) and a seccomp
filter (no sockets, fork, exec, ptrace, mounts, namespaces, kernel modules, io_uring, or signals
to other processes; clone3 answers ENOSYS so that glibc falls back to clone() for threads).

Everything here is best effort per mechanism and reported as facts; `worker.probe` checks what
is really in force, and the pool's `require` setting turns a missing protection into an error.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import struct
import sysconfig
import tempfile

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

try:  # pyseccomp raises at import when libseccomp.so.2 is absent: report, do not crash
    import pyseccomp as _seccomp
except Exception as e:  # noqa: BLE001
    _seccomp, SECCOMP_IMPORT_ERROR = None, f"{type(e).__name__}: {e}"
else:
    SECCOMP_IMPORT_ERROR = ""

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_THREAD = 0x20000, 0x10000000, 0x40000000, 0x10000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
NOBODY = 65534
SYS_LL_CREATE, SYS_LL_ADD, SYS_LL_RESTRICT = 444, 445, 446  # the same on every architecture


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def prctl(option: int, arg: int = 0) -> int:
    return _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


# ----------------------------------------------------------------------------- worker level


def setup_worker(tmp_root: str, tmpfs_bytes: int) -> dict:
    """Namespaces shared by all children of one worker. Returns facts (what succeeded)."""
    facts = {"netns": False, "mountns": False, "userns": False, "tmpfs": False}
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | CLONE_NEWNS
    if uid != 0:
        flags |= CLONE_NEWUSER  # unprivileged: the user namespace is what lets us make the others
    if _libc.unshare(flags) == 0:
        facts.update(netns=True, mountns=True, userns=uid != 0)
        if uid != 0:
            # Identity map: files keep their owners, and the host can still signal the worker.
            for path, data in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                               ("/proc/self/gid_map", f"{gid} {gid} 1")):
                with open(path, "w") as f:
                    f.write(data)
    elif _libc.unshare(CLONE_NEWNET) == 0:
        facts["netns"] = True
    if facts["mountns"]:
        # Private propagation first, or the tmpfs would show up in the host's namespace.
        if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0:
            opts = f"size={tmpfs_bytes},mode=0711".encode()
            facts["tmpfs"] = _libc.mount(b"tmpfs", tmp_root.encode(), b"tmpfs",
                                         MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) == 0
    facts["landlock_abi"] = max(0, _libc.syscall(SYS_LL_CREATE, None, 0, 1))
    facts["read_dirs"] = stdlib_dirs()  # computed here: sysconfig imports lazily, children cannot
    facts["seccomp_lib"] = _seccomp is not None
    facts["seccomp_error"] = SECCOMP_IMPORT_ERROR
    return facts


# ----------------------------------------------------------------------------- child level


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


def drop_privileges() -> None:
    """No root, no capabilities. As root we become nobody; in a user namespace, drop the caps."""
    if os.getuid() == 0:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)  # leaving uid 0 clears every capability
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
    paths = sysconfig.get_paths()
    dirs = {paths["stdlib"], paths["platstdlib"], os.path.join(paths["platstdlib"], "lib-dynload")}
    return sorted(d for d in dirs if os.path.isdir(d))


# Denied with EPERM. Names libseccomp does not know on this system are skipped.
_DENY = """
socket socketpair connect bind listen accept accept4 sendmmsg recvmmsg
fork vfork execve execveat ptrace process_vm_readv process_vm_writev kcmp
pidfd_open pidfd_getfd pidfd_send_signal tkill
mount umount2 pivot_root chroot move_mount open_tree fsopen fsmount fsconfig fspick mount_setattr
unshare setns init_module finit_module delete_module kexec_load kexec_file_load reboot
swapon swapoff syslog acct quotactl settimeofday clock_settime clock_adjtime adjtimex
sethostname setdomainname iopl ioperm name_to_handle_at open_by_handle_at vhangup mknod mknodat
setuid setgid setreuid setregid setresuid setresgid setgroups setfsuid setfsgid capset personality
bpf perf_event_open userfaultfd keyctl add_key request_key io_uring_setup io_uring_enter
io_uring_register mbind migrate_pages move_pages set_mempolicy process_madvise fanotify_init
lookup_dcookie uselib
""".split()


_PID_SENTINEL = 0x5EC0FFEE  # stands for "this child's pid" in the compiled program


def seccomp_program() -> bytes:
    """Compile the filter once per worker (libseccomp takes milliseconds to do it); each child
    patches in its own pid and loads the raw BPF, which takes microseconds."""
    if _seccomp is None:
        raise OSError(errno.ENOSYS, f"seccomp unavailable: {SECCOMP_IMPORT_ERROR}")
    s = _seccomp
    f = s.SyscallFilter(s.ALLOW)
    eperm = s.ERRNO(errno.EPERM)
    for name in _DENY:
        try:
            f.add_rule(eperm, name)
        except (OSError, RuntimeError, ValueError):
            pass  # not a syscall on this architecture or libseccomp version
    f.add_rule(s.ERRNO(errno.ENOSYS), "clone3")  # glibc then uses clone(), which we can inspect
    f.add_rule(eperm, "clone", s.Arg(0, s.MASKED_EQ, CLONE_THREAD, 0))  # a process, not a thread
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        f.add_rule(eperm, name, s.Arg(0, s.NE, _PID_SENTINEL))  # signals only to ourselves
    with tempfile.TemporaryFile() as tf:
        f.export_bpf(tf)
        tf.seek(0)
        prog = tf.read()
    if not prog or len(prog) % 8 or _PID_SENTINEL not in _ks(prog):
        raise OSError(errno.EINVAL, "unexpected seccomp program from libseccomp")
    return prog


def _ks(prog: bytes) -> list[int]:
    return [k for (_, _, _, k) in struct.iter_unpack("=HBBI", prog)]


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(prog: bytes, own_pid: int) -> None:
    buf = ctypes.create_string_buffer(prog, len(prog))
    for i, k in enumerate(_ks(prog)):
        if k == _PID_SENTINEL:
            struct.pack_into("=I", buf, 8 * i + 4, own_pid)
    fprog = _Fprog(len(prog) // 8, ctypes.addressof(buf))
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def harden_child(*, parent: int, keep_fds: tuple[int, ...], tmp_dir: str, limits, facts: dict,
                 seccomp_prog: bytes | None) -> None:
    """Everything a freshly forked episode child does before it may read untrusted code."""
    os.setsid()
    close_fds(keep_fds)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.mkdir(tmp_dir, 0o700)
    if os.getuid() == 0:
        os.chown(tmp_dir, NOBODY, NOBODY)
    os.chdir(tmp_dir)
    os.environ["TMPDIR"] = os.environ["HOME"] = tmp_dir
    set_rlimits(limits.memory_bytes, limits.cpu_seconds, limits.file_bytes, limits.open_files)
    drop_privileges()
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
            load_seccomp(seccomp_prog, os.getpid())
        except OSError:
            pass
