"""Optimization: pack the most valuable load that fits in a weight limit (0/1 knapsack)."""

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


class KnapsackEnv:
    """Eight items with weights and values, and a capacity. Build a load one item at a time with
    \\boxed{add K} / \\boxed{remove K}, then \\boxed{submit}. Only a load of the best possible
    value wins; the intermediate reward is the load's share of that best value, below 1.
    Instances are drawn until the best load needs at least three items."""

    N_ITEMS = 8

    def __init__(self, max_turns=20):
        self.max_turns = max_turns

    def _best(self):
        """Dynamic programme over capacity; returns (best value, chosen item indices)."""
        best = [(0, ())] * (self.capacity + 1)
        for i, (w, v) in enumerate(self.items):
            for cap in range(self.capacity, w - 1, -1):
                cand = best[cap - w][0] + v
                if cand > best[cap][0]:
                    best[cap] = (cand, best[cap - w][1] + (i,))
        return best[self.capacity]

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.items = [(rng.randint(2, 12), rng.randint(3, 30)) for _ in range(self.N_ITEMS)]
            self.capacity = rng.randint(18, 30)
            self.optimum, chosen = self._best()
            if len(chosen) >= 3:
                break
        self.load, self.turn = set(), 0
        listing = "\n".join(f"  item {k + 1}: weight {w}, value {v}" for k, (w, v) in enumerate(self.items))
        obs = (f"Capacity: {self.capacity}. Items:\n{listing}\n"
               "Choose items whose total weight fits the capacity with the largest total value.\n"
               "Actions: \\boxed{add K}, \\boxed{remove K}, \\boxed{submit}. "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _totals(self):
        return (sum(self.items[k][0] for k in self.load), sum(self.items[k][1] for k in self.load))

    def step(self, action):
        self.turn += 1
        words = _boxed(action).lower().split()
        reward, done = 0.0, False
        if len(words) == 2 and words[0] in ("add", "remove") and words[1].isdigit() \
                and 1 <= int(words[1]) <= self.N_ITEMS:
            k = int(words[1]) - 1
            if words[0] == "add":
                if k in self.load:
                    msg = f"Item {k + 1} is already packed."
                elif self._totals()[0] + self.items[k][0] > self.capacity:
                    msg = f"Item {k + 1} does not fit."
                else:
                    self.load.add(k)
                    msg = f"Packed item {k + 1}."
            elif k in self.load:
                self.load.discard(k)
                msg = f"Removed item {k + 1}."
            else:
                msg = f"Item {k + 1} is not packed."
        elif words == ["submit"]:
            if self._totals()[1] == self.optimum:
                msg, reward, done = "Optimal load. Well packed!", 1.0, True
            else:
                msg = "A more valuable load exists. Keep improving."
        else:
            msg = "Use \\boxed{add K}, \\boxed{remove K} or \\boxed{submit}."
        weight, value = self._totals()
        if not done:
            reward = 0.5 * value / self.optimum  # progress signal only; a win is worth 1
        truncated = not done and self.turn >= self.max_turns
        packed = ", ".join(str(k + 1) for k in sorted(self.load)) or "nothing"
        obs = (f"{msg}\nPacked: {packed} (weight {weight}/{self.capacity}, value {value}).\n"
               f"Turn {self.turn}/{self.max_turns}.")
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        _, chosen = self._best()
        return [f"\\boxed{{add {k + 1}}}" for k in chosen] + ["\\boxed{submit}"]
