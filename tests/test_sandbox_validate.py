"""Admission: the starters pass, broken or gameable environments are rejected with the right
check, and the command line judges every file even when some are hostile."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from spade_jax.sandbox import starters
from spade_jax.sandbox.contract import Limits
from spade_jax.sandbox.pool import Pool
from spade_jax.sandbox.validate import Options, rejection_stats, validate, validate_many

LIMITS = dataclasses.replace(Limits(), memory_bytes=256 << 20, load_s=3.0, reset_s=1.0, step_s=1.0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(starters.DIR)))

GOOD = starters.code("remainder_oracle.py")


def variant(reset="", step="", extra="", tag="0"):
    """A small environment; the hooks splice code into reset/step to make it misbehave."""
    return textwrap.dedent(f'''
        import random, time
        {extra}
        class LockEnv:
            def __init__(self, max_turns=10):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.rng = random.Random(seed)
                self.code = [self.rng.randint(0, 9) for _ in range(3)]
                self.pos, self.turn = 0, 0
                {reset}
                return f"Open lock #{{{tag}}} one digit at a time with \\\\boxed{{{{D}}}}.", {{}}
            def step(self, action):
                self.turn += 1
                digit = action.replace("\\\\boxed{{", "").replace("}}", "").strip()
                {step}
                if self.pos < 3 and digit == str(self.code[self.pos]):
                    self.pos += 1
                won = self.pos == 3
                return f"{{self.pos}} digits open", float(won), won, not won and self.turn >= self.max_turns, {{}}
    ''')


@pytest.fixture(scope="module")
def pool():
    with Pool(workers=2, limits=LIMITS) as p:
        yield p


def test_starters_cover_every_skill_twice():
    for skill in starters.SKILLS:
        assert len(starters.by_skill(skill)) >= 2, skill
    assert set(starters.STARTERS) == {f for f in os.listdir(starters.DIR) if f.endswith(".py") and f[0] != "_"}


def test_starters_are_admitted_and_their_solutions_win(pool):
    names = sorted(starters.STARTERS)
    verdicts = validate_many(pool, [starters.code(n) for n in names])
    assert all(v.admitted for v in verdicts), [(n, v) for n, v in zip(names, verdicts) if not v.admitted]
    for n in names:
        for seed in (0, 1, 2):
            (first,) = list(pool.start_many({0: __import__("spade_jax.sandbox.pool").sandbox.pool.Start(starters.code(n), seed, solution=True)}))
            pool.end_many([first.episode])
            replies = pool.play(starters.code(n), seed, first.solution)
            assert replies[-1].terminated and replies[-1].reward == 1.0, (n, seed)
            assert len(replies) - 1 >= 3, f"{n} is won in fewer than three steps"
            assert all(0.0 <= r.reward <= 1.0 for r in replies)
            assert "\\boxed" in replies[0].observation


def test_plain_lock_is_admitted(pool):
    v = validate(pool, "Here is my environment:\n```python\n" + variant() + "```\nEnjoy!")
    assert v.admitted, v


@pytest.mark.parametrize("kind, code, check", [
    ("no code", "", "code"),
    ("syntax", "class Broken(:\n", "compile"),
    ("no class", "x = 1\n", "class"),
    ("reset raises", variant(reset="raise RuntimeError('boom')"), "reset"),
    ("step raises on text", variant(step="int(digit)"), "probe_step"),
    ("unseeded randomness", variant(tag="random.randint(0, 10**9)"), "determinism"),
    # The wall clock in the first observation: two runs never print the same nanosecond.
    ("clock dependence", variant(tag="time.time_ns()"), "determinism"),
    ("any action wins", variant(step="self.pos = min(3, self.pos + 1)"), "empty_wins"),
    ("one step wins", variant(step="self.pos = 3 if digit else self.pos"), "one_step_win"),
    ("long actions win", variant(step="self.longs = getattr(self, 'longs', 0) + (len(digit) > 100)\n"
                                      "                self.pos = 3 if self.longs >= 2 else self.pos"), "long_wins"),
    ("shotgun wins", variant(step="self.hits = getattr(self, 'hits', 0) + (set('0123456789') <= set(digit))\n"
                                  "                self.pos = 3 if self.hits >= 2 else self.pos"), "shotgun_wins"),
    ("loops on long input", variant(step="while len(action) > 1000:\n                    pass"),
     "long_probe"),
])
def test_rejections(pool, kind, code, check):
    v = validate(pool, code, Options(total_s=20))
    assert not v.admitted and v.check == check, (kind, v)
    assert v.reason or check == "code"


def test_rejection_stats_aggregate(pool):
    verdicts = validate_many(pool, [variant(), "", "x = 1\n", variant()])
    stats = rejection_stats(verdicts)
    assert stats["n"] == 4 and stats["admitted"] == 2 and stats["admission_rate"] == 0.5
    assert stats["by_check"] == {"code": 1, "class": 1}
    assert stats["by_status"] == {"OK": 1, "ENV_ERROR": 1}


def test_whole_validation_has_a_deadline(pool):
    slow = variant(step="time.sleep(0.3)")
    v = validate(pool, slow, Options(total_s=1.0))
    assert not v.admitted and v.check == "deadline" and v.seconds < 3


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "spade_jax.sandbox", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_validate_judges_every_file(tmp_path):
    files = {"good.py": variant(), "loop.py": "while True:\n    pass\n",
             "bomb.py": variant(reset="x = bytearray(1 << 40)"), "wins.py": variant(step="self.pos = 3")}
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    paths = [str(tmp_path / n) for n in files] + [str(tmp_path / "missing.py")]
    out = _cli("validate", *paths, "--json", "--timeout", "1", "--memory-mb", "256")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["file"] for r in rows] == paths, out.stderr
    by = {os.path.basename(r["file"]): r for r in rows}
    assert by["good.py"]["admitted"] is True
    assert (by["loop.py"]["admitted"], by["loop.py"]["status"]) == (False, "TIMEOUT")
    assert (by["bomb.py"]["admitted"], by["bomb.py"]["status"]) == (False, "OOM")
    assert (by["wins.py"]["admitted"], by["wins.py"]["check"]) == (False, "one_step_win")
    assert (by["missing.py"]["admitted"], by["missing.py"]["check"]) == (False, "code")
    assert out.returncode == 1


def test_cli_play_prints_the_transcript():
    path = starters.path("target_number.py")
    out = _cli("play", path, "--seed", "3", "--solution", "--json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert out.returncode == 0, out.stderr
    assert rows[0]["turn"] == 0 and "\\boxed" in rows[0]["observation"]
    assert rows[-1]["terminated"] is True and rows[-1]["reward"] == 1.0
    out = _cli("play", path, "--seed", "3", "--actions", "\\boxed{+1000}", "garbage")
    assert out.returncode == 0 and "reward=0" in out.stdout and "not an allowed move" in out.stdout
