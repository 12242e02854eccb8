"""The worker ("zygote") process, which forks one hardened child per episode.

A worker is started by the pool with `subprocess` and a clean environment. It imports what
environments usually need once, leaves the host's namespaces (namespaces.py), then waits on a
SOCK_SEQPACKET control socket. With a pid namespace, the process the pool started only
supervises: it forks the zygote, pid 1 of the new namespace, and waits for it; when either dies,
the kernel kills every episode of the worker. For each episode the host sends two pipe ends
(SCM_RIGHTS); the zygote forks a child that hardens itself (harden.py) and then talks to the
host directly over those pipes (episode.py), so a step costs one round trip between host and
child. The zygote only forks, kills and reaps: it never runs untrusted code, and a child stays
a zombie until the host ends the episode, so its pid (and its uid) cannot be reused while the
host still cares about it.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import signal
import socket
import sys

from . import cgroups, cleanup, episode, harden, namespaces, probe, protocol, seccomp
from .contract import Limits

# Imported once here so that children share them (copy-on-write) and need no file access for
# them: a child may have no read access to the standard library at all.
PRELOAD = """abc array base64 binascii bisect calendar cmath collections collections.abc colorsys
contextlib copy dataclasses datetime decimal difflib enum fnmatch fractions functools graphlib hashlib
heapq io itertools json keyword math numbers operator pprint queue random re secrets shlex statistics
string struct textwrap threading time types typing unicodedata uuid weakref zlib""".split()

REQ_FD, REP_FD = episode.REQ_FD, episode.REP_FD


def _child_main(parent: int, tmp_dir: str, limits: Limits, facts: dict, prog: bytes | None,
                probe_only: bool, hostproc: int | None, cgroup: tuple[int, str] | None) -> None:
    try:
        notes = harden.harden_child(parent=parent, keep_fds=(REQ_FD, REP_FD), tmp_dir=tmp_dir,
                                    limits=limits, facts=facts, seccomp_prog=prog, hostproc=hostproc,
                                    cgroup=cgroup)
        if probe_only:
            checks = {**probe.checks(tmp_dir, limits, facts), **notes}
            protocol.write_all(REP_FD, protocol.encode({"probe": checks}))
            os._exit(0)
    except BaseException as e:  # noqa: BLE001
        try:
            protocol.write_all(REP_FD, protocol.encode(
                {"err": "PROTOCOL_ERROR", "reason": f"hardening failed: {type(e).__name__}: {e}"}))
        finally:
            os._exit(3)
    episode.serve_episode(limits.max_frame_bytes)
    os._exit(0)


def _recv(sock: socket.socket):
    msg, fds, _, _ = socket.recv_fds(sock, 65536, 4)
    if not msg:
        return None, fds
    return json.loads(msg), fds


def _supervise(zygote: int) -> None:
    """The outer process of a worker with a pid namespace: wait for the zygote, exit with it."""
    while True:
        try:
            _, status = os.waitpid(zygote, 0)
            break
        except ChildProcessError:
            status = 0
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 1)


def _high_fd(path: str) -> int:
    """An O_PATH descriptor of `path`, above the descriptors a child dups its pipes onto (3, 4)."""
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(fd)


def _host_ppid(hostproc: int) -> int:
    fd = os.open("self/stat", os.O_RDONLY, dir_fd=hostproc)
    try:
        return int(os.read(fd, 4096).rsplit(b")", 1)[1].split()[1])
    finally:
        os.close(fd)


def main() -> None:
    host, tmp_root = int(sys.argv[1]), sys.argv[2]
    limits = Limits(**json.loads(sys.argv[3]))
    harden.prctl(harden.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != host:
        return
    for name in PRELOAD:
        __import__(name)
    sock = socket.socket(fileno=int(sys.argv[4]))
    facts = namespaces.unshare_worker()
    outer = None
    if facts["pidns"]:
        outer = os.getpid()
        pid = os.fork()
        if pid:
            sock.close()  # only the zygote holds the host's socket: its death is an EOF there
            _supervise(pid)
        harden.prctl(harden.PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        hostproc = _high_fd("/proc")
        me = int(os.readlink("self", dir_fd=hostproc))
    except (OSError, ValueError):
        hostproc, me = None, os.getpid()
    if outer is not None and (hostproc is None or _host_ppid(hostproc) != outer):
        os._exit(1)  # the supervisor died before the death signal was set
    try:  # opened before the new root hides the cgroup file system
        cg = _high_fd(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] else None
    except OSError:
        cg = None
    serve(sock, tmp_root, limits, facts, hostproc, me, cg)


def serve(sock: socket.socket, tmp_root: str, limits: Limits, facts: dict, hostproc: int | None,
          me: int, cg: int | None) -> None:
    """The zygote: set up the file-system view, then fork, end and reap episodes on request."""
    facts["zygote_pid"] = me
    facts["own_uid"] = (os.getuid() == 0 and not facts["userns"]
                        and (hostproc is not None or not facts["pidns"])  # host pids are unique
                        and namespaces.maps_uid_range(harden.UID_BASE, harden.PID_SPAN))
    facts["landlock_abi"] = max(0, harden._libc.syscall(harden.SYS_LL_CREATE, None, 0, 1))
    facts["read_dirs"] = harden.stdlib_dirs()  # computed here: sysconfig imports lazily
    facts["seccomp_error"] = seccomp.SECCOMP_IMPORT_ERROR
    try:  # compiled before the new root: libseccomp writes it through a temporary file
        prog = seccomp.program()
    except Exception as e:  # noqa: BLE001 - reported by the probe; `require` decides
        prog, facts["seccomp_error"] = None, f"{type(e).__name__}: {e}"
    # With a mount namespace the worker's tmpfs goes over /tmp, in this namespace only: nothing
    # is created on the host's disk, so nothing is left there if the host is killed.
    if facts["mountns"] and os.path.isdir("/tmp"):
        facts.update(namespaces.private_root("/tmp", limits.tmpfs_bytes, facts["read_dirs"]))
    if not facts.get("tmpfs"):
        os.makedirs(tmp_root, mode=0o711, exist_ok=True)
        facts.update(tmpfs=False, host_view=False, episodes=tmp_root)
    facts["landlock_probe"] = _landlock_probe("/" if facts["host_view"] else facts["episodes"])
    here = os.getpid()
    children: dict[int, int | None] = {}  # episode id -> pid (alive or zombie); None: no fork
    if not facts["pidns"]:
        # No namespace to take the episodes with us: when the host dies, kill them ourselves
        # (an episode may have cleared its own parent-death signal), and remove what is ours on
        # the host's disk (the pool's directory goes with its last worker).
        def on_host_death(signum, frame):
            for pid in children.values():
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                    except OSError:
                        pass
            if not facts["tmpfs"]:
                cleanup.rmtree(tmp_root)
                try:
                    os.rmdir(os.path.dirname(tmp_root))
                except OSError:
                    pass
            os._exit(0)

        signal.signal(signal.SIGTERM, on_host_death)
        harden.prctl(harden.PR_SET_PDEATHSIG, signal.SIGTERM)
    # Everything imported so far is shared with every child; frozen, the children's collector
    # never writes to those pages, so they stay shared instead of being copied per episode.
    gc.freeze()
    sock.sendall(json.dumps({"hello": facts}).encode())
    where = facts["episodes"]
    cleaners: set[int] = set()  # throw-away processes removing left-over trees
    signal.signal(signal.SIGCHLD, lambda signum, frame: _reap(cleaners, block=False))
    while True:
        req, fds = _recv(sock)
        if req is None:
            break
        _reap(cleaners, block=False)
        op, ep = req.get("op"), req.get("ep")
        if op in ("spawn", "probe"):
            req_fd, rep_fd = fds
            leaf = (cg, f"ep{ep}") if cg is not None and cgroups.make_leaf(cg, f"ep{ep}", limits) else None
            try:
                pid = os.fork()
            except OSError:  # out of processes or memory: the host sees EOF and asks why
                os.close(req_fd)
                os.close(rep_fd)
                if leaf:
                    cgroups.remove_leaf(*leaf)
                children[ep] = None
                continue
            if pid == 0:
                try:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    sock.close()
                    os.dup2(req_fd, REQ_FD)
                    os.dup2(rep_fd, REP_FD)
                    _child_main(here, os.path.join(where, f"ep{ep}"), limits, facts, prog,
                                op == "probe", hostproc, leaf)
                finally:
                    os._exit(4)
            os.close(req_fd)
            os.close(rep_fd)
            children[ep] = pid
        elif op == "end":
            pid = children.pop(ep, None)
            status = _end(pid, os.path.join(where, f"ep{ep}"), cg, f"ep{ep}", cleaners)
            if req.get("reply"):
                sock.sendall(json.dumps({"ended": ep, **status}).encode())
        for fd in fds if op not in ("spawn", "probe") else ():
            os.close(fd)
    for ep, pid in list(children.items()):
        _end(pid, os.path.join(where, f"ep{ep}"), cg, f"ep{ep}", cleaners)
    _reap(cleaners, block=True)


def _landlock_probe(where: str) -> str:
    """A file anyone may read, outside every directory Landlock lets a child read: the probe
    child must fail to open it."""
    path = os.path.join(where, ".landlock-probe")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        os.close(fd)
        os.chmod(path, 0o644)
    except OSError:
        return ""
    return path


def _reap(pids: set[int], block: bool) -> None:
    for pid in list(pids):
        try:
            done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            pids.discard(pid)


def _end(pid: int | None, tmp_dir: str, cg: int | None, leaf: str, cleaners: set[int]) -> dict:
    if pid is None:
        return {"code": None, "signal": None, "maxrss_kb": 0, "cpu_s": 0.0,
                "note": "the worker could not fork a child for this episode"}
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, status, ru = os.wait4(pid, 0)
    oom = False
    try:  # nothing an episode left behind may take its worker down
        cleaner = cleanup.remove_episode_dir(tmp_dir)
        if cleaner:
            cleaners.add(cleaner)
        if cg is not None:
            oom = cgroups.oom_killed(cg, leaf)
            cgroups.remove_leaf(cg, leaf)
    except Exception:  # noqa: BLE001
        pass
    return {"code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "maxrss_kb": ru.ru_maxrss, "cpu_s": ru.ru_utime + ru.ru_stime, "oom": oom}


if __name__ == "__main__":
    main()
