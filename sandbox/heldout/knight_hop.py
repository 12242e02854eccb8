"""Spatial_Reasoning: hop a chess knight to a marked square on a small board."""

import random
from collections import deque

JUMPS = [(1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2)]


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


class KnightHopEnv:
    """A 6x6 board with files a-f (left to right) and ranks 1-6 (bottom to top). A knight (N)
    jumps two squares one way and one square at right angles. Reach the square marked X by
    naming the knight's next square, e.g. \\boxed{c3}. The X is two or three jumps away."""

    SIZE = 6
    FILES = "abcdef"

    def __init__(self, max_turns=8):
        self.max_turns = max_turns

    def _name(self, sq):
        return f"{self.FILES[sq[0]]}{sq[1] + 1}"

    def _route(self):
        seen, queue = {self.pos: []}, deque([self.pos])
        while queue:
            sq = queue.popleft()
            if sq == self.target:
                return seen[sq]
            for dx, dy in JUMPS:
                nxt = (sq[0] + dx, sq[1] + dy)
                if 0 <= nxt[0] < self.SIZE and 0 <= nxt[1] < self.SIZE and nxt not in seen:
                    seen[nxt] = seen[sq] + [nxt]
                    queue.append(nxt)
        return None

    def reset(self, seed=None):
        rng = random.Random(seed)
        squares = [(x, y) for x in range(self.SIZE) for y in range(self.SIZE)]
        while True:
            self.pos, self.target = rng.sample(squares, 2)
            if len(self._route()) in (2, 3):
                break
        self.turn = 0
        obs = ("Move the knight N to the square X. A knight jumps two squares in one direction and one "
               "square at a right angle (an L shape).\n" + self._render() + "\n"
               f"The knight is on {self._name(self.pos)}; X is {self._name(self.target)}. Name the "
               f"knight's next square each turn, e.g. \\boxed{{c3}}. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        rows = []
        for y in range(self.SIZE - 1, -1, -1):
            cells = ["N" if (x, y) == self.pos else "X" if (x, y) == self.target else "."
                     for x in range(self.SIZE)]
            rows.append(f"{y + 1} " + " ".join(cells))
        return "\n".join(rows + ["  " + " ".join(self.FILES)])

    def step(self, action):
        self.turn += 1
        text = _boxed(action).lower().strip(" .")
        reward, done = 0.0, False
        if len(text) != 2 or text[0] not in self.FILES or text[1] not in "123456":
            msg = "Name a square like \\boxed{c3} (file a-f, rank 1-6)."
        else:
            sq = (self.FILES.index(text[0]), int(text[1]) - 1)
            if (sq[0] - self.pos[0], sq[1] - self.pos[1]) not in JUMPS:
                msg = f"A knight on {self._name(self.pos)} cannot jump to {text}."
            else:
                self.pos = sq
                msg = f"The knight jumps to {text}."
                if self.pos == self.target:
                    msg, reward, done = msg + " It reached X!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = (f"{msg}\n{self._render()}\nKnight on {self._name(self.pos)}, X on "
               f"{self._name(self.target)}. Turn {self.turn}/{self.max_turns}.")
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{self._name(sq)}}}" for sq in self._route()]
