"""Console progress for the self-play loop: phase lines, counted bars, heartbeats and the ETA.

A run spends minutes inside single calls (an XLA compile, a sampler call decoding thousands of
tokens, a learner step), so every phase says when it starts, and while it is open a background
timer prints `still <phase> (N s)` whenever nothing else was printed for `heartbeat_s`. Counted
work (episodes, programs) is a tqdm bar on a terminal; elsewhere (CI logs, files) it is a plain
line at most every `interval_s` plus a final line, never a stream of carriage returns.

Everything here reads host-side counters the loop already has: it adds no device sync and
changes no result. `Progress(quiet=True)` prints nothing (what library callers get by default);
`Progress(log=fn)` sends every line to `fn` (tests, and callers with their own logger).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator, Sequence


class Phase:
  """An open phase: its name, counts (when counted) and a note for its final line."""

  def __init__(self, owner: "Progress", name: str, total: int | None, unit: str):
    self.owner, self.name, self.total, self.unit = owner, name, total, unit
    self.done = 0
    self.note = ""
    self.t0 = owner.clock()
    self._last_line = self.t0
    self.bar = None  # tqdm, on a terminal

  def elapsed(self) -> float:
    return self.owner.clock() - self.t0

  def counts(self) -> str:
    return f"{self.done}/{self.total} {self.unit}".rstrip() if self.total is not None else ""

  def update(self, n: int = 1) -> None:
    """Counts n more units done; prints a line when the last one is `interval_s` old."""
    if self.owner.quiet or n <= 0:
      return
    self.done += n
    if self.bar is not None:
      self.bar.update(n)
      self.owner.touch()
      return
    now = self.owner.clock()
    if now - self._last_line >= self.owner.interval_s and self.done < (self.total or 0):
      self._last_line = now
      self.owner.line(f"  {self.name}: {self.counts()} ({now - self.t0:.0f} s)")


class Progress:
  """Where progress lines go, and the phases open now (innermost last)."""

  def __init__(self, log: Callable[[str], None] | None = None, *, stream=None,
               quiet: bool = False, tty: bool | None = None, interval_s: float = 10.0,
               heartbeat_s: float = 25.0, clock: Callable[[], float] = time.monotonic):
    self._log = log
    self._stream = stream
    self.quiet = quiet
    self.tty = (log is None and _isatty(self.stream)) if tty is None else tty
    self.interval_s, self.heartbeat_s, self.clock = interval_s, heartbeat_s, clock
    self._lock = threading.RLock()
    self._open: list[Phase] = []
    self._seen: set[str] = set()
    self._last_out = clock()

  @property
  def stream(self):
    # Looked up at call time, so a redirected sys.stderr (pytest's capture) is honoured.
    return self._stream if self._stream is not None else sys.stderr

  def touch(self) -> None:
    self._last_out = self.clock()

  def line(self, msg: str) -> None:
    if self.quiet:
      return
    with self._lock:
      self.touch()
      if self._log is not None:
        self._log(msg)
      elif self.tty:
        from tqdm import tqdm
        tqdm.write(msg, file=self.stream)  # above any open bar, not through it
      else:
        self.stream.write(msg + "\n")
        self.stream.flush()

  @contextlib.contextmanager
  def phase(self, name: str, detail: str = "", total: int | None = None,
            unit: str = "") -> Iterator[Phase]:
    """Prints `name: detail ...` now, heartbeats while open, a final line when it ends (with the
    counts and `phase.note` when set; uncounted phases under a second end silently)."""
    ph = Phase(self, name, total, unit)
    if self.quiet:
      yield ph
      return
    head = f"{name}: {detail}" if detail else name
    if total is not None and self.tty:
      from tqdm import tqdm
      self.line(head + " ...")
      ph.bar = tqdm(total=total, desc=f"  {name}", unit=f" {unit}" if unit else "it",
                    file=self.stream, leave=False, dynamic_ncols=True)
    else:
      self.line(head + (f" ({ph.counts()})" if total is not None else "") + " ...")
    stop = threading.Event()
    beat = threading.Thread(target=self._heartbeat, args=(ph, stop), daemon=True)
    with self._lock:
      self._open.append(ph)
    beat.start()
    failed = True
    try:
      yield ph
      failed = False
    finally:
      stop.set()
      beat.join()
      with self._lock:
        self._open.remove(ph)
      if ph.bar is not None:
        ph.bar.close()
      took = ph.elapsed()
      if failed:
        self.line(f"  {name}: failed after {took:.0f} s")
      elif total is not None or ph.note or took >= 1.0:
        tail = ", ".join(x for x in (ph.counts(), f"{took:.0f} s", ph.note) if x)
        self.line(f"  {name}: done ({tail})")

  def _heartbeat(self, ph: Phase, stop: threading.Event) -> None:
    wait = self.heartbeat_s
    while not stop.wait(wait):
      with self._lock:
        innermost = bool(self._open) and self._open[-1] is ph
        quiet_for = self.clock() - self._last_out
        if innermost and quiet_for >= self.heartbeat_s:
          if ph.bar is not None:
            ph.bar.refresh()  # the bar's elapsed time moves; no extra line on a terminal
            self.touch()
          else:
            counts = f", {ph.counts()}" if ph.total is not None else ""
            self.line(f"  still {ph.name} ({ph.elapsed():.0f} s{counts})")
          quiet_for = 0.0
      # Wake when the silence would reach heartbeat_s (an inner phase's lines count as output).
      wait = max(0.01, self.heartbeat_s - quiet_for) if innermost else self.heartbeat_s

  def compiling(self, kind: str, detail: str = ""):
    """A phase around the first call of `kind` in this run, which is where XLA compiles it;
    later calls get no phase (a new shape may still compile: the enclosing phase heartbeats)."""
    if self.quiet or kind in self._seen:
      return contextlib.nullcontext()
    self._seen.add(kind)
    return self.phase(f"compiling {kind}", detail or "first call, XLA compiles it")


def quiet() -> Progress:
  return Progress(quiet=True)


def _isatty(stream) -> bool:
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):
    return False


def eta_s(done: Sequence[tuple[bool, float]], remaining: Sequence[bool]) -> float | None:
  """Seconds left: each remaining step (True = a regeneration step) at the mean time of this
  process's steps of its kind so far, without the first of each kind once there are later ones
  (it paid for compiles); a kind not seen yet takes the mean of all. None before any step."""
  if not done:
    return None
  per_kind: dict[bool, list[float]] = {}
  for regen, secs in done:
    per_kind.setdefault(regen, []).append(secs)
  means = {k: sum(v[1:] or v) / len(v[1:] or v) for k, v in per_kind.items()}
  overall = sum(s for _, s in done) / len(done)
  return sum(means.get(r, overall) for r in remaining)


def step_line(t: int, total_steps: int, row: dict, eta: float | None) -> str:
  """One line with the step's figures; begins with `step {t + 1}/{total_steps}`."""
  g = row.get
  num = lambda k, f: format(g(k), f) if isinstance(g(k), (int, float)) else "-"  # noqa: E731
  parts = [f"step {t + 1}/{total_steps}", f"return {num('agent_return_mean', '+.3f')}",
           f"win {num('agent_win_rate', '.2f')}"]
  if "designer_attempts" in row:
    parts.append(f"admitted {g('designer_admitted')}/{g('designer_attempts')}")
  if "learner_skipped" in row:
    parts.append(f"learner skipped ({g('learner_skipped')})")
  else:
    clip = (g("clip_frac_low") or 0.0) + (g("clip_frac_high") or 0.0)
    parts += [f"loss {num('loss', '+.4f')}", f"clip {clip:.3f}"]
  split = time_split(row)
  parts.append(f"{g('time_total_s', 0.0):.0f} s (" +
               " ".join(f"{k} {v:.0f}" for k, v in split.items() if v >= 0.5) + ")")
  parts.append("eta " + ("-" if eta is None else f"{eta / 60:.1f} min"))
  return "  ".join(parts)


TIME_PARTS = (("sampling", "time_sample_s"), ("env wait", "time_env_wait_s"),
              ("learner", "time_learner_s"), ("regen", "time_regen_s"))


def time_split(row: dict) -> dict[str, float]:
  """The step's wall time in disjoint parts: agent sampling, sandbox waits, learner, regeneration
  (designer sampling, admission, hints) and the rest."""
  out = {name: float(row.get(key) or 0.0) for name, key in TIME_PARTS}
  out["other"] = max(0.0, float(row.get("time_total_s") or 0.0) - sum(out.values()))
  return out
