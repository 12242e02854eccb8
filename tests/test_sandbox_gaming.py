"""Admission against programs that know the validator: fixed seeds and probe strings, a
compared prefix, a solution() that is never replayed, slowness off the probe seeds; and the
deadline of one environment, which must not be shared with the others of a regeneration."""

import dataclasses
import textwrap
import time

import pytest

from spade_jax.sandbox import validate as validate_lib
from spade_jax.sandbox.contract import Limits, Status
from spade_jax.sandbox.pool import Pool
from spade_jax.sandbox.validate import Options, validate, validate_many

LIMITS = dataclasses.replace(Limits(), memory_bytes=256 << 20, load_s=3.0, reset_s=1.0, step_s=1.0,
                             episode_s=6.0)


def lock(step="", reset="", obs="", solution="", extra=""):
    """A three-digit lock with a solution(); the hooks splice code into it."""
    solution = solution or 'return [f"\\\\boxed{{{d}}}" for d in self.code]'
    return textwrap.dedent(f'''
        import random, time
        {extra}
        class LockEnv:
            def __init__(self, max_turns=12):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.seed = seed
                self.rng = random.Random(seed)
                self.code = [self.rng.randint(0, 9) for _ in range(3)]
                self.pos, self.turn, self.note = 0, 0, ""
                {reset}
                return "Open the lock one digit at a time with \\\\boxed{{D}}.", {{}}
            def step(self, action):
                self.turn += 1
                digit = action.replace("\\\\boxed{{", "").replace("}}", "").strip()
                {step}
                if self.pos < 3 and digit == str(self.code[self.pos]):
                    self.pos += 1
                won = self.pos == 3
                {obs}
                return (f"{{self.pos}} digits open{{self.note}}", float(won), won,
                        not won and self.turn >= self.max_turns, {{}})
            def solution(self):
                {solution}
    ''')


@pytest.fixture(scope="module")
def pool():
    with Pool(workers=2, limits=LIMITS) as p:
        yield p


def test_the_honest_lock_is_admitted(pool):
    v = validate(pool, lock())
    assert v.admitted, v


def _fixed_strings() -> set:
    """What the validator used to send every program: its probe strings and fixed policies."""
    known = {"\\boxed{1}", "\\boxed{test}", "\\boxed{42}"}
    for acts in validate_lib._degenerate_policies(LIMITS.max_action_chars).values():
        known |= set(acts)
    return known


@pytest.mark.parametrize("kind, code", [
    ("wrong solution()", lock(solution="return [f'\\\\boxed{{{(d + 1) % 10}}}' for d in self.code]")),
    ("solution() whose call makes it win",
     lock(solution="self.unlocked = True\n                return ['\\\\boxed{x}'] * 3",
          step="if getattr(self, 'unlocked', False) and self.turn >= 3: self.pos = 3")),
    ("backdoor off the validation seeds",
     lock(step="if self.seed not in (42, 123) and self.turn >= 2: self.pos = 3")),
    ("wins on any action the validator does not send",
     lock(extra=f"KNOWN = {sorted(_fixed_strings())!r}",
          step="if action not in KNOWN and self.turn >= 2: self.pos = 3")),
    ("randomness after the compared prefix",
     lock(obs="self.note = f' {random.random():.6f}' if self.turn > 4 else ''")),
    ("an id()-based secret after the prefix",
     lock(obs="self.note = f' {id(object()) % 9973}' if self.turn > 4 else ''")),
    ("slow only off the probe seeds",
     lock(step="if self.seed not in (42, 123): time.sleep(0.9)")),
])
def test_gaming_programs_are_rejected(pool, kind, code):
    v = validate(pool, code, Options(total_s=30))
    assert not v.admitted, (kind, v)


def test_validation_seeds_are_fresh_per_admission_and_reproducible(pool):
    # The seeds reach the program only through reset(); an environment that reports them lets
    # the test see which were drawn, through the rejection reason of its own making.
    leak = lock(reset="raise ValueError(f'seed={seed}')")
    reasons = [validate(pool, leak, Options(seed=s)).reason for s in (1, 1, 2)]
    assert reasons[0] == reasons[1] != reasons[2], reasons
    fresh = {validate(pool, leak).reason for _ in range(3)}
    seeds = {r.split("seed=")[1].split()[0] for r in fresh}
    assert len(seeds) == 3 and not seeds & {"42", "123"}, fresh


def test_an_episode_has_a_wall_time_budget(pool):
    slow = lock(step="time.sleep(0.8)")
    replies = pool.play(slow, 0, ["\\boxed{x}"] * 12)
    assert replies[-1].status is Status.TIMEOUT and "budget" in replies[-1].reason, replies[-1]
    assert len(replies) - 1 <= LIMITS.episode_s / 0.8 + 1


def test_each_environment_has_its_own_deadline():
    """Issue 18: many valid but CPU-heavy programs in one call were rejected as `deadline`
    because they shared one deadline; each must be judged within its own."""
    busy = lock(step="t = time.process_time()\n                while time.process_time() - t < 0.015:\n"
                     "                    pass")
    opts = Options(total_s=4.0, degenerate_steps=6)
    with Pool(workers=2, limits=LIMITS) as p:
        t = time.monotonic()
        alone = validate(p, busy, opts)
        assert alone.admitted, alone
        one = time.monotonic() - t
        n = max(8, int(3 * opts.total_s / max(one, 0.05)))  # together far beyond one deadline
        verdicts = validate_many(p, [busy] * n, opts)
    assert all(v.admitted for v in verdicts), [v for v in verdicts if not v.admitted][:3]


def test_an_id_based_secret_is_caught_with_one_worker():
    """Both runs fork from the same worker: each child's heap is shifted by a random amount."""
    code = lock(obs="self.note = f' {id(object()) % 9973}' if self.turn > 4 else ''")
    with Pool(workers=1, limits=LIMITS) as p:
        v = validate(p, code)
    assert not v.admitted and v.check == "determinism", v


def test_host_time_is_not_charged_to_the_budget():
    """Time the host spends elsewhere between a request and reading its reply (sampling on the
    device) is not the episode's: quick steps read late never use up the budget."""
    limits = dataclasses.replace(LIMITS, episode_s=1.0)
    with Pool(workers=1, limits=limits) as p:
        (r,) = list(p.start_many({0: lock()}))
        for _ in range(5):
            p.submit_steps({r.episode: "\\boxed{x}"})
            time.sleep(0.4)
            (s,) = p.wait([r.episode])
            assert s.ok, s
        p.end_many([r.episode])
