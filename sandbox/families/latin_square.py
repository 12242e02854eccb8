"""Logical_Deduction: complete a Latin square (each symbol once per row and once per column).

Level L: a 3x3 grid at levels 1-2, 4x4 at 3-5, 5x5 at 6-8, 6x6 from 9 on; blanks
2, 4, 5, 6, 7, 8, 10, 11, 13, 14 at levels 1-10 (then one more per level, at most 18). Blanks
are chosen so that exactly one completion exists. A winning play fills each blank once.
"""

import random

LEVEL = 1
BLANKS = [2, 4, 5, 6, 7, 8, 10, 11, 13, 14]


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


class LatinSquareEnv:
    """An n x n grid holds the numbers 1..n so that each appears once in every row and every
    column; some cells are blank. Fill one blank per turn with \\boxed{row col value}. A value
    that is not the square's is refused."""

    def __init__(self, max_turns=None):
        self.n = 3 if LEVEL <= 2 else 4 if LEVEL <= 5 else 5 if LEVEL <= 8 else 6
        self.blanks = BLANKS[LEVEL - 1] if LEVEL <= 10 else min(18, 14 + LEVEL - 10)
        self.max_turns = max_turns or min(25, self.blanks + 4)

    def _count(self, grid, limit=2):
        """Number of completions of grid (None = blank), stopping at `limit`."""
        for r in range(self.n):
            for c in range(self.n):
                if grid[r][c] is None:
                    used = set(grid[r]) | {grid[i][c] for i in range(self.n)}
                    total = 0
                    for v in range(1, self.n + 1):
                        if v not in used:
                            grid[r][c] = v
                            total += self._count(grid, limit - total)
                            grid[r][c] = None
                            if total >= limit:
                                return total
                    return total
        return 1

    def reset(self, seed=None):
        rng = random.Random(seed)
        n = self.n
        rows, cols, syms = rng.sample(range(n), n), rng.sample(range(n), n), rng.sample(range(1, n + 1), n)
        self.answer = [[syms[(rows[r] + cols[c]) % n] for c in range(n)] for r in range(n)]
        self.grid = [row[:] for row in self.answer]
        cells = [(r, c) for r in range(n) for c in range(n)]
        rng.shuffle(cells)
        self.open = []
        for r, c in cells:
            if len(self.open) == self.blanks:
                break
            self.grid[r][c] = None
            if self._count(self.grid) == 1:
                self.open.append((r, c))
            else:
                self.grid[r][c] = self.answer[r][c]
        self.open.sort()
        self.turn = 0
        obs = (f"Complete this {n}x{n} Latin square: every row and every column holds each of "
               f"1..{n} exactly once. Blanks are '.'.\n{self._render()}\n"
               "Fill one blank per turn with \\boxed{row col value}, rows and columns counted from 1 "
               f"(e.g. \\boxed{{1 2 {n}}}). You have {self.max_turns} turns.")
        return obs, {"turn": 0, "blanks": len(self.open)}

    def _render(self):
        head = "    " + " ".join(str(c + 1) for c in range(self.n))
        lines = [f"{r + 1} | " + " ".join("." if v is None else str(v) for v in row)
                 for r, row in enumerate(self.grid)]
        return "\n".join([head] + lines)

    def step(self, action):
        self.turn += 1
        parts = _boxed(action).replace(",", " ").replace("=", " ").split()
        reward, done = 0.0, False
        if len(parts) != 3 or not all(p.isdigit() and len(p) < 3 for p in parts):
            msg = "Write three numbers: \\boxed{row col value}."
        else:
            r, c, v = (int(p) for p in parts)
            if not (1 <= r <= self.n and 1 <= c <= self.n and 1 <= v <= self.n):
                msg = f"Rows, columns and values go from 1 to {self.n}."
            elif self.grid[r - 1][c - 1] is not None:
                msg = f"Row {r}, column {c} is already filled."
            elif self.answer[r - 1][c - 1] != v:
                msg = f"{v} does not belong at row {r}, column {c}."
            else:
                self.grid[r - 1][c - 1] = v
                self.open.remove((r - 1, c - 1))
                msg = f"Placed {v} at row {r}, column {c}."
                if not self.open:
                    msg, reward, done = msg + " The square is complete!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\n{self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn, "blanks": len(self.open)}

    def solution(self):
        return [f"\\boxed{{{r + 1} {c + 1} {self.answer[r][c]}}}" for r, c in self.open]
