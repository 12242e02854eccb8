"""The host side: a pool of pre-started workers and a batched, asynchronous episode API.

The self-play loop starts many episodes at once and steps all live ones with `step_many`, which
sends every action before it returns and then yields checked replies in the order they finish;
the host can sample on the device while children compute. Every request carries a deadline, and
every episode a wall-time budget over all its requests (Limits.episode_s), charged only with
time the host spent waiting for it; a child that misses either is SIGKILLed by its worker.
Replies are checked here (contract.py, outcomes.py), never trusted. Nothing here forks the
calling process: workers are started with `subprocess`.

Not thread-safe: drive a pool from one thread, and create it from a thread that outlives it (the
workers' parent-death signal follows the creating thread).
"""

from __future__ import annotations

import dataclasses
import os
import select
import tempfile
import time
from typing import Hashable, Iterable, Iterator, Mapping

from . import cgroups, cleanup, outcomes, probe, protocol
from .contract import Limits, Reply, Status
from .text import is_text
from .zygotes import Zygote

PROTECTIONS, DEFAULT_REQUIRE = probe.PROTECTIONS, probe.DEFAULT_REQUIRE


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


class _Episode:
    __slots__ = ("id", "worker", "wfd", "rfd", "reader", "op", "deadline", "key", "used", "mark",
                 "budget_cut")

    def __init__(self, eid: int, worker: Zygote, wfd: int, rfd: int, cap: int):
        self.id, self.worker, self.wfd, self.rfd = eid, worker, wfd, rfd
        self.reader = protocol.FrameReader(rfd, cap)
        self.op, self.deadline, self.key = None, 0.0, eid
        # Wall-time budget: seconds charged so far, and the pool's poll clock when the request
        # in flight was sent; budget_cut: its deadline is the budget's, not the request's.
        self.used, self.mark, self.budget_cut = 0.0, 0.0, False


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
        self._inflight: dict[int, _Episode] = {}  # read fd -> episode with a request out
        self._ready: dict[int, Reply] = {}  # episode id -> reply read but not yet handed out
        self._poller = select.poll()
        self._polled = 0.0  # seconds spent waiting in poll(): what episodes are charged from
        self._next_id, self._rr = 0, 0
        self._workers: list[Zygote] = []
        self._cgroup, cgroup_error = cgroups.pool_dir()
        try:
            self._workers = [Zygote(i, self._root, limits, self._cgroup or "") for i in range(workers)]
            for z in self._workers:
                z.ready()
            self.protections = self._probe(cgroup_error)
        except BaseException:
            self.close()
            raise
        try:  # empty unless a worker keeps its episodes on the host's disk (no mount namespace)
            os.rmdir(self._root)
        except OSError:
            pass
        missing = [p for p in require if not self.protections.get(p)]
        if missing:
            self.close()
            raise SandboxUnavailable(f"required protections not in force: {missing}; "
                                     f"probe: {self.protections}")

    # ------------------------------------------------------------------------- batched API

    def start_many(self, starts: Mapping[Hashable, Start | str], timeout: float | None = None) -> Iterator[Reply]:
        """Start one episode per entry (load the code, reset). Everything is sent before this
        returns; iterate for replies in finishing order. `reply.key` is the caller's key and
        `reply.episode` the new episode's id, for step_many."""
        return self._drain(self.submit_starts(starts, timeout))

    def step_many(self, actions: Mapping[int, str], timeout: float | None = None) -> Iterator[Reply]:
        """Send one action to each live episode; yield replies as they finish. A reply that ends
        the episode (terminated, truncated, or any error) also frees it. Episodes whose replies
        are not consumed (the caller stops iterating) are abandoned."""
        self.submit_steps(actions, timeout)
        return self._drain(actions)

    def reset_many(self, seeds: Mapping[int, int | None], timeout: float | None = None) -> Iterator[Reply]:
        self.submit_resets(seeds, timeout)
        return self._drain(seeds)

    # ------------------------------------------------------------------------- low-level API
    # For loops that keep sending while replies come in: submit_*, then wait() for what finished.

    def submit_starts(self, starts: Mapping[Hashable, Start | str], timeout: float | None = None) -> list[int]:
        """Send starts; returns the new episode ids in the order of `starts`."""
        t = self.limits.load_s if timeout is None else timeout
        ids = []
        for key, s in starts.items():
            s = Start(s) if isinstance(s, str) else s
            if len(s.code) > self.limits.max_code_chars:
                raise ValueError(f"code of {len(s.code)} chars over max_code_chars")
            if not is_text(s.code):
                raise ValueError("code has a lone surrogate (not UTF-8 text)")
            _check_seed(s.seed)
            ep = self._new_episode(s.worker)
            ep.key = key
            self._submit(ep, {"op": "start", "code": s.code, "seed": s.seed,
                              "max_turns": self.limits.max_turns, "solution": s.solution}, t)
            ids.append(ep.id)
        return ids

    def submit_steps(self, actions: Mapping[int, str], timeout: float | None = None) -> None:
        """Actions longer than limits.max_action_chars are cut to that length; lone surrogates
        (not text) become U+FFFD."""
        n = self.limits.max_action_chars
        self._submit_batch({e: {"op": "step", "action": _text(str(a)[:n])} for e, a in actions.items()},
                           self.limits.step_s if timeout is None else timeout)

    def submit_resets(self, seeds: Mapping[int, int | None], timeout: float | None = None) -> None:
        for s in seeds.values():
            _check_seed(s)
        self._submit_batch({e: {"op": "reset", "seed": s} for e, s in seeds.items()},
                           self.limits.reset_s if timeout is None else timeout)

    def wait(self, episodes: Iterable[int] | None = None, timeout: float | None = None) -> list[Reply]:
        """Replies of the given episodes (default: all) that have finished: at least one, unless
        none of them has a request out or `timeout` passes first."""
        ids = set(self._inflight_ids() if episodes is None else episodes)
        limit = None if timeout is None else time.monotonic() + timeout
        while True:
            out = [self._ready.pop(i) for i in ids if i in self._ready]
            if out:
                return out
            waiting = [ep for ep in self._inflight.values() if ep.id in ids]
            now = time.monotonic()
            if not waiting or (limit is not None and now >= limit):
                return []
            if any(ep.deadline <= now for ep in self._inflight.values()):
                # A reply may have arrived in time while the caller was busy elsewhere (e.g.
                # sampling on the device): read what is there before declaring anything late.
                if self._read_ready(0):
                    continue
                for ep in [ep for ep in self._inflight.values() if ep.deadline <= now]:
                    why = (f"the episode's wall-time budget of {self.limits.episode_s:g} s is used up"
                           if ep.budget_cut else "no reply within the deadline")
                    self._ready[ep.id] = self._fail(ep, Status.TIMEOUT, f"{ep.op}: {why}; killed")
                continue
            until = min(ep.deadline for ep in waiting)
            until = until if limit is None else min(until, limit)
            self._read_ready(max(1, int((until - now) * 1000) + 1))

    def _read_ready(self, timeout_ms: int) -> bool:
        """Reads every reply that is complete within `timeout_ms`; True if any was."""
        got = False
        t = time.monotonic()
        events = self._poller.poll(timeout_ms)
        self._polled += time.monotonic() - t
        for fd, _ in events:
            ep = self._inflight.get(fd)
            if ep is not None:
                reply = self._read(ep)
                if reply is not None:
                    self._ready[ep.id] = reply
                    got = True
        return got

    def end_many(self, episodes: Iterable[int]) -> None:
        """Abandon episodes: their children are killed and their temp dirs removed."""
        for e in episodes:
            self._ready.pop(e, None)
            ep = self._episodes.get(e)
            if ep is not None:
                self._end(ep)

    def play(self, code: str, seed: int | None, actions: Iterable[str], worker: int | None = None,
             solution: bool = False, timeout: float | None = None) -> list[Reply]:
        """One whole episode, synchronously: the start reply, then one reply per action until
        the episode is done. The episode is always ended. `timeout` overrides every deadline."""
        (first,) = list(self.start_many({0: Start(code, seed, worker, solution)}, timeout))
        out = [first]
        try:
            for a in actions:
                if out[-1].done:
                    break
                out += list(self.step_many({first.episode: a}, timeout))
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
        """The processes that fork episodes (with a pid namespace, the zygote inside it)."""
        return [z.facts.get("zygote_pid") or z.proc.pid for z in self._workers]

    def close(self) -> None:
        for ep in list(self._episodes.values()):
            self._end(ep)
        for z in self._workers:
            z.stop()
        self._workers = []
        cleanup.rmtree(self._root)
        if self._cgroup:
            cgroups.remove(self._cgroup)
            self._cgroup = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------- internals

    def _restart(self, z: Zygote) -> None:
        z.stop()
        cleanup.rmtree(z.root)
        self._workers[z.index] = Zygote(z.index, self._root, self.limits, self._cgroup or "").ready()

    def _probe(self, cgroup_error: str) -> dict:
        ep = self._new_episode(0, op="probe")
        try:
            checks = probe.answer(ep.rfd, ep.reader)
        finally:
            self._end(ep)
        return probe.report(checks, self._workers[0].facts, cgroup_error)

    def _new_episode(self, worker: int | None, op: str = "spawn") -> _Episode:
        if worker is None:
            worker, self._rr = self._rr % len(self._workers), self._rr + 1
        z = self._workers[worker % len(self._workers)]
        eid, self._next_id = self._next_id, self._next_id + 1
        for _ in range(2):
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            sent = z.tell({"op": op, "ep": eid}, [req_r, rep_w])
            os.close(req_r)
            os.close(rep_w)
            if sent:
                break
            os.close(req_w)
            os.close(rep_r)
            self._restart(z)
            z = self._workers[z.index]
        else:
            raise RuntimeError(f"sandbox worker {z.index} keeps dying")
        os.set_blocking(req_w, False)
        os.set_blocking(rep_r, False)
        ep = _Episode(eid, z, req_w, rep_r, self.limits.max_frame_bytes)
        self._episodes[eid] = ep
        return ep

    def _inflight_ids(self) -> list[int]:
        return [ep.id for ep in self._inflight.values()] + list(self._ready)

    def _submit_batch(self, reqs: Mapping[int, dict], timeout: float) -> None:
        for e in reqs:
            ep = self._episodes.get(e)
            if ep is None or ep.op is not None or e in self._ready:
                raise ValueError(f"episode {e} is not live or still has a request in flight")
        for e, req in reqs.items():
            ep = self._episodes[e]
            ep.key = e
            self._submit(ep, req, timeout)

    def _submit(self, ep: _Episode, req: dict, timeout: float) -> None:
        left = self.limits.episode_s - ep.used
        ep.op, ep.budget_cut = req["op"], left < timeout
        ep.deadline, ep.mark = time.monotonic() + min(timeout, left), self._polled
        if left <= 0:
            why = f"the episode's wall-time budget of {self.limits.episode_s:g} s is used up"
            self._ready[ep.id] = self._fail(ep, Status.TIMEOUT, f"{req['op']}: {why}")
            return
        try:
            protocol.write_all(ep.wfd, protocol.encode(req), ep.deadline)
        except BrokenPipeError:
            pass  # the child is gone; reading its pipe will say how
        except TimeoutError:
            self._ready[ep.id] = self._fail(ep, Status.TIMEOUT, f"{req['op']}: child did not read its request")
            return
        self._inflight[ep.rfd] = ep
        self._poller.register(ep.rfd, select.POLLIN)

    def _drain(self, ids: Iterable[int]) -> Iterator[Reply]:
        ids = set(ids)
        try:
            while ids:
                replies = self.wait(ids)
                if not replies:
                    break  # nothing of ours is out any more
                for r in replies:
                    ids.discard(r.episode)
                    yield r
        finally:
            self.end_many(ids)  # the caller stopped iterating: abandon what is left

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
        op = ep.op
        # Charged: the time the host spent waiting while this request was out. Time the host
        # spent elsewhere (sampling on the device) is never charged to the episode.
        ep.used += self._polled - ep.mark
        self._settle(ep)
        status, reason, phase, fields = outcomes.from_message(op, msg, self.limits)
        if status is not Status.OK:
            return self._fail(ep, status, reason, phase)
        reply = Reply(ep.key, ep.id, Status.OK, **fields)
        if reply.done:
            self._end(ep)
        return reply

    def _died(self, ep: _Episode) -> Reply:
        op = ep.op
        self._settle(ep)
        return self._reply_error(ep, *outcomes.from_exit(op, self._end(ep, want_status=True), self.limits))

    def _fail(self, ep: _Episode, status: Status, reason: str, phase: str = "") -> Reply:
        self._end(ep)
        return self._reply_error(ep, status, reason, phase)

    @staticmethod
    def _reply_error(ep: _Episode, status: Status, reason: str, phase: str = "") -> Reply:
        return Reply(ep.key, ep.id, status, reason=reason, phase=phase)

    def _settle(self, ep: _Episode) -> None:
        """The request in flight is answered (or given up on): stop watching the pipe."""
        if self._inflight.pop(ep.rfd, None) is not None:
            self._poller.unregister(ep.rfd)
        ep.op = None

    def _end(self, ep: _Episode, want_status: bool = False) -> dict | None:
        if self._episodes.pop(ep.id, None) is None:
            return None
        self._settle(ep)
        os.close(ep.wfd)
        os.close(ep.rfd)
        z = ep.worker
        if not z.tell({"op": "end", "ep": ep.id, "reply": want_status}):
            if self._workers and z is self._workers[z.index]:
                self._restart(z)
            return None
        return z.ended(ep.id) if want_status else None


def _text(s: str) -> str:
    return s if is_text(s) else s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _check_seed(seed) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, not {type(seed).__name__}")
