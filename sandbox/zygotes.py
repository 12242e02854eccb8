"""Host-side handles to the worker processes ("zygotes").

A worker is started with `subprocess` (never by forking the caller, which may be a JAX process
with threads), with a clean environment, PYTHONHASHSEED=0 and single-threaded numeric libraries;
where the kernel allows a pid namespace, the started process only supervises the zygote it
forks (worker.py). The host talks to the zygote over a SOCK_SEQPACKET socket: one JSON message
per packet, pipe ends for a new episode attached with SCM_RIGHTS. The zygote only forks, kills
and reaps; it is trusted code and never runs an environment itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import socket
import subprocess
import sys
import time

from .contract import Limits

_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1",
        # Each malloc arena reserves 64 MiB of address space, which RLIMIT_AS counts: few arenas
        # keep a threaded environment from running out of address space for nothing.
        "MALLOC_ARENA_MAX": "2"}
# The worker imports this folder as a top-level package named `sandbox` from its parent directory,
# whatever name the host imported it under (`spade_jax.sandbox` when installed): the package uses
# relative imports only, so the worker never imports spade_jax (nor, through it, JAX).
_BOOT = "import sys; sys.path.insert(0, {!r}); from sandbox import worker; worker.main()"


class Zygote:
    def __init__(self, index: int, root: str, limits: Limits, cgroup: str = ""):
        """Launch without waiting for it to be ready (call `ready()`), so many start in parallel."""
        self.index, self.alive, self.facts, self.stash = index, True, {}, {}
        here, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.root = os.path.join(root, f"w{index}")  # on the host's disk only if the worker needs it
        cmd = [sys.executable, "-s", "-P", "-c", _BOOT.format(pkg_parent), str(os.getpid()), self.root,
               json.dumps(dataclasses.asdict(limits)), str(theirs.fileno()), cgroup]
        try:
            self.proc = subprocess.Popen(cmd, env=dict(_ENV), cwd="/", stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                                         start_new_session=True)
        finally:
            theirs.close()
        self.sock = here

    def ready(self, timeout: float = 60.0) -> "Zygote":
        """Wait for the hello message with the worker's facts (namespaces, Landlock ABI, ...)."""
        if select.select([self.sock], [], [], timeout)[0]:
            try:
                msg = self.sock.recv(65536)
            except OSError:
                msg = b""
            if msg:
                self.facts = json.loads(msg)["hello"]
                return self
        self.stop()
        raise RuntimeError(f"sandbox worker {self.index} failed to start (exit {self.proc.poll()})")

    def tell(self, msg: dict, fds: list[int] = ()) -> bool:
        if not self.alive:
            return False
        try:
            socket.send_fds(self.sock, [json.dumps(msg).encode()], list(fds))
            return True
        except OSError:
            self.alive = False
            return False

    def ended(self, eid: int, timeout: float = 10.0) -> dict | None:
        """Wait for the exit report of one episode (asked for with reply=True). None if the
        worker died or did not answer."""
        deadline = time.monotonic() + timeout
        while eid not in self.stash:
            left = deadline - time.monotonic()
            if not self.alive or left <= 0 or not select.select([self.sock], [], [], left)[0]:
                self.alive = False
                return None
            try:
                msg = self.sock.recv(65536)
            except OSError:
                msg = b""
            if not msg:
                self.alive = False
                return None
            m = json.loads(msg)
            self.stash[m["ended"]] = m
        return self.stash.pop(eid)

    def stop(self) -> None:
        self.alive = False
        self.sock.close()  # the worker kills and reaps its children when its socket closes
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
