"""The seccomp filter of episode children: which system calls are refused, and for which targets.

Refused outright (EPERM): sockets, fork and exec, ptrace and cross-process memory access, mounts
and namespaces, kernel modules, io_uring, System V IPC and POSIX message queues (state that
would outlive the episode and be shared between episodes), memfd (memory outside the
address-space limit), inotify and fanotify (watching the host's files), capability and identity
changes, file locks and leases. Refused for any process but the caller: signals (kill, tgkill, sigqueue), rlimits
(prlimit64), priorities and scheduling (setpriority, sched_set*, ioprio_set) and the matching
queries, which would otherwise tell which pids exist. clone3 answers ENOSYS so that glibc falls
back to clone(), whose flags the filter can read: threads pass, processes do not.

libseccomp compiles the filter once per worker (milliseconds); each child patches its own pid
into the compiled program and loads the raw BPF (microseconds).
"""

from __future__ import annotations

import ctypes
import errno
import struct
import tempfile

try:  # pyseccomp raises at import when libseccomp.so.2 is absent: report, do not crash
    import pyseccomp as _seccomp
except Exception as e:  # noqa: BLE001
    _seccomp, SECCOMP_IMPORT_ERROR = None, f"{type(e).__name__}: {e}"
else:
    SECCOMP_IMPORT_ERROR = ""

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_THREAD = 0x10000

# Denied with EPERM. Names libseccomp does not know on this system are skipped.
DENY = """
socket socketpair connect bind listen accept accept4 sendmmsg recvmmsg
fork vfork execve execveat ptrace process_vm_readv process_vm_writev kcmp process_mrelease
pidfd_open pidfd_getfd pidfd_send_signal tkill
mount umount2 pivot_root chroot move_mount open_tree fsopen fsmount fsconfig fspick mount_setattr
unshare setns init_module finit_module delete_module kexec_load kexec_file_load reboot
swapon swapoff syslog acct quotactl settimeofday clock_settime clock_adjtime adjtimex
sethostname setdomainname iopl ioperm name_to_handle_at open_by_handle_at vhangup mknod mknodat
setuid setgid setreuid setregid setresuid setresgid setgroups setfsuid setfsgid capset capget personality
bpf perf_event_open userfaultfd keyctl add_key request_key io_uring_setup io_uring_enter
io_uring_register mbind migrate_pages move_pages set_mempolicy process_madvise fanotify_init
lookup_dcookie uselib setpgid membarrier
shmget shmat shmdt shmctl msgget msgsnd msgrcv msgctl semget semop semtimedop semctl ipc
mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr
memfd_create memfd_secret inotify_init inotify_init1 inotify_add_watch inotify_rm_watch flock
""".split()
# fcntl commands refused: file locks and leases (on the read-only standard library, which every
# episode sees, they would be a channel between episodes) and directory notification.
FCNTL_DENY = {"F_GETLK": 5, "F_SETLK": 6, "F_SETLKW": 7, "F_OFD_GETLK": 36, "F_OFD_SETLK": 37,
              "F_OFD_SETLKW": 38, "F_SETLEASE": 1024, "F_NOTIFY": 1026}

# The argument that names the target process, which must be 0 ("myself").
SELF_ONLY = {"prlimit64": 0, "sched_setaffinity": 0, "sched_getaffinity": 0, "sched_setscheduler": 0,
             "sched_getscheduler": 0, "sched_setparam": 0, "sched_getparam": 0, "sched_setattr": 0,
             "sched_getattr": 0, "sched_rr_get_interval": 0, "getpgid": 0, "getsid": 0,
             "get_robust_list": 0}
# setpriority/getpriority(which, who) and ioprio_set/ioprio_get(which, who): `which` must be the
# single-process kind (PRIO_PROCESS = 0, IOPRIO_WHO_PROCESS = 1) and `who` 0.
WHICH_WHO = {"setpriority": 0, "getpriority": 0, "ioprio_set": 1, "ioprio_get": 1}
# Clock ids above INT_MAX (as a signed int: negative) name another process's or thread's CPU clock.
CLOCKS = ("clock_gettime", "clock_getres", "clock_nanosleep", "timer_create")
SIGNALS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")

PID_SENTINEL = 0x5EC0FFEE  # stands for "this child's pid" in the compiled program


def program() -> bytes:
    """The compiled filter, with PID_SENTINEL where the child's own pid goes."""
    if _seccomp is None:
        raise OSError(errno.ENOSYS, f"seccomp unavailable: {SECCOMP_IMPORT_ERROR}")
    s = _seccomp
    f = s.SyscallFilter(s.ALLOW)
    try:  # a binary tree of syscall numbers: the allowed read/write path stays short
        f.set_attr(s.Attr.CTL_OPTIMIZE, 2)
    except (OSError, RuntimeError, ValueError, AttributeError):
        pass
    eperm = s.ERRNO(errno.EPERM)

    def rule(action, name, *args) -> None:
        try:
            f.add_rule(action, name, *args)
        except (OSError, RuntimeError, ValueError):
            pass  # not a syscall on this architecture or libseccomp version

    for name in DENY:
        rule(eperm, name)
    rule(s.ERRNO(errno.ENOSYS), "clone3")  # glibc then uses clone(), which we can inspect
    rule(eperm, "clone", s.Arg(0, s.MASKED_EQ, CLONE_THREAD, 0))  # a process, not a thread
    for name in SIGNALS:
        rule(eperm, name, s.Arg(0, s.NE, PID_SENTINEL))  # signals only to ourselves
    for name, arg in SELF_ONLY.items():
        rule(eperm, name, s.Arg(arg, s.NE, 0))
    for name, which in WHICH_WHO.items():
        rule(eperm, name, s.Arg(0, s.NE, which))
        rule(eperm, name, s.Arg(1, s.NE, 0))
    for name in CLOCKS:
        rule(eperm, name, s.Arg(0, s.GT, 0x7FFFFFFF))
    for cmd in FCNTL_DENY.values():
        rule(eperm, "fcntl", s.Arg(1, s.EQ, cmd))
    with tempfile.TemporaryFile() as tf:
        f.export_bpf(tf)
        tf.seek(0)
        prog = tf.read()
    if not prog or len(prog) % 8 or PID_SENTINEL not in ks(prog):
        raise OSError(errno.EINVAL, "unexpected seccomp program from libseccomp")
    return prog


def ks(prog: bytes) -> list[int]:
    """The constant operand of every BPF instruction."""
    return [k for (_, _, _, k) in struct.iter_unpack("=HBBI", prog)]


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load(prog: bytes, own_pid: int) -> None:
    buf = ctypes.create_string_buffer(prog, len(prog))
    for i, k in enumerate(ks(prog)):
        if k == PID_SENTINEL:
            struct.pack_into("=I", buf, 8 * i + 4, own_pid)
    fprog = _Fprog(len(prog) // 8, ctypes.addressof(buf))
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {errno.errorcode.get(err, err)}")
