"""Pattern_Recognition: spot the number that does not share the others' property."""

import math
import random

PROPERTIES = [
    ("even", lambda n: n % 2 == 0),
    ("odd", lambda n: n % 2 == 1),
    ("multiples of 3", lambda n: n % 3 == 0),
    ("multiples of 5", lambda n: n % 5 == 0),
    ("perfect squares", lambda n: math.isqrt(n) ** 2 == n),
    ("primes", lambda n: n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))),
]


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


class OddOneOutEnv:
    """Three rounds of five numbers: four share a property (even, odd, multiples of 3 or 5,
    perfect squares, primes) and one does not. Name the odd one out with \\boxed{N}."""

    ROUNDS = 3

    def __init__(self, max_turns=6):
        self.max_turns = max_turns

    def _round(self, rng):
        while True:
            name, test = rng.choice(PROPERTIES)
            yes = [n for n in range(2, 100) if test(n)]
            no = [n for n in range(2, 100) if not test(n)]
            items = rng.sample(yes, 4) + [rng.choice(no)]
            odd = items[-1]
            rng.shuffle(items)
            picks = set()
            for _, t in PROPERTIES:
                inside = [n for n in items if t(n)]
                if len(inside) == 4:
                    picks.add(next(n for n in items if not t(n)))
                elif len(inside) == 1:
                    picks.add(inside[0])
            if picks == {odd}:
                return items, odd, name

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:  # not one answer for every round, so repeating it does not win
            self.rounds = [self._round(rng) for _ in range(self.ROUNDS)]
            if len({odd for _, odd, _ in self.rounds}) > 1:
                break
        self.round, self.turn = 0, 0
        obs = ("Three rounds. In each, four of the five numbers share a property and one does not. "
               "Name the odd one out inside \\boxed{...}, e.g. \\boxed{12}.\n"
               f"{self._render()}\nYou have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        return f"Round {self.round + 1}: {', '.join(map(str, self.rounds[self.round][0]))}"

    def step(self, action):
        self.turn += 1
        text = _boxed(action).strip(" .")
        reward, done = 0.0, False
        items, odd, name = self.rounds[self.round]
        if not text.isdigit() or len(text) > 3 or int(text) not in items:
            msg = "Name one of the five numbers."
        elif int(text) != odd:
            msg = f"No, {text} is not the odd one out."
        else:
            self.round += 1
            msg = f"Yes: the other four are {name}."
            if self.round == self.ROUNDS:
                msg, reward, done = msg + " All rounds solved!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        if not done:
            msg += "\n" + self._render()
        obs = f"{msg}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{odd}}}" for _, odd, _ in self.rounds[self.round:]]
