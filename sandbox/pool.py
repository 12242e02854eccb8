"""The host side: a pool of pre-started workers and a batched, asynchronous episode API.

The self-play loop starts many episodes at once and steps all live ones with `step_many`, which
sends every action before it returns and then yields checked replies in the order they finish;
the host can sample on the device while children compute. Every request carries a deadline;
a child that misses it is SIGKILLed by its worker. Replies are checked here (contract.py), never
trusted. Nothing here forks the calling process: workers are started with `subprocess`.

Not thread-safe: drive a pool from one thread, and create it from a thread that outlives it (the
workers' parent-death signal follows the creating thread).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Hashable, Iterable, Iterator, Mapping

from sandbox import protocol
from sandbox.contract import Invalid, Limits, Reply, Status, check_reset, check_solution, check_step

PROTECTIONS = ("rlimits", "seccomp", "landlock", "unprivileged", "no_new_privs", "pdeathsig",
               "netns", "userns", "tmpfs")
DEFAULT_REQUIRE = ("rlimits", "seccomp", "unprivileged", "no_new_privs", "pdeathsig")
_CHILD_ERRORS = {s.value for s in (Status.ENV_ERROR, Status.OOM, Status.OUTPUT_TOO_LARGE,
                                   Status.INVALID_RETURN, Status.PROTOCOL_ERROR)}
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1"}
_BOOT = "import sys; sys.path.insert(0, {!r}); from sandbox import worker; worker.main()"


class SandboxUnavailable(RuntimeError):
    """A protection named in `require` is not in force on this machine."""


@dataclasses.dataclass(frozen=True)
class Start:
    """How to start one episode: code, reset seed, optional worker pin, and whether to also
    return the environment's own solution() (validation uses it)."""

    code: str
    seed: int | None = None
    worker: int | None = None
    solution: bool = False


class _Worker:
    def __init__(self, index: int, proc: subprocess.Popen, sock: socket.socket, facts: dict):
        self.index, self.proc, self.sock, self.facts = index, proc, sock, facts
        self.alive, self.stash = True, {}


class _Episode:
    __slots__ = ("id", "worker", "wfd", "rfd", "reader", "op", "deadline", "key", "killed")

    def __init__(self, eid, worker, wfd, rfd, cap):
        self.id, self.worker, self.wfd, self.rfd = eid, worker, wfd, rfd
        self.reader = protocol.FrameReader(rfd, cap)
        self.op, self.deadline, self.key, self.killed = None, 0.0, eid, False


