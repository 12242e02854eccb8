"""Mathematical_Reasoning: pick two numbers from a list that add up to each announced total."""

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


class PairSumsEnv:
    """Eight different numbers are listed. Three totals are announced one after another; for each,
    answer with two numbers from the list that add up to it, e.g. \\boxed{4 9}."""

    ROUNDS = 3

    def __init__(self, max_turns=8):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.numbers = sorted(rng.sample(range(1, 31), 8))
        pairs = [(a, b) for i, a in enumerate(self.numbers) for b in self.numbers[i + 1:]]
        self.targets = []
        while len(self.targets) < self.ROUNDS:
            a, b = rng.choice(pairs)
            if a + b not in self.targets:
                self.targets.append(a + b)
        self.round, self.turn = 0, 0
        obs = (f"Numbers: {', '.join(map(str, self.numbers))}.\n"
               f"For each of {self.ROUNDS} totals, name two different numbers from the list that add "
               "up to it, inside \\boxed{...}, e.g. \\boxed{4 9}.\n"
               f"Total 1: {self.targets[0]}. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        parts = _boxed(action).replace(",", " ").replace("+", " ").split()
        reward, done = 0.0, False
        target = self.targets[self.round]
        if len(parts) != 2 or not all(p.isdigit() and len(p) < 4 for p in parts):
            msg = "Answer with exactly two numbers from the list, e.g. \\boxed{4 9}."
        else:
            a, b = int(parts[0]), int(parts[1])
            if a == b or a not in self.numbers or b not in self.numbers:
                msg = "Both numbers must be different numbers from the list."
            elif a + b != target:
                msg = f"{a} + {b} = {a + b}, not {target}."
            else:
                self.round += 1
                msg = f"Yes: {a} + {b} = {target}."
                if self.round == self.ROUNDS:
                    msg, reward, done = msg + " All totals made!", 1.0, True
                else:
                    msg += f" Total {self.round + 1}: {self.targets[self.round]}."
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\nNumbers: {', '.join(map(str, self.numbers))}. Turn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        out = []
        for t in self.targets[self.round:]:
            a = next(x for x in self.numbers if t - x in self.numbers and t - x != x)
            out.append(f"\\boxed{{{a} {t - a}}}")
        return out
