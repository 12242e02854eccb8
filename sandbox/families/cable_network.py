"""Optimization: connect every town with the cheapest set of cables (minimum spanning tree).

Level L: min(12, L + 2) towns and about 1.6 times as many candidate links as towns (level 1:
a triangle); costs are distinct, from 1 to 5 + 4L, so the cheapest network is unique. A winning
play builds its links, one per turn (L + 1 turns); a finished network that is not the
cheapest is torn down.
"""

import random

LEVEL = 1
TOWNS = "ABCDEFGHIJKL"


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


class CableNetworkEnv:
    """Towns and candidate cable links with costs. Build one link per turn with \\boxed{A-B};
    a link between towns that are already connected is refused. Once every town is connected,
    the network wins if no cheaper one exists; otherwise it is torn down to start again."""

    def __init__(self, max_turns=None):
        self.n = min(12, LEVEL + 2)
        self.n_links = 3 if self.n == 3 else min(self.n * (self.n - 1) // 2, (8 * self.n) // 5)
        self.max_turns = max_turns or min(25, 2 * (self.n - 1) + 3)

    def _root(self, parent, x):
        while parent[x] != x:
            x = parent[x]
        return x

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.towns = list(TOWNS[:self.n])
        order = rng.sample(self.towns, self.n)
        links = {tuple(sorted((order[i], rng.choice(order[:i])))) for i in range(1, self.n)}
        pairs = [(a, b) for i, a in enumerate(self.towns) for b in self.towns[i + 1:]]
        rng.shuffle(pairs)
        for p in pairs:
            if len(links) >= self.n_links:
                break
            links.add(p)
        costs = rng.sample(range(1, 6 + 4 * LEVEL), len(links))
        self.cost = dict(zip(sorted(links), costs))
        self.best = self._kruskal()
        self.best_cost = sum(self.cost[e] for e in self.best)
        self.built, self.turn = [], 0
        table = ", ".join(f"{a}-{b}: {c}" for (a, b), c in sorted(self.cost.items()))
        obs = (f"Towns {', '.join(self.towns)} must all be connected by cables. Candidate links "
               f"and their costs: {table}.\nBuild one link per turn, e.g. \\boxed{{{sorted(self.cost)[0][0]}-"
               f"{sorted(self.cost)[0][1]}}}. When every town is connected, the network must cost as "
               f"little as possible, or it is torn down. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _kruskal(self):
        parent, tree = {t: t for t in self.towns}, []
        for e in sorted(self.cost, key=self.cost.get):
            ra, rb = self._root(parent, e[0]), self._root(parent, e[1])
            if ra != rb:
                parent[ra] = rb
                tree.append(e)
        return tree

    def _link(self, text):
        s = "".join(ch for ch in text.upper() if ch not in " -,_/")
        if len(s) != 2 or s[0] == s[1]:
            return None
        e = tuple(sorted(s))
        return e if e in self.cost else None

    def step(self, action):
        self.turn += 1
        e = self._link(_boxed(action))
        reward, done = 0.0, False
        parent = {t: t for t in self.towns}
        for a, b in self.built:
            parent[self._root(parent, a)] = self._root(parent, b)
        if e is None:
            msg = "Name a candidate link by its two towns, e.g. \\boxed{A-B}."
        elif self._root(parent, e[0]) == self._root(parent, e[1]):
            msg = f"{e[0]} and {e[1]} are already connected; that link is refused."
        else:
            self.built.append(e)
            total = sum(self.cost[x] for x in self.built)
            msg = f"Built {e[0]}-{e[1]} (cost {self.cost[e]}); total so far {total}."
            if len(self.built) == self.n - 1:
                if total == self.best_cost:
                    msg, reward, done = msg + " Every town is connected at the lowest cost!", 1.0, True
                else:
                    msg += " Every town is connected, but a cheaper network exists; it is torn down."
                    self.built = []
        truncated = not done and self.turn >= self.max_turns
        shown = " ".join(f"{a}-{b}" for a, b in self.built) or "none"
        obs = f"{msg}\nBuilt links: {shown}.\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        if all(e in self.best for e in self.built):
            return [f"\\boxed{{{a}-{b}}}" for a, b in self.best if (a, b) not in self.built]
        plan, parent = [], {t: t for t in self.towns}  # finish (and lose) this attempt first
        for a, b in self.built:
            parent[self._root(parent, a)] = self._root(parent, b)
        for a, b in sorted(self.cost):
            if self._root(parent, a) != self._root(parent, b):
                parent[self._root(parent, a)] = self._root(parent, b)
                plan.append(f"\\boxed{{{a}-{b}}}")
        return plan + [f"\\boxed{{{a}-{b}}}" for a, b in self.best]
