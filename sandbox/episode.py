"""The episode child's side of the protocol: load the environment, answer reset and step.

Runs in a hardened child (harden.py) and is the only code that touches untrusted objects.
What the environment returns is copied into plain JSON data (`_plain`), with what JSON cannot
carry marked for the host to name; the host checks everything again and decides the outcome.
"""

from __future__ import annotations

import math
import os
import random
import traceback

from . import protocol
from .text import clean, is_text

REQ_FD, REP_FD = 3, 4


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
        x = str(x)
        return x if is_text(x) else {"$unjson": "str with a lone surrogate"}
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
        if all(type(k) is str and is_text(k) for k in x):
            return {_plain(k, budget, depth + 1): _plain(v, budget, depth + 1) for k, v in x.items()}
        return {"$unjson": "dict with keys that are not text"}
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
    return clean(f"{type(e).__name__}: {msg[:300]}{line}")


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


def _shift_heap() -> list:
    """Allocations of random number in every small-object size class, kept alive for the
    episode: two episodes forked from one worker would otherwise lay out their objects alike,
    and an id()-based "secret" would look deterministic to validation."""
    r, k = random.randrange, random.randbytes(32)
    pad = [object() for _ in range(r(1, 128))] + [float(i) for i in range(r(1, 128))]
    for j, n in enumerate(range(1, 480, 16)):
        pad += [bytes(n + k[j] // 16) for _ in range(1 + k[j] % 12)]
    pad.append(bytearray(r(1, 1 << 17)))
    return pad


def serve_episode(cap: int) -> None:
    """Answer requests until the host goes away. Runs in the hardened child."""
    # Every episode starts from fresh entropy: unseeded randomness shows up as nondeterminism in
    # validation, whichever worker runs the two transcripts.
    random.seed()
    state: dict = {"pad": _shift_heap()}
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

