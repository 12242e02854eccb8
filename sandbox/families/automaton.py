"""Pattern_Recognition: predict the next rows of a one-dimensional cellular automaton.

Level L: rows of min(16, 4 + L) cells that wrap around; the hidden rule (each cell's next value
from itself and its two neighbours) is a shift or an inversion at levels 1-2, an XOR rule at
levels 3-5, any non-trivial elementary rule from level 6 on; 4 rows are shown up to level 4,
3 up to level 8, then 2 (more if needed so that every neighbourhood a prediction uses has been
seen); 2 rows to predict at level 1, 3 at levels 2-6, 4 from level 7. A winning play gives
each next row once.
"""

import random

LEVEL = 1
SIMPLE = [240, 170, 51, 15, 85]  # shift right, shift left, invert, shift right + invert, ...
XOR = [90, 150, 60, 102, 105, 165, 195, 153]


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


def _hoods(row):
    n = len(row)
    return [4 * row[i - 1] + 2 * row[i] + row[(i + 1) % n] for i in range(n)]


def _next(row, rule):
    return [(rule >> h) & 1 for h in _hoods(row)]


class AutomatonEnv:
    """A row of 0/1 cells changes every tick by a hidden rule: each cell's next value depends only
    on itself and its left and right neighbours (the row wraps around). Some rows are shown;
    give the next row each turn as a string of 0s and 1s, e.g. \\boxed{0110}."""

    def __init__(self, max_turns=None):
        self.width = min(16, 4 + LEVEL)
        self.shown = 4 if LEVEL <= 4 else 3 if LEVEL <= 8 else 2
        self.n_pred = 2 if LEVEL == 1 else 3 if LEVEL <= 6 else 4
        self.max_turns = max_turns or min(25, self.n_pred + 3 + min(LEVEL, 12) // 3)

    def _rule(self, rng):
        if LEVEL <= 2:
            return rng.choice(SIMPLE[:3])
        if LEVEL <= 5:
            return rng.choice(XOR)
        return rng.choice([r for r in range(1, 255) if r not in (204, 51, 0, 255)])

    def reset(self, seed=None):
        rng = random.Random(seed)
        shown, tries = self.shown, 0
        while True:
            tries += 1
            if tries % 200 == 0:  # rare: show one more row rather than search forever
                shown += 1
            rule = self._rule(rng)
            rows = [[rng.randint(0, 1) for _ in range(self.width)]]
            for _ in range(shown + self.n_pred - 1):
                rows.append(_next(rows[-1], rule))
            seen = {h for r in rows[:shown - 1] for h in _hoods(r)}
            used = {h for r in rows[shown - 1:-1] for h in _hoods(r)}
            future = rows[shown:]
            if (used <= seen and all(a != b for a, b in zip(rows, rows[1:]))
                    and all(0 < sum(r) < self.width for r in future)):
                break
        self.rows, self.n_shown, self.turn = rows, shown, 0
        obs = ("A row of cells (0 or 1) changes each tick by a hidden rule: a cell's next value "
               "depends only on itself and its two neighbours; the row wraps around at the ends.\n"
               f"The first {shown} rows:\n{self._render()}\n"
               f"Give the next {self.n_pred} rows, one per turn, as {self.width} digits inside "
               f"\\boxed{{...}}, e.g. \\boxed{{{'01' * (self.width // 2)}{'0' * (self.width % 2)}}}. "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        return "\n".join(f"  t={t}: {''.join(map(str, r))}" for t, r in enumerate(self.rows[:self.n_shown]))

    def step(self, action):
        self.turn += 1
        text = _boxed(action).replace(" ", "").replace(",", "")
        reward, done = 0.0, False
        want = "".join(map(str, self.rows[self.n_shown]))
        if len(text) != self.width or set(text) - {"0", "1"}:
            msg = f"A row is exactly {self.width} digits, each 0 or 1."
        elif text != want:
            msg = f"No, {text} is not the row at t={self.n_shown}."
        else:
            self.n_shown += 1
            msg = f"Right, that is the row at t={self.n_shown - 1}."
            if self.n_shown == len(self.rows):
                msg, reward, done = msg + " All rows predicted!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\nRows so far:\n{self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{''.join(map(str, r))}}}" for r in self.rows[self.n_shown:]]