class Pool:
    def __init__(self, workers: int = 2, limits: Limits = Limits(),
                 require: Iterable[str] = DEFAULT_REQUIRE, tmp_root: str | None = None):
        require = tuple(require)
        unknown = set(require) - set(PROTECTIONS)
        if unknown:
            raise ValueError(f"unknown protections {sorted(unknown)}; known: {PROTECTIONS}")
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.limits = limits
        self._root = tempfile.mkdtemp(prefix="sandbox-", dir=tmp_root)
        os.chmod(self._root, 0o711)  # children (as nobody) must traverse to their own dirs
        self._episodes: dict[int, _Episode] = {}
        self._next_id, self._rr = 0, 0
        self._workers: list[_Worker] = []
        try:
            launched = [self._launch(i) for i in range(workers)]
            self._workers = [self._hello(i, *pair) for i, pair in enumerate(launched)]
            self.protections = self._probe()
        except BaseException:
            self.close()
            raise
        missing = [p for p in require if not self.protections.get(p)]
        if missing:
            self.close()
            raise SandboxUnavailable(f"required protections not in force: {missing}; "
                                     f"probe: {self.protections}")

    # ------------------------------------------------------------------------- public API

    def start_many(self, starts: Mapping[Hashable, Start | str]) -> Iterator[Reply]:
        """Start one episode per entry (load the code, reset). Everything is sent before this
        returns; iterate for replies in finishing order. `reply.key` is the caller's key and
        `reply.episode` the new episode's id for step_many."""
        items = []
        for key, s in starts.items():
            s = Start(s) if isinstance(s, str) else s
            if len(s.code) > self.limits.max_code_chars:
                raise ValueError(f"code of {len(s.code)} chars over max_code_chars")
            _check_seed(s.seed)
            ep = self._new_episode(s.worker)
            ep.key = key
            req = {"op": "start", "code": s.code, "seed": s.seed, "max_turns": self.limits.max_turns,
                   "solution": s.solution}
            items.append((ep, self._submit(ep, req, self.limits.load_s)))
        return self._collect(items)

    def step_many(self, actions: Mapping[int, str], timeout: float | None = None) -> Iterator[Reply]:
        """Send one action to each live episode; yield replies as they finish. Actions longer
        than limits.max_action_chars are cut to that length. A reply that ends the episode
        (terminated, truncated, or any error) also frees it."""
        n = self.limits.max_action_chars
        return self._batch({e: {"op": "step", "action": str(a)[:n]} for e, a in actions.items()},
                           self.limits.step_s if timeout is None else timeout)

    def reset_many(self, seeds: Mapping[int, int | None], timeout: float | None = None) -> Iterator[Reply]:
        for s in seeds.values():
            _check_seed(s)
        return self._batch({e: {"op": "reset", "seed": s} for e, s in seeds.items()},
                           self.limits.reset_s if timeout is None else timeout)

    def end_many(self, episodes: Iterable[int]) -> None:
        """Abandon episodes: their children are killed and their temp dirs removed."""
        for e in episodes:
            ep = self._episodes.get(e)
            if ep is not None:
                self._end(ep)

    def play(self, code: str, seed: int | None, actions: Iterable[str], worker: int | None = None,
             solution: bool = False) -> list[Reply]:
        """One whole episode, synchronously: the start reply, then one reply per action until
        the episode is done. The episode is always ended."""
        (first,) = list(self.start_many({0: Start(code, seed, worker, solution)}))
        out = [first]
        try:
            for a in actions:
                if out[-1].done:
                    break
                out += list(self.step_many({first.episode: a}))
        finally:
            self.end_many([first.episode])
        return out

    @property
    def live(self) -> int:
        return len(self._episodes)

    @property
    def workers(self) -> int:
        return len(self._workers)

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        for ep in list(self._episodes.values()):
            self._end(ep)
        for w in self._workers:
            self._stop_worker(w)
        self._workers = []
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------- workers

    def _launch(self, index: int):
        here, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        wroot = os.path.join(self._root, f"w{index}")
        os.mkdir(wroot, 0o711)
        cmd = [sys.executable, "-s", "-P", "-c", _BOOT.format(pkg_parent), str(os.getpid()), wroot,
               json.dumps(dataclasses.asdict(self.limits)), str(theirs.fileno())]
        try:
            proc = subprocess.Popen(cmd, env=dict(_ENV), cwd="/", stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                                    start_new_session=True)
        finally:
            theirs.close()
        return proc, here

    def _hello(self, index: int, proc: subprocess.Popen, sock: socket.socket) -> _Worker:
        sock.settimeout(60)
        try:
            msg = sock.recv(65536)
        except (socket.timeout, OSError):
            msg = b""
        sock.settimeout(None)
        if not msg:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"sandbox worker {index} failed to start (exit {proc.poll()})")
        return _Worker(index, proc, sock, json.loads(msg)["hello"])

    def _restart(self, w: _Worker) -> None:
        self._stop_worker(w)
        shutil.rmtree(os.path.join(self._root, f"w{w.index}"), ignore_errors=True)
        self._workers[w.index] = self._hello(w.index, *self._launch(w.index))

    def _stop_worker(self, w: _Worker) -> None:
        w.alive = False
        w.sock.close()  # the worker kills and reaps its children when its socket closes
        try:
            w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()

    def _tell(self, w: _Worker, msg: dict, fds: list[int] = ()) -> bool:
        if not w.alive:
            return False
        try:
            socket.send_fds(w.sock, [json.dumps(msg).encode()], list(fds))
            return True
        except OSError:
            w.alive = False
            return False

    def _ask_ended(self, w: _Worker, eid: int) -> dict | None:
        """Wait for the worker's exit report of one episode. None if the worker died."""
        deadline = time.monotonic() + 10
        while eid not in w.stash:
            left = deadline - time.monotonic()
            if not w.alive or left <= 0 or not select.select([w.sock], [], [], left)[0]:
                w.alive = False
                return None
            try:
                msg = w.sock.recv(65536)
            except OSError:
                msg = b""
            if not msg:
                w.alive = False
                return None
            m = json.loads(msg)
            w.stash[m["ended"]] = m
        return w.stash.pop(eid)

    def _probe(self) -> dict:
        ep = self._new_episode(0, op="probe")
        try:
            deadline = time.monotonic() + 30
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([ep.rfd], [], [], left)[0]:
                    raise RuntimeError("sandbox probe did not answer")
                frames, eof = ep.reader.feed()
                if frames or eof:
                    break
        finally:
            self._end(ep)
        checks = frames[0].get("probe") if frames and isinstance(frames[0], dict) else None
        if checks is None:
            reason = frames[0].get("reason") if frames else "probe child died"
            raise RuntimeError(f"sandbox probe failed: {reason}")
        facts = self._workers[0].facts
        out = {k: bool(checks.get(k)) for k in ("rlimits", "seccomp", "landlock", "unprivileged",
                                               "no_new_privs", "pdeathsig")}
        out.update({k: bool(facts.get(k)) for k in ("netns", "userns", "tmpfs")})
        out["landlock"] = out["landlock"] and facts.get("landlock_abi", 0) > 0
        out["threads"] = bool(checks.get("threads"))
        out["landlock_abi"] = facts.get("landlock_abi", 0)
        if facts.get("seccomp_error"):
            out["seccomp_error"] = facts["seccomp_error"]
        return out

    # ------------------------------------------------------------------------- episodes

    def _new_episode(self, worker: int | None, op: str = "spawn") -> _Episode:
        if worker is None:
            worker, self._rr = self._rr % len(self._workers), self._rr + 1
        w = self._workers[worker % len(self._workers)]
        eid, self._next_id = self._next_id, self._next_id + 1
        for _ in range(2):
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            sent = self._tell(w, {"op": op, "ep": eid}, [req_r, rep_w])
            os.close(req_r)
            os.close(rep_w)
            if sent:
                break
            os.close(req_w)
            os.close(rep_r)
            self._restart(w)
            w = self._workers[w.index]
        else:
            raise RuntimeError(f"sandbox worker {w.index} keeps dying")
        os.set_blocking(req_w, False)
        os.set_blocking(rep_r, False)
        ep = _Episode(eid, w, req_w, rep_r, self.limits.max_frame_bytes)
        self._episodes[eid] = ep
        return ep

    def _batch(self, reqs: Mapping[int, dict], timeout: float) -> Iterator[Reply]:
        eps = []
        for e in reqs:
            ep = self._episodes.get(e)
            if ep is None or ep.op is not None:
                raise ValueError(f"episode {e} is not live or still has a request in flight")
            ep.key = ep.id
            eps.append(ep)
        return self._collect([(ep, self._submit(ep, reqs[ep.id], timeout)) for ep in eps])

    def _submit(self, ep: _Episode, req: dict, timeout: float) -> Reply | None:
        ep.op, ep.deadline = req["op"], time.monotonic() + timeout
        try:
            protocol.write_all(ep.wfd, protocol.encode(req), ep.deadline)
        except BrokenPipeError:
            pass  # the child is gone; reading its pipe will say how
        except TimeoutError:
            return self._fail(ep, Status.TIMEOUT, f"{req['op']}: child did not read its request")
        return None

    def _collect(self, items: list[tuple[_Episode, Reply | None]]) -> Iterator[Reply]:
        waiting: dict[int, _Episode] = {}
        poller = select.poll()
        ready = []
        for ep, immediate in items:
            if immediate is not None:
                ready.append(immediate)
            else:
                waiting[ep.rfd] = ep
                poller.register(ep.rfd, select.POLLIN)
        try:
            yield from ready
            while waiting:
                now = time.monotonic()
                soonest = min(ep.deadline for ep in waiting.values())
                if soonest <= now:
                    for fd, ep in list(waiting.items()):
                        if ep.deadline <= now:
                            del waiting[fd]
                            poller.unregister(fd)
                            yield self._fail(ep, Status.TIMEOUT,
                                             f"{ep.op}: no reply within the deadline; killed")
                    continue
                for fd, _ in poller.poll(max(1, int((soonest - now) * 1000) + 1)):
                    reply = self._read(waiting[fd])
                    if reply is not None:
                        del waiting[fd]
                        poller.unregister(fd)
                        yield reply
        finally:
            for ep in waiting.values():  # the caller stopped iterating: abandon what is left
                self._end(ep)

    def _read(self, ep: _Episode) -> Reply | None:
        try:
            frames, eof = ep.reader.feed()
        except protocol.FrameTooLarge as e:
            return self._fail(ep, Status.OUTPUT_TOO_LARGE, str(e))
        except protocol.FrameError as e:
            return self._fail(ep, Status.PROTOCOL_ERROR, str(e))
        if len(frames) > 1:
            return self._fail(ep, Status.PROTOCOL_ERROR, "more than one reply to one request")
        if frames:
            return self._reply(ep, frames[0])
        if eof:
            return self._died(ep)
        return None

    def _reply(self, ep: _Episode, msg) -> Reply:
        op, ep.op = ep.op, None
        if not isinstance(msg, dict):
            return self._fail(ep, Status.PROTOCOL_ERROR, "reply is not an object")
        if "err" in msg:
            err, reason = msg.get("err"), msg.get("reason")
            if err not in _CHILD_ERRORS or not isinstance(reason, str):
                return self._fail(ep, Status.PROTOCOL_ERROR, "malformed error reply")
            return self._fail(ep, Status(err), f"{op}: {reason[:500]}")
        try:
            if op in ("start", "reset"):
                obs, info = check_reset(msg.get("ret"), self.limits)
                sol = check_solution(msg.get("solution"), self.limits) if op == "start" else None
                return Reply(ep.key, ep.id, Status.OK, observation=obs, info=info, solution=sol)
            obs, reward, term, trunc, info = check_step(msg.get("ret"), self.limits)
        except Invalid as e:
            return self._fail(ep, e.status, f"{op}: {e.reason}")
        except (OverflowError, TypeError, ValueError) as e:
            return self._fail(ep, Status.INVALID_RETURN, f"{op}: {e}")
        reply = Reply(ep.key, ep.id, Status.OK, observation=obs, reward=reward, terminated=term,
                      truncated=trunc, info=info)
        if reply.done:
            self._end(ep)
        return reply

    def _died(self, ep: _Episode) -> Reply:
        op = ep.op
        st = self._end(ep, want_status=True)
        if st is None:
            return self._reply_error(ep, Status.CRASHED, f"{op}: the worker died")
        sig, code = st.get("signal"), st.get("code")
        if sig in (signal.SIGKILL, signal.SIGXCPU) and st.get("cpu_s", 0) >= self.limits.cpu_seconds - 0.5:
            return self._reply_error(ep, Status.TIMEOUT, f"{op}: CPU time limit reached")
        if sig is not None and st.get("maxrss_kb", 0) * 1024 > 0.8 * self.limits.memory_bytes:
            return self._reply_error(ep, Status.OOM, f"{op}: killed by signal {sig} near the memory limit")
        what = f"killed by signal {signal.Signals(sig).name}" if sig else f"exited with code {code}"
        return self._reply_error(ep, Status.CRASHED, f"{op}: the environment process {what}")

    def _fail(self, ep: _Episode, status: Status, reason: str) -> Reply:
        self._end(ep)
        return self._reply_error(ep, status, reason)

    @staticmethod
    def _reply_error(ep: _Episode, status: Status, reason: str) -> Reply:
        return Reply(ep.key, ep.id, status, reason=reason)

    def _end(self, ep: _Episode, want_status: bool = False) -> dict | None:
        if self._episodes.pop(ep.id, None) is None:
            return None
        ep.op = None
        os.close(ep.wfd)
        os.close(ep.rfd)
        w = ep.worker
        if not self._tell(w, {"op": "end", "ep": ep.id, "reply": want_status}):
            if w is self._workers[w.index]:
                self._restart(w)
            return None
        return self._ask_ended(w, ep.id) if want_status else None


def _check_seed(seed) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, not {type(seed).__name__}")
