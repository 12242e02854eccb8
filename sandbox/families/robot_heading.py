"""Spatial_Reasoning: steer a robot that can only drive forward and turn in place.

Level L: a grid of side min(9, 4 + L // 2) with about 2L walls (none at level 1); the shortest
program (turns count as actions) takes exactly 2 actions at level 1 and from L + 1 to L + 4
actions at higher levels (at most 15 to 18), and always turns at least once. A winning play
is a shortest program.
"""

import random
from collections import deque

LEVEL = 1
HEADINGS = "NESW"
STEP = {"N": (-1, 0), "E": (0, 1), "S": (1, 0), "W": (0, -1)}
ARROW = {"N": "^", "E": ">", "S": "v", "W": "<"}
ACTIONS = {"forward": "forward", "f": "forward", "left": "left", "l": "left", "right": "right", "r": "right"}


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


class RobotHeadingEnv:
    """A robot (^ > v <, pointing where it faces) on a grid with walls (#) must reach the goal
    (G). \\boxed{forward} drives one cell ahead, \\boxed{left} and \\boxed{right} turn it 90
    degrees in place. Rows go down, columns go right; north is up."""

    def __init__(self, max_turns=None):
        self.size = min(9, 4 + LEVEL // 2)
        self.n_walls = min(2 * (LEVEL - 1), self.size * self.size // 4)
        self.lo = 2 if LEVEL == 1 else min(LEVEL + 1, 15)
        self.hi = 2 if LEVEL == 1 else self.lo + 3
        self.max_turns = max_turns or min(25, self.hi + 6)

    def _move(self, state, act):
        r, c, h = state
        if act == "left":
            return r, c, HEADINGS[(HEADINGS.index(h) + 3) % 4]
        if act == "right":
            return r, c, HEADINGS[(HEADINGS.index(h) + 1) % 4]
        dr, dc = STEP[h]
        nr, nc = r + dr, c + dc
        if 0 <= nr < self.size and 0 <= nc < self.size and (nr, nc) not in self.walls:
            return nr, nc, h
        return state

    def _program(self, state):
        seen, queue = {state: []}, deque([state])
        while queue:
            s = queue.popleft()
            if (s[0], s[1]) == self.goal:
                return seen[s]
            for act in ("forward", "left", "right"):
                t = self._move(s, act)
                if t not in seen:
                    seen[t] = seen[s] + [act]
                    queue.append(t)
        return None

    def reset(self, seed=None):
        rng = random.Random(seed)
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        best = None
        for _ in range(400):
            self.walls = set(rng.sample(cells, self.n_walls))
            free = [x for x in cells if x not in self.walls]
            start, self.goal = rng.sample(free, 2)
            self.state = (start[0], start[1], rng.choice(HEADINGS))
            prog = self._program(self.state)
            if prog and set(prog) == {"forward"}:  # driving straight (repeating one action) wins
                continue
            if prog and self.lo <= len(prog) <= self.hi:
                break
            if prog and (best is None or abs(len(prog) - self.lo) < abs(len(best[3]) - self.lo)):
                best = (self.walls, self.goal, self.state, prog)
        else:
            self.walls, self.goal, self.state, _ = best
        self.turn = 0
        obs = ("Drive the robot to the goal G. The arrow shows where it faces (^ north/up, > east, "
               "v south, < west); # is a wall.\n" + self._render() + "\n"
               "Actions: \\boxed{forward} (one cell ahead), \\boxed{left} or \\boxed{right} (turn 90 "
               f"degrees in place). You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        r0, c0, h = self.state
        rows = []
        for r in range(self.size):
            rows.append("".join(ARROW[h] if (r, c) == (r0, c0) else "G" if (r, c) == self.goal
                                else "#" if (r, c) in self.walls else "." for c in range(self.size)))
        return "\n".join(rows)

    def step(self, action):
        self.turn += 1
        act = ACTIONS.get(_boxed(action).lower().strip(" ."))
        reward, done = 0.0, False
        if act is None:
            msg = "Unknown action; use forward, left or right."
        else:
            new = self._move(self.state, act)
            if act == "forward" and new == self.state:
                msg = "A wall or the edge blocks the way; the robot stays."
            else:
                self.state = new
                msg = f"The robot {'drove forward' if act == 'forward' else 'turned ' + act}."
            if (self.state[0], self.state[1]) == self.goal:
                msg, reward, done = msg + " Goal reached!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\n{self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn, "heading": self.state[2]}

    def solution(self):
        return [f"\\boxed{{{a}}}" for a in self._program(self.state)]
