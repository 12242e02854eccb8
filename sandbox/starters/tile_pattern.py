"""Pattern_Recognition: fill the blanks of a grid that repeats a hidden tile."""

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


class TilePatternEnv:
    """A 6x8 grid is a small tile (2-3 rows by 2-4 columns) repeated in both directions, with
    four cells hidden as '?'. Fill one cell per turn with \\boxed{ROW COL SYMBOL} (1-based).
    Wrong fills are refused; the puzzle is solved when all four are filled correctly."""

    ROWS, COLS, HIDDEN = 6, 8, 4
    SYMBOLS = "XO+*"

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        th, tw = rng.randint(2, 3), rng.randint(2, 4)
        tile = [[rng.choice(self.SYMBOLS) for _ in range(tw)] for _ in range(th)]
        self.grid = [[tile[r % th][c % tw] for c in range(self.COLS)] for r in range(self.ROWS)]
        cells = [(r, c) for r in range(self.ROWS) for c in range(self.COLS)]
        while True:  # every hidden cell must have a visible copy of its tile position
            self.hidden = set(rng.sample(cells, self.HIDDEN))
            if all(any((r2, c2) not in self.hidden for r2, c2 in cells
                       if r2 % th == r % th and c2 % tw == c % tw) for r, c in self.hidden):
                break
        self.turn = 0
        obs = ("This grid repeats a small tile in both directions; some cells are hidden as '?'.\n"
               f"{self._render()}\n"
               "Fill one hidden cell per turn with \\boxed{ROW COL SYMBOL}, rows and columns counted "
               f"from 1, symbols from {' '.join(self.SYMBOLS)} (e.g. \\boxed{{2 5 X}}). "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        return "\n".join(" ".join("?" if (r, c) in self.hidden else self.grid[r][c]
                                  for c in range(self.COLS)) for r in range(self.ROWS))

    def step(self, action):
        self.turn += 1
        parts = _boxed(action).upper().split()
        reward, done = 0.0, False
        if (len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit()
                or len(parts[2]) != 1 or parts[2] not in self.SYMBOLS):
            msg = "Write \\boxed{ROW COL SYMBOL}, e.g. \\boxed{2 5 X}."
        else:
            cell = (int(parts[0]) - 1, int(parts[1]) - 1)
            if cell not in self.hidden:
                msg = f"Cell {parts[0]} {parts[1]} is not a hidden cell."
            elif self.grid[cell[0]][cell[1]] != parts[2]:
                msg = f"{parts[2]} does not fit at {parts[0]} {parts[1]}."
            else:
                self.hidden.discard(cell)
                msg = f"Correct: {parts[2]} at {parts[0]} {parts[1]}."
                if not self.hidden:
                    msg, reward, done = msg + " The pattern is complete!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\n{self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn, "hidden_left": len(self.hidden)}

    def solution(self):
        return [f"\\boxed{{{r + 1} {c + 1} {self.grid[r][c]}}}" for r, c in sorted(self.hidden)]
