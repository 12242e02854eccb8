"""Causal_Inference: learn which blocks knock over which, then topple exactly the red ones.

Level L: min(14, 5 + L) blocks, each knocking over up to 1 + L // 4 later ones (hidden); the
red set is what K pushes topple, and no fewer pushes can topple exactly it, with K = 2 at
level 1, 3 at levels 2-4, 4 at levels 5-7 and 5 from level 8. Pushes are limited to K per
attempt; tests are free but cost a turn. A winning play is K pushes.
"""

import itertools
import random

LEVEL = 1
BLOCKS = "ABCDEFGHIJKLMN"


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


class DominoChainEnv:
    """Blocks stand in a hidden causal web: pushing a block topples it and, in a chain, every
    block it knocks over. \\boxed{test X} shows what pushing X would topple (nothing moves);
    \\boxed{push X} pushes it. Topple exactly the red blocks, leaving every blue block standing,
    within the allowed pushes; a blue falling, or running out of pushes, stands every block back
    up."""

    def __init__(self, max_turns=None):
        self.n = min(14, 5 + LEVEL)
        self.k = 2 if LEVEL == 1 else 3 if LEVEL <= 4 else 4 if LEVEL <= 7 else 5
        self.fan = 1 + min(LEVEL, 12) // 4
        self.max_turns = max_turns or min(25, self.n + 2 * self.k + 2)

    def _falls(self, x):
        out, todo = set(), [x]
        while todo:
            y = todo.pop()
            if y not in out:
                out.add(y)
                todo.extend(self.knocks[y])
        return out

    def _fewest(self, target):
        """Fewest pushes that topple exactly `target` (size and pushes), up to self.k."""
        safe = [x for x in self.blocks if self.falls[x] <= target]
        for size in range(1, self.k + 1):
            for combo in itertools.combinations(safe, size):
                if set().union(*(self.falls[x] for x in combo)) == target:
                    return list(combo)
        return None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.blocks = list(BLOCKS[:self.n])
        while True:
            order = rng.sample(self.blocks, self.n)
            self.knocks = {x: sorted(rng.sample(order[i + 1:], min(len(order) - i - 1, rng.randint(0, self.fan))))
                           for i, x in enumerate(order)}
            self.falls = {x: self._falls(x) for x in self.blocks}
            sources = rng.sample(self.blocks, self.k)
            self.red = set().union(*(self.falls[x] for x in sources))
            if len(self.red) >= self.n - 1 or len(self.red) <= self.k:
                continue
            self.plan = self._fewest(self.red)
            if self.plan is not None and len(self.plan) == self.k:
                break
        self.down, self.pushes, self.turn = set(), 0, 0
        obs = ("Blocks stand in a hidden causal web: pushing a block topples it and every block it "
               "knocks over, in a chain.\n" + self._render() + "\n"
               "Topple exactly the red blocks and keep every blue one standing, using at most "
               f"{self.k} pushes. \\boxed{{test X}} shows what pushing X would topple (nothing "
               "moves); \\boxed{push X} pushes it. A blue block falling, or running out of pushes, "
               f"stands every block back up. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        def show(x):
            return f"{x}({'red' if x in self.red else 'blue'}{', down' if x in self.down else ''})"
        return "Blocks: " + " ".join(show(x) for x in self.blocks)

    def step(self, action):
        self.turn += 1
        words = _boxed(action).upper().replace(":", " ").split()
        reward, done = 0.0, False
        if len(words) != 2 or words[0] not in ("TEST", "PUSH") or words[1] not in self.blocks:
            msg = f"Use \\boxed{{test X}} or \\boxed{{push X}} with X one of {''.join(self.blocks)}."
        elif words[0] == "TEST":
            msg = f"Pushing {words[1]} would topple: {' '.join(sorted(self.falls[words[1]]))}."
        elif words[1] in self.down:
            msg = f"{words[1]} is already down."
        else:
            self.pushes += 1
            fell = self.falls[words[1]] - self.down
            self.down |= fell
            msg = f"Pushed {words[1]}: {' '.join(sorted(fell))} fell."
            if self.down == self.red:
                msg, reward, done = msg + " Exactly the red blocks are down!", 1.0, True
            elif self.down - self.red:
                msg += " A blue block fell: every block stands back up."
                self.down, self.pushes = set(), 0
            elif self.pushes == self.k:
                msg += f" That was push {self.k} of {self.k}: every block stands back up."
                self.down, self.pushes = set(), 0
        truncated = not done and self.turn >= self.max_turns
        obs = (f"{msg}\n{self._render()}\nPushes used: {self.pushes}/{self.k}. "
               f"Turn {self.turn}/{self.max_turns}.")
        return obs, reward, done, truncated, {"turn": self.turn, "pushes": self.pushes}

    def solution(self):
        todo = [x for x in self.plan if x not in self.down]
        if self.pushes + len(todo) > self.k:  # too few pushes left: topple a blue to start over
            blue = next(x for x in self.blocks if x not in self.red)
            todo = [blue] + self.plan
        return [f"\\boxed{{push {x}}}" for x in todo]
