"""Mathematical_Reasoning: reach a target number with a fixed set of arithmetic moves."""

import random
from collections import deque


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


def _apply(value, move):
    op, k = move[0], int(move[1:])
    return value + k if op == "+" else value - k if op == "-" else value * k


class TargetNumberEnv:
    """Start from a number and apply moves such as +7, -3 or *2 until you hit the target exactly.

    The target is chosen so that its shortest route from the start takes at least three moves;
    intermediate values must stay within [-999, 999].
    """

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def _shortest(self, start, target, limit=8):
        seen, queue = {start: []}, deque([start])
        while queue:
            v = queue.popleft()
            if v == target:
                return seen[v]
            if len(seen[v]) >= limit:
                continue
            for m in self.moves:
                w = _apply(v, m)
                if -999 <= w <= 999 and w not in seen:
                    seen[w] = seen[v] + [m]
                    queue.append(w)
        return None

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.moves = [f"+{rng.randint(2, 9)}", f"-{rng.randint(2, 9)}", f"*{rng.randint(2, 4)}"]
            self.value = rng.randint(1, 20)
            target = self.value
            for _ in range(rng.randint(4, 6)):
                target = _apply(target, rng.choice(self.moves))
            path = self._shortest(self.value, target)
            if target != self.value and -999 <= target <= 999 and path and len(path) >= 3:
                break
        self.target, self.turn = target, 0
        obs = (
            f"You hold the number {self.value}. Reach exactly {self.target}.\n"
            f"Allowed moves: {', '.join(self.moves)} (apply one per turn, e.g. \\boxed{{{self.moves[0]}}}).\n"
            f"Values must stay within [-999, 999]. You have {self.max_turns} turns. "
            "Put your move inside \\boxed{...}."
        )
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        move = _boxed(action).replace(" ", "").replace("x", "*").replace("×", "*")
        reward, done = 0.0, False
        if move not in self.moves:
            msg = f"'{move[:30]}' is not an allowed move; choose one of {', '.join(self.moves)}."
        else:
            new = _apply(self.value, move)
            if not -999 <= new <= 999:
                msg = f"{move} would leave the allowed range; you still hold {self.value}."
            else:
                self.value = new
                msg = f"Applied {move}: you now hold {self.value}."
                if self.value == self.target:
                    msg, reward, done = msg + " Target reached!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg} Target: {self.target}. Turn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn, "value": self.value}

    def solution(self):
        return [f"\\boxed{{{m}}}" for m in self._shortest(self.value, self.target)]
