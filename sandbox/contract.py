"""The environment contract (docs/method.md §1) as the host sees it: limits, typed outcomes, reply checks.

Everything a child sends is untrusted. The checks here run on the host, on decoded JSON, and turn
each reply into a `Reply` with one of the typed outcomes below. The child never decides the
outcome; it only reports what the environment returned.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re

from .text import is_text


class Status(str, enum.Enum):
    OK = "OK"
    ENV_ERROR = "ENV_ERROR"  # the environment raised
    TIMEOUT = "TIMEOUT"  # a deadline (wall or CPU) passed; the child was SIGKILLed
    CRASHED = "CRASHED"  # the child died on its own (exit, signal)
    OOM = "OOM"  # the address-space limit was hit
    OUTPUT_TOO_LARGE = "OUTPUT_TOO_LARGE"
    INVALID_RETURN = "INVALID_RETURN"  # wrong types, arity, range, non-JSON info
    PROTOCOL_ERROR = "PROTOCOL_ERROR"  # the child spoke out of turn or sent garbage


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-episode resource limits and deadlines. Every number here is a knob, none is implied."""

    memory_bytes: int = 1 << 30  # RLIMIT_AS of each episode's child
    cpu_seconds: int = 60  # RLIMIT_CPU of each episode's child (whole episode)
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE
    open_files: int = 64  # RLIMIT_NOFILE
    # Each episode's own tmpfs (its temp dir), where the kernel allows one: bytes and files. Its
    # pages are memory the address-space limit does not see; these caps bound them.
    tmpfs_bytes: int = 64 << 20
    tmpfs_inodes: int = 1024
    max_tasks: int = 64  # processes + threads of one episode (RLIMIT_NPROC under its own uid)
    load_s: float = 10.0  # compile + exec + instantiate + first reset
    reset_s: float = 5.0
    step_s: float = 5.0
    # Wall time one episode may keep the host waiting, all its requests together (time the host
    # spends elsewhere is not counted): many steps each just under step_s add up to this.
    episode_s: float = 30.0
    max_code_chars: int = 200_000
    max_action_chars: int = 8192
    max_observation_chars: int = 32768
    max_info_bytes: int = 65536
    max_frame_bytes: int = 1 << 20
    reward_bound: float = 10.0
    max_turns: int = 25  # passed as max_turns= when the class cannot be built without arguments


@dataclasses.dataclass(frozen=True)
class Reply:
    """One checked answer from an episode. `key` is the caller's key (the episode id for steps)."""

    key: object
    episode: int
    status: Status
    reason: str = ""
    observation: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict = dataclasses.field(default_factory=dict)
    solution: list | None = None  # only when asked for at start and the env defines solution()
    phase: str = ""  # on a failed start: compile, class, init, reset or solution

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def done(self) -> bool:
        """The episode is over: finished by the environment or ended by an error."""
        return self.status is not Status.OK or self.terminated or self.truncated

    def transcript_entry(self) -> dict:
        return {"status": self.status.value, "observation": self.observation, "reward": self.reward,
                "terminated": self.terminated, "truncated": self.truncated, "info": self.info}


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The first fenced python block of the designer's output, else the whole text (docs/method.md §1)."""
    m = _FENCE.search(text)
    return m.group(1) if m else text


