"""Pattern_Recognition: fill the gaps of a word that reads the same backwards and forwards."""

import random

LETTERS = "ABCDEFGHIJKLMNOPRSTUVW"


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


class PalindromeFillEnv:
    """A row of letters is a palindrome (the same read from either end) with three gaps (_).
    Fill the gaps from left to right, one letter per turn, e.g. \\boxed{K}."""

    GAPS = 3

    def __init__(self, max_turns=6):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        n = rng.choice((7, 9))
        while True:  # the gaps hold at least two different letters: one letter repeated fails
            half = [rng.choice(LETTERS) for _ in range(n // 2)]
            self.word = half + [rng.choice(LETTERS)] + half[::-1]
            # One gap per mirrored pair, never the middle, so each gap's mirror is visible.
            pairs = rng.sample(range(n // 2), self.GAPS)
            self.gaps = sorted(i if rng.random() < 0.5 else n - 1 - i for i in pairs)
            if len({self.word[i] for i in self.gaps}) > 1:
                break
        self.filled, self.turn = 0, 0
        obs = ("This row of letters reads the same from left to right as from right to left, but "
               f"{self.GAPS} letters are missing (_):\n  {self._render()}\n"
               "Fill the gaps from left to right, one letter per turn, e.g. \\boxed{K}. "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        hidden = set(self.gaps[self.filled:])
        return " ".join("_" if i in hidden else ch for i, ch in enumerate(self.word))

    def step(self, action):
        self.turn += 1
        text = _boxed(action).strip(" .").upper()
        reward, done = 0.0, False
        pos = self.gaps[self.filled]
        if len(text) != 1 or not text.isalpha():
            msg = "Answer with one letter, e.g. \\boxed{K}."
        elif text != self.word[pos]:
            msg = f"No, {text} does not fit the leftmost gap (position {pos + 1})."
        else:
            self.filled += 1
            msg = f"Yes, position {pos + 1} is {text}."
            if self.filled == self.GAPS:
                msg, reward, done = msg + " The palindrome is complete!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\n  {self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{self.word[i]}}}" for i in self.gaps[self.filled:]]
