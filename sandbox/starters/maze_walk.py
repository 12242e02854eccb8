"""Spatial_Reasoning: walk through a grid maze to the exit."""

import random
from collections import deque

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


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


class MazeWalkEnv:
    """A 7x7 grid with walls (#). Move the player (P) to the exit (E) one step at a time with
    \\boxed{up|down|left|right}. Mazes are generated until the shortest route is 6+ steps."""

    SIZE = 7

    def __init__(self, max_turns=30):
        self.max_turns = max_turns

    def _route(self):
        seen, queue = {self.pos: []}, deque([self.pos])
        while queue:
            cell = queue.popleft()
            if cell == self.exit:
                return seen[cell]
            for name, (dr, dc) in MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if self._open(nxt) and nxt not in seen:
                    seen[nxt] = seen[cell] + [name]
                    queue.append(nxt)
        return None

    def _open(self, cell):
        r, c = cell
        return 0 <= r < self.SIZE and 0 <= c < self.SIZE and cell not in self.walls

    def reset(self, seed=None):
        rng = random.Random(seed)
        cells = [(r, c) for r in range(self.SIZE) for c in range(self.SIZE)]
        while True:
            self.walls = set(rng.sample(cells, 14))
            free = [x for x in cells if x not in self.walls]
            self.pos, self.exit = rng.sample(free, 2)
            route = self._route()
            if route and len(route) >= 6:
                break
        self.turn = 0
        obs = ("Move P to the exit E through the maze (# is a wall, rows go down, columns go right).\n"
               + self._render() + "\n"
               "Actions: \\boxed{up}, \\boxed{down}, \\boxed{left}, \\boxed{right} (one step per turn). "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        rows = []
        for r in range(self.SIZE):
            rows.append("".join("P" if (r, c) == self.pos else "E" if (r, c) == self.exit
                                else "#" if (r, c) in self.walls else "." for c in range(self.SIZE)))
        return "\n".join(rows)

    def step(self, action):
        self.turn += 1
        move = _boxed(action).lower()
        reward, done = 0.0, False
        if move not in MOVES:
            msg = "Unknown move; use up, down, left or right."
        else:
            dr, dc = MOVES[move]
            nxt = (self.pos[0] + dr, self.pos[1] + dc)
            if self._open(nxt):
                self.pos = nxt
                msg = f"You moved {move}."
                if self.pos == self.exit:
                    msg, reward, done = msg + " You reached the exit!", 1.0, True
            else:
                msg = f"A wall or the edge blocks {move}."
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\n{self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn, "position": list(self.pos)}

    def solution(self):
        return [f"\\boxed{{{m}}}" for m in self._route()]