class Invalid(Exception):
    def __init__(self, status: Status, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _json_size(x, budget: int, depth: int = 0) -> int:
    """Size of decoded JSON data in characters, bounded; raises Invalid past the budget or depth,
    and for a string that is not text or a number that is not finite (a forged frame can carry
    either; the child's own encoder marks them)."""
    if depth > 32:
        raise Invalid(Status.INVALID_RETURN, "info is nested too deeply")
    if isinstance(x, str):
        if not is_text(x):
            raise Invalid(Status.INVALID_RETURN, "info holds a string with a lone surrogate (not UTF-8 text)")
        n = len(x) + 2
    elif isinstance(x, float) and not math.isfinite(x):
        raise Invalid(Status.INVALID_RETURN, f"info holds the non-finite number {x!r}")
    elif isinstance(x, dict):
        n = 2 + sum(_json_size(k, budget, depth + 1) + _json_size(v, budget, depth + 1) for k, v in x.items())
    elif isinstance(x, list):
        n = 2 + sum(_json_size(v, budget, depth + 1) for v in x)
    else:
        n = 8
    if n > budget:
        raise Invalid(Status.OUTPUT_TOO_LARGE, f"info over {budget} bytes")
    return n


def _observation(obs, limits: Limits) -> str:
    if not isinstance(obs, str):
        raise Invalid(Status.INVALID_RETURN, f"observation is {_kind(obs)}, not str")
    if len(obs) > limits.max_observation_chars:
        raise Invalid(Status.OUTPUT_TOO_LARGE, f"observation of {len(obs)} chars over {limits.max_observation_chars}")
    if not is_text(obs):
        raise Invalid(Status.INVALID_RETURN, "observation has a lone surrogate (not UTF-8 text)")
    return obs


def _info(info, limits: Limits) -> dict:
    if not isinstance(info, dict):
        raise Invalid(Status.INVALID_RETURN, f"info is {_kind(info)}, not dict")
    _json_size(info, limits.max_info_bytes)
    return info


def _kind(x) -> str:
    # The child marks values JSON cannot carry as {"$unjson": "typename"}; name them in reasons.
    if isinstance(x, dict) and set(x) == {"$unjson"}:
        return str(x["$unjson"])[:40]
    return {str: "str", bool: "bool", int: "int", float: "float", list: "tuple/list",
            dict: "dict", type(None): "None"}.get(type(x), type(x).__name__)


def _has_unjson(x, depth: int = 0) -> bool:
    if depth > 32:
        return True
    if isinstance(x, dict):
        return "$unjson" in x or any(_has_unjson(v, depth + 1) for v in x.values())
    if isinstance(x, list):
        return any(_has_unjson(v, depth + 1) for v in x)
    return False


def check_reset(ret, limits: Limits) -> tuple[str, dict]:
    """reset(seed) must return (non-empty str, dict of JSON data)."""
    if not isinstance(ret, list) or len(ret) != 2:
        raise Invalid(Status.INVALID_RETURN, f"reset returned {_arity(ret)}, expected (observation, info)")
    obs, info = _observation(ret[0], limits), _info(ret[1], limits)
    if not obs.strip():
        raise Invalid(Status.INVALID_RETURN, "reset returned an empty observation")
    if _has_unjson(info):
        raise Invalid(Status.INVALID_RETURN, "info is not JSON data")
    return obs, info


def check_step(ret, limits: Limits) -> tuple[str, float, bool, bool, dict]:
    """step(action) must return (str, finite real reward in range, bool, bool, dict of JSON data)."""
    if not isinstance(ret, list) or len(ret) != 5:
        raise Invalid(Status.INVALID_RETURN, f"step returned {_arity(ret)}, expected a 5-tuple")
    obs, reward, term, trunc, info = ret
    obs = _observation(obs, limits)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise Invalid(Status.INVALID_RETURN, f"reward is {_kind(reward)}, not a real number")
    reward = float(reward)  # ints beyond float range raise OverflowError: caught by the caller
    if not math.isfinite(reward) or abs(reward) > limits.reward_bound:
        raise Invalid(Status.INVALID_RETURN, f"reward {reward!r} outside [-{limits.reward_bound}, {limits.reward_bound}]")
    for name, flag in (("terminated", term), ("truncated", trunc)):
        if not isinstance(flag, bool):
            raise Invalid(Status.INVALID_RETURN, f"{name} is {_kind(flag)}, not bool")
    info = _info(info, limits)
    if _has_unjson(info):
        raise Invalid(Status.INVALID_RETURN, "info is not JSON data")
    return obs, reward, term, trunc, info


def check_solution(sol, limits: Limits) -> list | None:
    if sol is None:
        return None
    if not isinstance(sol, list) or len(sol) > 1000 or not all(isinstance(a, str) for a in sol):
        raise Invalid(Status.INVALID_RETURN, "solution() must return a list of str")
    if not all(is_text(a) for a in sol):
        raise Invalid(Status.INVALID_RETURN, "solution() returned a string with a lone surrogate")
    if any(len(a) > limits.max_action_chars for a in sol):
        raise Invalid(Status.OUTPUT_TOO_LARGE, "solution() action over the action cap")
    return sol


def _arity(ret) -> str:
    if isinstance(ret, list):
        return f"a {len(ret)}-tuple"
    return _kind(ret)
