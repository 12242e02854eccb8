"""Run whole programs (a completion plus its tests) in the pool and report pass / fail.

Benchmarks execute model-written code the same way the self-play loop executes environments:
in a hardened episode child of a `Pool`, never in the host. Each program is wrapped in a small
environment module whose `reset()` runs it, so it gets the pool's limits (rlimits, seccomp,
Landlock, deadline with SIGKILL) without a second execution path. A program passes when it
runs to the end without raising (tests are asserts) and, if `expected_stdout` is given, prints
exactly that (trailing whitespace of each line and trailing blank lines ignored). `stdin` is
fed to `input()` / `sys.stdin` (text and `.buffer`). `SystemExit` with code 0 or None is a
normal end.

The verdict is reported by the child, so a program written to attack its own grader (for
example by writing a forged reply to the pipe) could fake a pass; what the pool guarantees is
that nothing it does reaches the host. That matches how benchmark harnesses grade.
"""

from __future__ import annotations

import dataclasses
from typing import Hashable, Mapping

from .pool import Pool, Start

_WRAPPER = '''
import io as _io
import sys as _sys

_PROGRAM = {program!r}
_STDIN = {stdin!r}
_EXPECTED = {expected!r}


def _norm(text):
    return "\\n".join(line.rstrip() for line in text.rstrip().splitlines())


class ProgramRunEnv:
    def reset(self, seed=None):
        code = compile(_PROGRAM, "<program>", "exec")
        out = _io.TextIOWrapper(_io.BytesIO(), encoding="utf-8")
        _sys.stdin = _io.TextIOWrapper(_io.BytesIO((_STDIN or "").encode()), encoding="utf-8")
        _sys.stdout = out
        try:
            exec(code, {{"__name__": "__main__", "__builtins__": __builtins__}})
        except SystemExit as e:
            if e.code not in (None, 0):
                raise RuntimeError(f"exit code {{e.code!r}}") from None
        finally:
            _sys.stdout = _sys.__stdout__
        if _EXPECTED is not None:
            out.flush()
            got = out.buffer.getvalue().decode("utf-8", "replace")
            if _norm(got) != _norm(_EXPECTED):
                raise AssertionError("wrong output: " + repr(got[:200]))
        return "passed", {{}}

    def step(self, action):
        return "", 0.0, True, False, {{}}
'''


@dataclasses.dataclass(frozen=True)
class Program:
    code: str
    stdin: str | None = None
    expected_stdout: str | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    passed: bool
    status: str  # the pool's outcome: OK, ENV_ERROR (raised / failed a test), TIMEOUT, OOM, ...
    reason: str = ""


def wrap(program: Program) -> str:
    """The environment module that runs `program` in its reset()."""
    return _WRAPPER.format(program=program.code, stdin=program.stdin,
                           expected=program.expected_stdout)


def run_programs(pool: Pool, programs: Mapping[Hashable, Program | str],
                 timeout: float = 10.0) -> dict[Hashable, Verdict]:
    """Runs every program (all submitted at once; the pool's workers run them in parallel)."""
    starts, out = {}, {}
    for key, prog in programs.items():
        prog = Program(prog) if isinstance(prog, str) else prog
        code = wrap(prog)
        if len(code) > pool.limits.max_code_chars:
            out[key] = Verdict(False, "INVALID_PROGRAM", "program over the size limit")
            continue
        starts[key] = Start(code)
    live = []
    try:
        for reply in pool.start_many(starts, timeout):
            if reply.ok:
                live.append(reply.episode)
            passed = reply.ok and reply.observation == "passed"
            out[reply.key] = Verdict(passed, reply.status.value, reply.reason[:500])
    finally:
        pool.end_many(live)
    for key in starts:  # a start the pool never answered (it stopped early) did not pass
        out.setdefault(key, Verdict(False, "NO_REPLY", "no reply from the sandbox"))
    return out
