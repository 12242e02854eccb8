"""Logical_Deduction: find the one heavier coin with a balance scale."""

import random


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


class WeighCoinsEnv:
    """Eight coins look alike; one is heavier. \\boxed{weigh 1 2 vs 3 4} compares two groups of
    the same size on a balance. After at least two weighings, name the heavy coin with
    \\boxed{heavy N}."""

    N = 8

    def __init__(self, max_turns=6):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.heavy = rng.randint(1, self.N)
        self.weighings, self.turn = 0, 0
        obs = (f"Coins 1 to {self.N} look alike, but exactly one is heavier than the others.\n"
               "Compare two groups of the same size with \\boxed{weigh 1 2 vs 3 4}; the balance "
               "tips to the heavier side or stays level. After at least two weighings, name the "
               f"heavy coin with \\boxed{{heavy N}}. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _groups(self, text):
        if " vs " not in f" {text} ":
            return None
        left, _, right = text.partition("vs")
        sides = [left.replace(",", " ").split(), right.replace(",", " ").split()]
        if not all(sides) or not all(x.isdigit() and 1 <= int(x) <= self.N for s in sides for x in s):
            return None
        a, b = {int(x) for x in sides[0]}, {int(x) for x in sides[1]}
        if len(a) != len(sides[0]) or len(b) != len(sides[1]) or len(a) != len(b) or a & b:
            return None
        return a, b

    def step(self, action):
        self.turn += 1
        words = _boxed(action).lower().split(None, 1)
        reward, done = 0.0, False
        groups = self._groups(words[1]) if len(words) == 2 and words[0] == "weigh" else None
        if groups is not None:
            self.weighings += 1
            a, b = groups
            side = "left" if self.heavy in a else "right" if self.heavy in b else None
            msg = f"Weighing {self.weighings}: " + (f"the {side} side is heavier." if side else "the scale balances.")
        elif len(words) == 2 and words[0] == "heavy" and words[1].strip(" .").isdigit():
            if self.weighings < 2:
                msg = "Weigh at least twice before naming the heavy coin."
            elif int(words[1].strip(" .")) != self.heavy:
                msg = f"No, coin {words[1].strip(' .')} is not the heavy one."
            else:
                msg, reward, done = f"Yes, coin {self.heavy} is the heavy one!", 1.0, True
        else:
            msg = "Use \\boxed{weigh 1 2 vs 3 4} (groups of the same size) or \\boxed{heavy N}."
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\nWeighings so far: {self.weighings}. Turn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        # Thirds: {1,2,3} vs {4,5,6} leaves three candidates (or 7, 8), then one against another.
        h = self.heavy
        group = [1, 2, 3] if h <= 3 else [4, 5, 6] if h <= 6 else [7, 8]
        second = f"{group[0]} vs {group[1]}"
        plan = ["weigh 1 2 3 vs 4 5 6", f"weigh {second}"][:max(0, 2 - self.weighings)]
        return [f"\\boxed{{{a}}}" for a in plan + [f"heavy {h}"]]
