"""The worker ("zygote") process and the episode child it forks.

A worker is started by the pool with `subprocess` and a clean environment. It imports what
environments usually need once, sets up its namespaces, then waits on a SOCK_SEQPACKET control
socket. For each episode the host sends two pipe ends (SCM_RIGHTS); the worker forks a child that
hardens itself and then talks to the host directly over those pipes, so a step costs one round
trip between host and child. The worker only forks, kills and reaps: it never runs untrusted
code, and a child stays a zombie until the host ends the episode, so its pid cannot be reused
while the host still cares about it.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import shutil
import signal
import socket
import sys
import traceback

from . import harden, protocol
from .contract import Limits

# Imported once here so that children share them (copy-on-write) and need no file access for
# them: a child may have no read access to the standard library at all.
PRELOAD = """abc array base64 binascii bisect calendar cmath collections collections.abc colorsys
contextlib copy dataclasses datetime decimal difflib enum fnmatch fractions functools graphlib hashlib
heapq io itertools json keyword math numbers operator pprint queue random re secrets shlex statistics
string struct textwrap threading time types typing unicodedata uuid weakref zlib""".split()

REQ_FD, REP_FD = 3, 4


# ----------------------------------------------------------------------------- episode child


class _TooLarge(Exception):
    pass


def _plain(x, budget: list, depth: int = 0):
    """JSON-able copy of what the environment returned; what JSON cannot carry is marked, so the
    host can name it (a tuple becomes a list; a NaN or an object becomes {"$unjson": name}).
    `budget` ([chars left]) stops a huge reply before any time is spent encoding it."""
    if depth > 40:
        return {"$unjson": "too deep"}
    if isinstance(x, str):
        budget[0] -= len(x)
        if budget[0] < 0:
            raise _TooLarge(f"reply over {len(x)} chars")
        return str(x)
    if x is None or isinstance(x, (bool, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else {"$unjson": repr(x)}
    if isinstance(x, (list, tuple)):
        budget[0] -= len(x)
        if budget[0] < 0:
            raise _TooLarge(f"reply with a sequence of {len(x)} items")
        return [_plain(v, budget, depth + 1) for v in x]
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x):
            return {_plain(k, budget, depth + 1): _plain(v, budget, depth + 1) for k, v in x.items()}
        return {"$unjson": "dict with non-str keys"}
    return {"$unjson": type(x).__name__}


def _find_class(ns: dict):
    cands = [v for k, v in ns.items() if isinstance(v, type) and k.endswith("Env")
             and getattr(v, "__module__", None) == "__env__"]
    # A base class plus its concrete subclass is one environment, not an ambiguity.
    leaves = [c for c in cands if not any(o is not c and issubclass(o, c) for o in cands)]
    if len(leaves) != 1:
        names = ", ".join(sorted(c.__name__ for c in leaves)) or "none"
        raise LookupError(f"expected one class whose name ends in 'Env', found {names}")
    return leaves[0]


def _error_reason(e: BaseException) -> str:
    line = ""
    for fs in traceback.extract_tb(e.__traceback__):
        if fs.filename == "<env>":
            line = f" (line {fs.lineno})"
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001 - a hostile __str__
        msg = "?"
    return f"{type(e).__name__}: {msg[:300]}{line}"


def _answer(req: dict, state: dict, cap: int):
    op = req.get("op")
    budget = [cap]
    if op == "start":
        state["phase"] = "compile"
        code = compile(req["code"], "<env>", "exec")
        ns = {"__name__": "__env__", "__builtins__": __builtins__}
        state["phase"] = "exec"
        exec(code, ns)  # noqa: S102 - this is the sandbox
        state["phase"] = "class"
        cls = _find_class(ns)
        state["phase"] = "init"
        try:
            env = cls()
        except TypeError:
            env = cls(max_turns=req["max_turns"])
        state["env"], state["phase"] = env, "reset"
        out = {"ret": _plain(env.reset(seed=req["seed"]), budget)}
        if req.get("solution"):
            state["phase"] = "solution"
            fn = getattr(env, "solution", None)
            out["solution"] = _plain(list(fn()), budget) if callable(fn) else None
        state["phase"] = ""
        return out
    if op == "reset":
        return {"ret": _plain(state["env"].reset(seed=req["seed"]), budget)}
    if op == "step":
        return {"ret": _plain(state["env"].step(req["action"]), budget)}
    return {"err": "PROTOCOL_ERROR", "reason": f"unknown op {op!r}"}


def serve_episode(cap: int) -> None:
    """Answer requests until the host goes away. Runs in the hardened child."""
    random.seed()  # every episode starts from fresh entropy: unseeded randomness shows up as
    state: dict = {}  # nondeterminism in validation, whichever worker runs the two transcripts
    oom = protocol.encode({"err": "OOM", "reason": "MemoryError"})
    while True:
        state["phase"] = ""
        try:
            req = protocol.read_frame(REQ_FD, cap)
        except (EOFError, protocol.FrameError):
            os._exit(0)
        try:
            out = protocol.encode(_answer(req, state, cap))
        except MemoryError:
            out = oom
        except _TooLarge as e:
            out = protocol.encode({"err": "OUTPUT_TOO_LARGE", "reason": str(e)})
        except BaseException as e:  # noqa: BLE001 - SystemExit and friends are env errors too
            try:
                out = protocol.encode({"err": "ENV_ERROR", "reason": _error_reason(e),
                                       "phase": state.get("phase", "")})
            except MemoryError:
                out = oom
        if len(out) - protocol.HEADER.size > cap:
            out = protocol.encode({"err": "OUTPUT_TOO_LARGE", "reason": f"reply of {len(out)} bytes"})
        protocol.write_all(REP_FD, out)


def probe_checks(tmp_dir: str, limits: Limits) -> dict:
    """What a hardened child can actually do; run in a hardened child at pool start."""
    import errno
    import resource

    def denied(fn) -> bool:
        try:
            fn()
        except OSError:
            return True
        return False

    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    def outside_write():
        with open(os.path.join(os.path.dirname(tmp_dir), "escape"), "w") as f:
            f.write("x")

    def thread_ok() -> bool:
        import threading
        box = []
        t = threading.Thread(target=lambda: box.append(1))
        t.start()
        t.join()
        return box == [1]

    return {
        "rlimits": resource.getrlimit(resource.RLIMIT_AS) == (limits.memory_bytes, limits.memory_bytes),
        "seccomp": denied(lambda: socket.socket().close()) and denied(fork)
        and denied(lambda: os.kill(os.getppid(), 0)),
        "landlock": denied(outside_write) and denied(lambda: os.listdir("/proc")),
        "unprivileged": os.geteuid() != 0,
        "no_new_privs": harden._libc.prctl(39, 0, 0, 0, 0) == 1,
        "pdeathsig": _get_pdeathsig() == signal.SIGKILL,
        "threads": thread_ok(),
        "fs_write_in_tmp": not denied(lambda: open("probe.txt", "w").close()),
        "errno_ok": errno.EPERM == 1,
    }


def _get_pdeathsig() -> int:
    import ctypes
    out = ctypes.c_int(0)
    harden._libc.prctl(2, ctypes.byref(out), 0, 0, 0)
    return out.value


# ----------------------------------------------------------------------------- worker


def _child_main(parent: int, tmp_dir: str, limits: Limits, facts: dict, prog: bytes | None,
                probe: bool) -> None:
    try:
        harden.harden_child(parent=parent, keep_fds=(REQ_FD, REP_FD), tmp_dir=tmp_dir,
                            limits=limits, facts=facts, seccomp_prog=prog)
        if probe:
            checks = probe_checks(tmp_dir, limits)
            protocol.write_all(REP_FD, protocol.encode({"probe": checks}))
            os._exit(0)
    except BaseException as e:  # noqa: BLE001
        try:
            protocol.write_all(REP_FD, protocol.encode(
                {"err": "PROTOCOL_ERROR", "reason": f"hardening failed: {type(e).__name__}: {e}"}))
        finally:
            os._exit(3)
    serve_episode(limits.max_frame_bytes)
    os._exit(0)


def _recv(sock: socket.socket):
    msg, fds, _, _ = socket.recv_fds(sock, 65536, 4)
    if not msg:
        return None, fds
    return json.loads(msg), fds


def main() -> None:
    host, tmp_root = int(sys.argv[1]), sys.argv[2]
    limits = Limits(**json.loads(sys.argv[3]))
    harden.prctl(harden.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != host:
        return
    for name in PRELOAD:
        __import__(name)
    sock = socket.socket(fileno=int(sys.argv[4]))
    os.makedirs(tmp_root, mode=0o711, exist_ok=True)
    facts = harden.setup_worker(tmp_root, limits.tmpfs_bytes)
    facts["pid"] = os.getpid()
    try:
        prog = harden.seccomp_program()
    except Exception as e:  # noqa: BLE001 - reported by the probe; `require` decides
        prog, facts["seccomp_error"] = None, f"{type(e).__name__}: {e}"
    # Everything imported so far is shared with every child; frozen, the children's collector
    # never writes to those pages, so they stay shared instead of being copied per episode.
    gc.freeze()
    sock.sendall(json.dumps({"hello": facts}).encode())
    children: dict[int, int | None] = {}  # episode id -> pid (alive or zombie); None: no fork
    while True:
        req, fds = _recv(sock)
        if req is None:
            break
        op, ep = req.get("op"), req.get("ep")
        if op in ("spawn", "probe"):
            req_fd, rep_fd = fds
            me = os.getpid()
            try:
                pid = os.fork()
            except OSError:  # out of processes or memory: the host sees EOF and asks why
                os.close(req_fd)
                os.close(rep_fd)
                children[ep] = None
                continue
            if pid == 0:
                try:
                    sock.close()
                    os.dup2(req_fd, REQ_FD)
                    os.dup2(rep_fd, REP_FD)
                    _child_main(me, os.path.join(tmp_root, f"ep{ep}"), limits, facts, prog,
                                op == "probe")
                finally:
                    os._exit(4)
            os.close(req_fd)
            os.close(rep_fd)
            children[ep] = pid
        elif op == "end":
            pid = children.pop(ep, None)
            status = _end(pid, os.path.join(tmp_root, f"ep{ep}"))
            if req.get("reply"):
                sock.sendall(json.dumps({"ended": ep, **status}).encode())
        for fd in fds if op not in ("spawn", "probe") else ():
            os.close(fd)
    for ep, pid in children.items():
        _end(pid, os.path.join(tmp_root, f"ep{ep}"))


def _end(pid: int | None, tmp_dir: str) -> dict:
    if pid is None:
        return {"code": None, "signal": None, "maxrss_kb": 0, "cpu_s": 0.0,
                "note": "the worker could not fork a child for this episode"}
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, status, ru = os.wait4(pid, 0)
    _rmtree(tmp_dir)
    return {"code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "maxrss_kb": ru.ru_maxrss, "cpu_s": ru.ru_utime + ru.ru_stime}


def _rmtree(path: str) -> None:
    # shutil.rmtree works on directory fds and never follows a symlink the child planted.
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
