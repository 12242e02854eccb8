"""From what a child sent (or how it ended) to a typed outcome; pure functions, host side.

`from_message` checks a reply frame (contract.py does the per-field checks) and returns the
outcome with the fields of a `Reply`; `from_exit` names why a child that closed its pipe is
gone, from its exit status as its worker reported it. Reasons that carry an environment's own
text (its error messages) are cleaned: no lone surrogates, no control characters.
"""

from __future__ import annotations

import signal

from .contract import Invalid, Limits, Status, check_reset, check_solution, check_step
from .text import clean

_CHILD_ERRORS = {s.value for s in (Status.ENV_ERROR, Status.OOM, Status.OUTPUT_TOO_LARGE,
                                   Status.INVALID_RETURN, Status.PROTOCOL_ERROR)}


def from_message(op: str, msg, limits: Limits) -> tuple[Status, str, str, dict]:
    """(status, reason, phase, fields): `fields` are the Reply's data when the status is OK."""
    if not isinstance(msg, dict):
        return Status.PROTOCOL_ERROR, "reply is not an object", "", {}
    if "err" in msg:
        err, reason = msg.get("err"), msg.get("reason")
        if err not in _CHILD_ERRORS or not isinstance(reason, str):
            return Status.PROTOCOL_ERROR, "malformed error reply", "", {}
        phase = msg.get("phase") if op == "start" and isinstance(msg.get("phase"), str) else ""
        return Status(err), f"{op}: {clean(reason[:500])}", clean(phase[:20]), {}
    phase = "reset" if op == "start" else ""
    try:
        if op in ("start", "reset"):
            obs, info = check_reset(msg.get("ret"), limits)
            phase = "solution" if op == "start" else ""
            sol = check_solution(msg.get("solution"), limits) if op == "start" else None
            return Status.OK, "", "", {"observation": obs, "info": info, "solution": sol}
        obs, reward, term, trunc, info = check_step(msg.get("ret"), limits)
    except Invalid as e:
        return e.status, f"{op}: {e.reason}", phase, {}
    except (OverflowError, TypeError, ValueError) as e:
        return Status.INVALID_RETURN, f"{op}: {e}", phase, {}
    return Status.OK, "", "", {"observation": obs, "reward": reward, "terminated": term,
                               "truncated": trunc, "info": info}


def from_exit(op: str, st: dict | None, limits: Limits) -> tuple[Status, str]:
    """Why a child is gone, from the exit report of its worker (None: the worker died too)."""
    if st is None:
        return Status.CRASHED, f"{op}: the worker died"
    if st.get("note"):
        return Status.CRASHED, f"{op}: {str(st['note'])[:200]}"
    sig, code = st.get("signal"), st.get("code")
    if st.get("oom"):
        return Status.OOM, f"{op}: over its cgroup's memory limit; killed"
    if sig in (signal.SIGKILL, signal.SIGXCPU) and st.get("cpu_s", 0) >= limits.cpu_seconds - 0.5:
        return Status.TIMEOUT, f"{op}: CPU time limit reached"
    if sig is not None and st.get("maxrss_kb", 0) * 1024 > 0.8 * limits.memory_bytes:
        return Status.OOM, f"{op}: killed by signal {sig} near the memory limit"
    what = f"killed by signal {signal.Signals(sig).name}" if sig else f"exited with code {code}"
    return Status.CRASHED, f"{op}: the environment process {what}"
