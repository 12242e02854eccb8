"""Optimization: choose the meeting spot on a street that minimises everyone's total walk."""

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


class MeetingPointEnv:
    """Three rounds. Friends live at house numbers along one straight street (house k is at
    position k). Pick the house number where they should meet so that the sum of everyone's
    walking distance is as small as possible, e.g. \\boxed{17}."""

    ROUNDS = 3

    def __init__(self, max_turns=7):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:  # no one spot is best in every round, so repeating it does not win
            self.rounds = [sorted(rng.sample(range(1, 41), rng.choice((3, 5, 5, 6)))) for _ in range(self.ROUNDS)]
            common = set.intersection(*(self._best_spots(houses) for houses in self.rounds))
            if not common:
                break
        self.round, self.turn = 0, 0
        obs = ("Three rounds. Friends live along a straight street; house k is at position k. Choose "
               "the house number where they meet so that the total walking distance of all friends "
               "is as small as possible, e.g. \\boxed{17}.\n"
               f"{self._render()}\nYou have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        return f"Round {self.round + 1}: friends at houses {', '.join(map(str, self.rounds[self.round]))}."

    @staticmethod
    def _best_spots(houses):
        walks = {s: sum(abs(h - s) for h in houses) for s in range(1, 41)}
        return {s for s, w in walks.items() if w == min(walks.values())}

    def _walk(self, spot):
        return sum(abs(h - spot) for h in self.rounds[self.round])

    def step(self, action):
        self.turn += 1
        text = _boxed(action).strip(" .")
        reward, done = 0.0, False
        if not text.isdigit() or not 1 <= int(text) <= 40:
            msg = "Name one house number from 1 to 40, e.g. \\boxed{17}."
        else:
            spot = int(text)
            best = min(self._walk(s) for s in range(1, 41))
            if self._walk(spot) != best:
                msg = f"Meeting at {spot}, they would walk {self._walk(spot)} in total; a better spot exists."
            else:
                msg = f"Yes: meeting at {spot}, they walk {best} in total, the least possible."
                self.round += 1
                if self.round == self.ROUNDS:
                    msg, reward, done = msg + " All rounds done!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        if not done:
            msg += "\n" + self._render()
        obs = f"{msg}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{{houses[(len(houses) - 1) // 2]}}}" for houses in self.rounds[self.round:]]
