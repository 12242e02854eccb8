"""Mathematical_Reasoning: factor a number completely, one prime at a time.

Level L: the number is a product of L + 1 primes (repeats allowed, at most 16; at least two
different) drawn from the first L + 2 primes (at most 15): level 1 multiplies two different
ones of 2, 3, 5; level 10 eleven of the primes up to 37. A winning play names every prime
factor once per occurrence (L + 1 turns).
"""

import random

LEVEL = 1
PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]


def _boxed(text):
    """Content of the last \\boxed{...} (nested braces allowed), else the whole text."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return text.strip()
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return text[i:].strip()


class PrimeFactorsEnv:
    """A number N is shown. Each turn name one prime p that divides the current number; it is
    divided by p. Reach 1 to win. Composite divisors and non-divisors are refused."""

    def __init__(self, max_turns=None):
        self.n_factors = min(LEVEL + 1, 16)
        self.primes = PRIMES[:min(LEVEL + 2, len(PRIMES))]
        self.max_turns = max_turns or min(25, self.n_factors + 4)

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:  # two different primes at least: repeating one prime never wins
            factors = [rng.choice(self.primes) for _ in range(self.n_factors)]
            if len(set(factors)) > 1:
                break
        self.number = 1
        for p in factors:
            self.number *= p
        self.value, self.found, self.turn = self.number, [], 0
        obs = (f"Factor N = {self.number} into primes.\n"
               "Each turn, name one prime that divides the current number, e.g. \\boxed{2}; the "
               "number is divided by it. Repeated factors are named once per occurrence. "
               f"Reduce the number to 1 to win. You have {self.max_turns} turns.")
        return obs, {"turn": 0, "value": self.value}

    def step(self, action):
        self.turn += 1
        text = _boxed(action).replace(" ", "")
        reward, done = 0.0, False
        if not text.isdigit() or len(text) > 30:
            msg = "Give a single prime number, e.g. \\boxed{3}."
        else:
            p = int(text)
            if p < 2 or self.value % p != 0:
                msg = f"{p} does not divide {self.value} (or is not a prime)."
            elif p not in PRIMES:
                msg = f"{p} divides {self.value} but is not prime; name prime factors only."
            else:
                self.value //= p
                self.found.append(p)
                msg = f"{p} divides it: the number is now {self.value}."
                if self.value == 1:
                    msg, reward, done = msg + " Fully factored!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        shown = " x ".join(str(p) for p in self.found) or "none yet"
        obs = (f"{msg}\nN = {self.number}; factors found: {shown}; remaining: {self.value}.\n"
               f"Turn {self.turn}/{self.max_turns}.")
        return obs, reward, done, truncated, {"turn": self.turn, "value": self.value}

    def solution(self):
        rest, out = self.value, []
        for p in PRIMES:
            while rest % p == 0:
                rest //= p
                out.append(f"\\boxed{{{p}}}")
        return out
