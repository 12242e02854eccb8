"""Logical_Deduction: deduce the order of people on a bench from clues, seat by seat.

Level L: min(7, 3 + (L - 1) // 2) people (level 1: 3, level 10: 7). Levels 1-2 may use clues
that name a seat; levels 3-6 use relative clues (left of, next to, at an end); from level 7 on
only indirect ones (not next to, not at an end, seats between two people). Clues are added
until exactly one order fits. A winning play names each seat's person once (3 to 7 turns).
"""

import itertools
import random

LEVEL = 1
PEOPLE = ["Ana", "Ben", "Cal", "Dee", "Eli", "Fay", "Gus"]


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


class SeatLineupEnv:
    """People sit in a row of numbered seats (1 is the leftmost). From the clues, name who sits
    in each seat, left to right, one seat per turn with \\boxed{Name}. A wrong name is refused
    and the seat stays open."""

    def __init__(self, max_turns=None):
        self.n = min(7, 3 + (LEVEL - 1) // 2)
        if LEVEL <= 2:
            self.kinds = ["seat", "left", "left", "adjacent"]
        elif LEVEL <= 6:
            self.kinds = ["left", "just_left", "adjacent", "end"]
        else:
            self.kinds = ["left", "not_adjacent", "not_end", "gap", "gap"]
        self.max_turns = max_turns or self.n + 4

    def _clue(self, rng, pos):
        """A random clue true of the hidden order: (text, test on a candidate's positions)."""
        kind = rng.choice(self.kinds)
        a, b = rng.sample(self.names, 2)
        pa, pb, last = pos[a], pos[b], self.n - 1
        if kind == "seat":
            return f"{a} sits in seat {pa + 1}.", lambda p: p[a] == pa
        if kind == "left":
            a, b = (a, b) if pa < pb else (b, a)
            return f"{a} sits somewhere left of {b}.", lambda p: p[a] < p[b]
        if kind == "just_left" and abs(pa - pb) == 1:
            a, b = (a, b) if pa < pb else (b, a)
            return f"{a} sits immediately left of {b}.", lambda p: p[b] == p[a] + 1
        if kind == "adjacent" and abs(pa - pb) == 1:
            return f"{a} and {b} sit next to each other.", lambda p: abs(p[a] - p[b]) == 1
        if kind == "not_adjacent" and abs(pa - pb) > 1:
            return f"{a} and {b} do not sit next to each other.", lambda p: abs(p[a] - p[b]) > 1
        if kind == "end":
            if pa in (0, last):
                return f"{a} sits at one end of the bench.", lambda p: p[a] in (0, last)
            return f"{a} does not sit at either end.", lambda p: p[a] not in (0, last)
        if kind == "not_end" and pa not in (0, last):
            return f"{a} does not sit at either end.", lambda p: p[a] not in (0, last)
        if kind == "gap" and abs(pa - pb) > 1:
            g = abs(pa - pb) - 1
            return (f"Exactly {g} {'person sits' if g == 1 else 'people sit'} between {a} and {b}.",
                    lambda p: abs(p[a] - p[b]) - 1 == g)
        return None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.names = rng.sample(PEOPLE, self.n)
        self.order = rng.sample(self.names, self.n)
        pos = {x: i for i, x in enumerate(self.order)}
        candidates = [dict(zip(perm, range(self.n))) for perm in itertools.permutations(self.names)]
        self.clues = []
        while len(candidates) > 1:
            clue = self._clue(rng, pos)
            if clue is None or clue[0] in self.clues:
                continue
            kept = [p for p in candidates if clue[1](p)]
            if len(kept) < len(candidates):
                self.clues.append(clue[0])
                candidates = kept
        self.seated, self.turn = 0, 0
        obs = (f"{self.n} people ({', '.join(sorted(self.names))}) sit on a bench with seats 1 to "
               f"{self.n}, seat 1 leftmost. Clues:\n" + "\n".join(f"- {c}" for c in self.clues) +
               "\nName who sits in each seat, from seat 1 rightwards, one per turn, e.g. "
               f"\\boxed{{{sorted(self.names)[0]}}}. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        name = _boxed(action).strip(" .").capitalize()
        reward, done = 0.0, False
        seat = self.seated + 1
        if name not in self.names:
            msg = f"Name one person: {', '.join(sorted(self.names))}."
        elif name in self.order[:self.seated]:
            msg = f"{name} is already placed in seat {self.order.index(name) + 1}."
        elif name != self.order[self.seated]:
            msg = f"No, {name} does not sit in seat {seat}."
        else:
            self.seated += 1
            msg = f"Yes, {name} sits in seat {seat}."
            if self.seated == self.n:
                msg, reward, done = msg + " The whole bench is right!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        placed = " ".join(self.order[:self.seated] + ["?"] * (self.n - self.seated))
        obs = (f"{msg}\nBench so far: {placed}\nClues:\n" + "\n".join(f"- {c}" for c in self.clues) +
               f"\nTurn {self.turn}/{self.max_turns}.")
        return obs, reward, done, truncated, {"turn": self.turn, "seated": self.seated}

    def solution(self):
        return [f"\\boxed{{{x}}}" for x in self.order[self.seated:]]
