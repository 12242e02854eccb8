"""Logical_Deduction: find the gold when exactly one of the boxes' labels tells the truth."""

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


def _label(rng, box):
    """A label on `box`: (text, test of a gold position)."""
    k = rng.randint(1, 4)
    kind = rng.randrange(5)
    if kind == 0:
        return "The gold is in this box.", lambda g: g == box
    if kind == 1:
        return "The gold is not in this box.", lambda g: g != box
    if kind == 2:
        return f"The gold is in box {k}.", lambda g: g == k
    if kind == 3:
        return f"The gold is not in box {k}.", lambda g: g != k
    return "The gold is in an even-numbered box.", lambda g: g % 2 == 0


class TruthBoxesEnv:
    """Three rounds of four boxes, each with a label. In every round exactly one label is true and
    exactly one box holds the gold. Open the box you deduce holds it with \\boxed{N}."""

    ROUNDS = 3

    def __init__(self, max_turns=5):
        self.max_turns = max_turns

    def _puzzle(self, rng):
        while True:
            labels = [_label(rng, b) for b in range(1, 5)]
            fits = [g for g in range(1, 5) if sum(test(g) for _, test in labels) == 1]
            if len(fits) == 1:
                return [text for text, _ in labels], fits[0]

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:  # not the same box every round, so repeating one answer does not win
            self.puzzles = [self._puzzle(rng) for _ in range(self.ROUNDS)]
            if len({gold for _, gold in self.puzzles}) > 1:
                break
        self.round, self.turn = 0, 0
        obs = ("Three rounds. In each, four boxes carry labels; exactly one label is true, and exactly "
               "one box holds the gold. Open the box with the gold with \\boxed{N} (N from 1 to 4).\n"
               f"{self._render()}\nYou have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        labels, _ = self.puzzles[self.round]
        return f"Round {self.round + 1}:\n" + "\n".join(f"  Box {b}: \"{t}\"" for b, t in enumerate(labels, 1))

    def step(self, action):
        self.turn += 1
        text = _boxed(action).lower().replace("box", "").strip(" .")
        reward, done = 0.0, False
        if text not in ("1", "2", "3", "4"):
            msg = "Open one box: \\boxed{1}, \\boxed{2}, \\boxed{3} or \\boxed{4}."
        elif int(text) != self.puzzles[self.round][1]:
            msg = f"Box {text} is empty."
        else:
            self.round += 1
            msg = f"Box {text} holds the gold!"
            if self.round == self.ROUNDS:
                msg, reward, done = msg + " All three rounds solved!", 1.0, True
            else:
                msg += "\n" + self._render()
        truncated = not done and self.turn >= self.max_turns
        if not done and "Round" not in msg:
            msg += "\n" + self._render()
        obs = f"{msg}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{gold}}}" for _, gold in self.puzzles[self.round:]]
