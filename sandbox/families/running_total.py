"""Mathematical_Reasoning: keep a running total as operations are revealed one at a time.

Level L: L + 1 operations (at most 16); operands grow with L; levels 1-2 add and subtract,
level 3 on also multiplies, level 6 on also divides (dropping the remainder), level 8 on also
takes remainders. Every value along the way is a positive integer (at most 10^(1 + L//3)).
A winning play states each new value once (L + 1 turns).
"""

import random

LEVEL = 1


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


def _apply(value, op, k):
    if op == "+":
        return value + k
    if op == "-":
        return value - k
    if op == "x":
        return value * k
    if op == "//":
        return value // k
    return value % k


class RunningTotalEnv:
    """Start from a number; each turn one operation is revealed and you give the value after
    applying it. A wrong value is refused and the same operation stays; the next operation is
    revealed only after a right answer."""

    def __init__(self, max_turns=None):
        self.n_ops = min(LEVEL + 1, 16)
        self.kinds = ["+", "-"] + ["x"] * (LEVEL >= 3) + ["//"] * (LEVEL >= 6) + ["%"] * (LEVEL >= 8)
        self.bound = 10 ** (1 + min(LEVEL, 12) // 3)
        self.max_turns = max_turns or min(25, self.n_ops + 3 + min(LEVEL, 12) // 3)

    def _operand(self, rng, op):
        top = 3 + 2 * min(LEVEL, 12)
        if op == "x":
            return rng.randint(2, 2 + min(LEVEL, 12) // 3)
        if op in ("//", "%"):
            return rng.randint(2, 3 + min(LEVEL, 12) // 2)
        return rng.randint(1, top)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.start = rng.randint(2, 4 + 2 * min(LEVEL, 12))
        self.ops, value = [], self.start
        while len(self.ops) < self.n_ops:
            op = rng.choice(self.kinds)
            k = self._operand(rng, op)
            new = _apply(value, op, k)
            if 1 <= new <= self.bound and new != value:
                self.ops.append((op, k, new))
                value = new
        self.value, self.done_ops, self.turn = self.start, 0, 0
        obs = (f"Start with {self.start}. {self.n_ops} operations will be revealed one at a time; "
               "after each, give the new value inside \\boxed{...}, e.g. \\boxed{12}.\n"
               "(x multiplies, // divides dropping the remainder, % takes the remainder.)\n"
               f"Operation 1: {self._op_text(0)}. You have {self.max_turns} turns.")
        return obs, {"turn": 0, "value": self.value}

    def _op_text(self, i):
        op, k, _ = self.ops[i]
        return f"{op} {k}"

    def step(self, action):
        self.turn += 1
        text = _boxed(action).replace(" ", "").replace(",", "")
        reward, done = 0.0, False
        i = self.done_ops
        expected = self.ops[i][2]
        if not text.lstrip("-").isdigit() or len(text) > 30:
            msg = "Give the new value as a single integer, e.g. \\boxed{12}."
        elif int(text) != expected:
            msg = f"{text} is not right: the value was {self.value}, apply {self._op_text(i)}."
        else:
            self.value, self.done_ops = expected, i + 1
            msg = f"Right: the value is {self.value}."
            if self.done_ops == self.n_ops:
                msg, reward, done = msg + " All operations done!", 1.0, True
            else:
                msg += f" Operation {self.done_ops + 1}: {self._op_text(self.done_ops)}."
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn, "value": self.value}

    def solution(self):
        return [f"\\boxed{{{new}}}" for _, _, new in self.ops[self.done_ops:]]
