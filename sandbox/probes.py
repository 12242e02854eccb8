"""What admission sends an environment: reset seeds, probe actions and degenerate policies, drawn
afresh for each environment from a host-side RNG.

A program that knows the validator must not be able to tell validation from training: fixed
seeds (42, 123) let a backdoor open on every other seed, and fixed probe strings let a program
lose on exactly those and win on anything else. So the seeds are drawn from the range training
seeds come from, and the probe and garbage actions are generated, with the fixed lists of
`degenerate_policies` only as part of the mix. The RNG lives in the host (`validate_many` seeds
it from `Options.seed`, or from the OS when that is None); the program sees only what reaches
its reset() and step().
"""

from __future__ import annotations

import dataclasses
import random

SEED_RANGE = 1 << 31  # training seeds are non-negative int32 (selfplay.seeds.derive)

WORDS = ("yes no true false up down left right north south east west red green blue on off open "
         "close swap move add remove start stop next back pass help hint guess answer submit flip "
         "push pull rotate select all none left right top bottom first last inc dec solve").split()
_UNICODE = "\u00e9\u00df\u4e2d\u6587\u0416\u05d0\u0e01\U0001F600\u2603\u00bf\u2211"
_PUNCT = "!?#%&*+-=/<>|~^;:,.'\"`()[]@$"


def degenerate_policies(max_action_chars: int) -> dict[str, list[str]]:
    """The fixed part of each degenerate policy: empty, garbage, very long and "shotgun" actions."""
    long_n = max(16, max_action_chars - 16)
    words = ("yes no true false up down left right north south east west A B C D E "
             "red green blue on off open close left right swap move add remove 0 1 x y")
    return {
        "empty": ["", "\\boxed{}", " ", "\\boxed{ }"],
        "garbage": ["\\boxed{asdf}", "lorem ipsum", "\\boxed{?!#%}", "}{", "\\boxed{None}",
                    "\\boxed{\\boxed{}}", "\\boxed{-1}", "\\boxed{0}", "\\boxed{3.5e300}",
                    "\\boxed{\u00e9\u4e2d\U0001F600}", "\\boxed{[[[}", "\\boxed{zzz}"],
        "long": ["\\boxed{" + ("7 " * long_n)[:long_n] + "}", "\\boxed{" + "a" * long_n + "}",
                 "x" * (long_n + 8)],
        "shotgun": ["\\boxed{" + " ".join(str(i) for i in range(-10, 201)) + "}",
                    "\\boxed{" + ", ".join(words.split()) + "}",
                    "\\boxed{" + ",".join(str(i) for i in range(0, 1000)) + "}",
                    "\\boxed{" + " ".join(f"{a}{b}" for a in "ABCDEFGH" for b in range(1, 9)) + "}"],
    }


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(n))


def _garbage(rng: random.Random) -> str:
    """One generated garbage action: never a small number, which a fair puzzle may accept."""
    kind = rng.randrange(7)
    if kind == 0:
        body = _letters(rng, rng.randint(1, 12))
    elif kind == 1:
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    elif kind == 2:
        body = str(rng.randrange(10**4, 10**12) * rng.choice((1, -1)))
    elif kind == 3:
        body = "".join(rng.choice(_PUNCT) for _ in range(rng.randint(1, 8)))
    elif kind == 4:
        body = "".join(rng.choice(_UNICODE) for _ in range(rng.randint(1, 6)))
    elif kind == 5:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))  # no box at all
    else:
        body = f"{rng.choice(WORDS)} {rng.randrange(10**4, 10**9)}"
    return "\\boxed{" + body + "}"


def _long(rng: random.Random, max_action_chars: int) -> str:
    n = rng.randint(max(16, max_action_chars // 2), max(16, max_action_chars - 16))
    unit = rng.choice([_letters(rng, 1), f"{rng.randrange(10)} ", rng.choice(WORDS) + " "])
    return "\\boxed{" + (unit * n)[:n] + "}" if rng.random() < 0.8 else (unit * (n + 8))[:n + 8]


def _shotgun(rng: random.Random) -> str:
    pool = [str(i) for i in range(-10, 1000)] + WORDS + [f"{a}{b}" for a in "ABCDEFGH" for b in range(1, 9)]
    picks = rng.sample(pool, rng.randint(100, 400))
    return "\\boxed{" + rng.choice((" ", ", ", ",")).join(picks) + "}"


@dataclasses.dataclass(frozen=True)
class Draw:
    """Everything admission sends one environment."""

    first_seed: int
    second_seed: int
    probes: tuple[str, ...]
    policies: dict


def draw(rng: random.Random, max_action_chars: int, steps: int, first_seed: int | None = None,
         second_seed: int | None = None, probes: tuple[str, ...] = ()) -> Draw:
    """Fresh seeds, probe actions and `steps` actions per degenerate policy; given seeds and
    probes (for reproducing a report) are used as they are."""
    s1 = rng.randrange(SEED_RANGE) if first_seed is None else first_seed
    s2 = rng.randrange(SEED_RANGE) if second_seed is None else second_seed
    while s2 == s1 and second_seed is None:
        s2 = rng.randrange(SEED_RANGE)
    if not probes:
        probes = (f"\\boxed{{{rng.randrange(1, 100)}}}", "\\boxed{" + rng.choice(WORDS) + "}",
                  f"\\boxed{{{rng.randrange(100, 10**6)}}}")
    fixed = degenerate_policies(max_action_chars)
    fresh = {"empty": lambda: rng.choice(fixed["empty"]), "garbage": lambda: _garbage(rng),
             "long": lambda: _long(rng, max_action_chars), "shotgun": lambda: _shotgun(rng)}

    def one(name: str) -> str:  # a quarter from the fixed lists, the rest generated
        return rng.choice(fixed[name]) if rng.random() < 0.25 else fresh[name]()

    policies = {name: [one(name)[:max_action_chars] for _ in range(steps)] for name in fixed}
    return Draw(s1, s2, tuple(probes), policies)
