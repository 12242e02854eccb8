"""Spatial_Reasoning: push a crate onto its target square (one-crate Sokoban).

Level L: a room of side min(8, 4 + (L + 1) // 3) with about 1.5 L inner walls; the shortest
solution takes 2-3 moves at level 1 and from L + 2 to L + 5 moves at higher levels (at most 16
to 19), with at least 1 + L // 3 pushes, and never by repeating one move. A winning play is
a shortest solution.
"""

import random
from collections import deque

LEVEL = 1
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


class BoxPushEnv:
    """You (P) walk a room with walls (#) and one crate (B). Walking into the crate pushes it one
    cell if the cell behind it is free; crates cannot be pulled. Get the crate onto the target
    (T) with \\boxed{up|down|left|right}."""

    def __init__(self, max_turns=None):
        self.size = min(8, 4 + (LEVEL + 1) // 3)
        self.n_walls = min(3 * LEVEL // 2, self.size * self.size // 4)
        self.lo = 2 if LEVEL == 1 else min(LEVEL + 2, 16)
        self.hi = self.lo + (1 if LEVEL == 1 else 3)
        self.min_push = min(1 + LEVEL // 3, 5)
        self.max_turns = max_turns or min(25, self.hi + 6)

    def _free(self, cell):
        r, c = cell
        return 0 <= r < self.size and 0 <= c < self.size and cell not in self.walls

    def _move(self, player, box, move):
        """(player, box, pushed) after a move; the same positions if it is blocked."""
        dr, dc = MOVES[move]
        nxt = (player[0] + dr, player[1] + dc)
        if not self._free(nxt):
            return player, box, False
        if nxt == box:
            beyond = (box[0] + dr, box[1] + dc)
            if not self._free(beyond):
                return player, box, False
            return nxt, beyond, True
        return nxt, box, False

    def _solve(self, player, box, depth):
        """Shortest list of moves (and its number of pushes) within `depth` moves, else None."""
        seen, queue = {(player, box): ([], 0)}, deque([(player, box)])
        while queue:
            p, b = queue.popleft()
            path, pushes = seen[(p, b)]
            if b == self.target:
                return path, pushes
            if len(path) >= depth:
                continue
            for m in MOVES:
                q, c, pushed = self._move(p, b, m)
                if (q, c) not in seen:
                    seen[(q, c)] = (path + [m], pushes + pushed)
                    queue.append((q, c))
        return None

    def _one_way(self):
        """Whether repeating a single move gets the crate to the target."""
        for m in MOVES:
            player, box = self.player, self.box
            for _ in range(self.size):
                player, box, _ = self._move(player, box, m)
                if box == self.target:
                    return True
        return False

    def reset(self, seed=None):
        rng = random.Random(seed)
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        best = None
        for _ in range(300):
            self.walls = set(rng.sample(cells, self.n_walls))
            free = [x for x in cells if x not in self.walls]
            self.player, self.box, self.target = rng.sample(free, 3)
            found = self._solve(self.player, self.box, self.hi)
            if found and self._one_way():
                continue
            if found and len(found[0]) >= self.lo and found[1] >= self.min_push:
                break
            if found and (best is None or len(found[0]) > len(best[4])):
                best = (self.walls, self.player, self.box, self.target, found[0])
        else:
            self.walls, self.player, self.box, self.target, _ = best
        self.turn = 0
        obs = ("Push the crate B onto the target T. You are P; # is a wall; rows go down, columns "
               "go right. Walking into the crate pushes it one cell if the cell behind it is free.\n"
               + self._render() + "\nMove with \\boxed{up}, \\boxed{down}, \\boxed{left} or "
               f"\\boxed{{right}}. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        def ch(cell):
            return ("P" if cell == self.player else "B" if cell == self.box else
                    "T" if cell == self.target else "#" if cell in self.walls else ".")
        return "\n".join("".join(ch((r, c)) for c in range(self.size)) for r in range(self.size))

    def step(self, action):
        self.turn += 1
        move = _boxed(action).lower().strip(" .")
        reward, done = 0.0, False
        if move not in MOVES:
            msg = "Unknown move; use up, down, left or right."
        else:
            player, box, pushed = self._move(self.player, self.box, move)
            if player == self.player:
                msg = f"Blocked: you cannot move {move}."
            else:
                self.player, self.box = player, box
                msg = f"You moved {move}" + (" and pushed the crate." if pushed else ".")
                if self.box == self.target:
                    msg, reward, done = msg + " The crate is on the target!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\n{self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{m}}}" for m in self._solve(self.player, self.box, 64)[0]]
