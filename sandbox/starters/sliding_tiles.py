"""Spatial_Reasoning: solve a scrambled 3x3 sliding-tile puzzle."""

import random
from collections import deque

GOAL = (1, 2, 3, 4, 5, 6, 7, 8, 0)
# Moving a tile into the blank: the tile that sits below the blank moves "up", and so on.
DIRECTIONS = {"up": 3, "down": -3, "left": 1, "right": -1}


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


def _slide(board, direction):
    """The board after sliding a tile into the blank, or None if no tile can move that way."""
    blank = board.index(0)
    src = blank + DIRECTIONS[direction]
    if not 0 <= src < 9 or (direction in ("left", "right") and src // 3 != blank // 3):
        return None
    cells = list(board)
    cells[blank], cells[src] = cells[src], 0
    return tuple(cells)


class SlidingTilesEnv:
    """Tiles 1-8 and a blank on a 3x3 board. Each turn slides one tile into the blank:
    \\boxed{up} moves the tile below the blank up, \\boxed{left} the tile right of it left, etc.
    Boards are scrambled until at least 6 moves are needed."""

    def __init__(self, max_turns=40):
        self.max_turns = max_turns

    def _shortest(self):
        seen, queue = {self.board: []}, deque([self.board])
        while queue:
            b = queue.popleft()
            if b == GOAL:
                return seen[b]
            for d in DIRECTIONS:
                nb = _slide(b, d)
                if nb is not None and nb not in seen:
                    seen[nb] = seen[b] + [d]
                    queue.append(nb)
        return None

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            board = GOAL
            for _ in range(rng.randint(8, 14)):
                board = _slide(board, rng.choice([d for d in DIRECTIONS if _slide(board, d)]))
            self.board = board
            if len(self._shortest()) >= 6:
                break
        self.turn = 0
        obs = ("Slide the tiles until the board reads\n1 2 3\n4 5 6\n7 8 _\n"
               f"Current board:\n{self._render()}\n"
               "Each turn slide one tile into the blank: \\boxed{up} moves the tile below the blank up, "
               "\\boxed{down} the tile above it down, \\boxed{left} the tile to its right left, "
               f"\\boxed{{right}} the tile to its left right. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        return "\n".join(" ".join(str(v) if v else "_" for v in self.board[r:r + 3]) for r in (0, 3, 6))

    def step(self, action):
        self.turn += 1
        move = _boxed(action).lower()
        reward, done = 0.0, False
        nb = _slide(self.board, move) if move in DIRECTIONS else None
        if move not in DIRECTIONS:
            msg = "Unknown move; use up, down, left or right."
        elif nb is None:
            msg = f"No tile can slide {move}."
        else:
            self.board = nb
            msg = f"Slid a tile {move}."
            if self.board == GOAL:
                msg, reward, done = msg + " Solved!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\n{self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{m}}}" for m in self._shortest()]
