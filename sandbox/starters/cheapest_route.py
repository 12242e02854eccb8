"""Optimization: travel between two towns along the cheapest route of a road network."""

import heapq
import random

TOWNS = ["Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir", "Ginkgo", "Hazel", "Ivy"]


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


class CheapestRouteEnv:
    """Nine towns joined by toll roads. Drive from the start to the destination one road at a time
    with \\boxed{TOWN}. Arriving by the cheapest route wins; arriving by a dearer one sends you back
    to the start with your tolls reset. Networks are drawn until the cheapest route uses at least
    three roads."""

    def __init__(self, max_turns=24):
        self.max_turns = max_turns

    def _cheapest(self, src):
        dist, prev, heap = {src: 0}, {}, [(0, src)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist[u]:
                continue
            for v, w in self.roads[u].items():
                if d + w < dist.get(v, 10**9):
                    dist[v], prev[v] = d + w, u
                    heapq.heappush(heap, (d + w, v))
        return dist, prev

    def _path(self, src, dst):
        _, prev = self._cheapest(src)
        path = [dst]
        while path[-1] != src:
            path.append(prev[path[-1]])
        return path[::-1]

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.roads = {t: {} for t in TOWNS}
            for a in TOWNS:
                for b in rng.sample(TOWNS, 3):
                    if a != b:
                        toll = rng.randint(1, 9)
                        self.roads[a][b] = self.roads[b][a] = toll
            self.start, self.goal = rng.sample(TOWNS, 2)
            dist, _ = self._cheapest(self.start)
            if self.goal not in dist or self.goal in self.roads[self.start]:
                continue
            path = self._path(self.start, self.goal)
            if len(path) >= 4:
                break
        self.best = dist[self.goal]
        self.here, self.spent, self.turn = self.start, 0, 0
        roads = "\n".join(f"  {a} - {b}: {w}" for a in TOWNS for b, w in sorted(self.roads[a].items()) if a < b)
        obs = (f"Toll roads:\n{roads}\nYou are in {self.start}; reach {self.goal} paying as little "
               "toll as possible.\nDrive to a neighbouring town with \\boxed{TOWN}. Arriving by a "
               f"route that is not the cheapest sends you back to {self.start}. "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        town = _boxed(action).strip().capitalize()
        reward, done = 0.0, False
        if town not in self.roads.get(self.here, {}):
            msg = f"No road from {self.here} to {town[:20]}."
        else:
            self.spent += self.roads[self.here][town]
            self.here = town
            msg = f"You drive to {town} (tolls so far: {self.spent})."
            if town == self.goal:
                if self.spent == self.best:
                    msg, reward, done = msg + " Cheapest route found!", 1.0, True
                else:
                    msg += f" A cheaper route exists; back to {self.start}."
                    self.here, self.spent = self.start, 0
        truncated = not done and self.turn >= self.max_turns
        nbrs = ", ".join(f"{b} ({w})" for b, w in sorted(self.roads[self.here].items()))
        obs = f"{msg}\nYou are in {self.here}; roads to: {nbrs}.\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{t}}}" for t in self._path(self.here, self.goal)[1:]]
