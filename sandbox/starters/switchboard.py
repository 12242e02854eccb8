"""Causal_Inference: discover which switches toggle which lamps, then light every lamp."""

import itertools
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


class SwitchboardEnv:
    """Five switches and five lamps with hidden wiring: flipping a switch toggles a fixed, unknown
    set of lamps. Flip switches with \\boxed{flip K} and watch the lamps; light all of them to
    win. The wiring is drawn so that no combination of fewer than three flips lights every lamp."""

    N = 5

    def __init__(self, max_turns=15):
        self.max_turns = max_turns

    def _fewest_flips(self):
        for size in range(self.N + 1):
            for combo in itertools.combinations(range(self.N), size):
                lamps = list(self.lamps)
                for s in combo:
                    for lamp in self.wiring[s]:
                        lamps[lamp] = not lamps[lamp]
                if all(lamps):
                    return list(combo)
        return None

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.wiring = [sorted(rng.sample(range(self.N), rng.randint(1, 3))) for _ in range(self.N)]
            self.lamps = [rng.random() < 0.5 for _ in range(self.N)]
            best = self._fewest_flips()
            if best is not None and len(best) >= 3:
                break
        self.turn = 0
        obs = ("Five switches (1-5) control five lamps (A-E) through hidden wiring: flipping a switch "
               "toggles the same unknown set of lamps every time.\n"
               f"Lamps now: {self._render()}\n"
               "Flip a switch with \\boxed{flip K}. Light all five lamps to win. "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _render(self):
        return " ".join(f"{'ABCDE'[i]}={'on' if on else 'off'}" for i, on in enumerate(self.lamps))

    def step(self, action):
        self.turn += 1
        words = _boxed(action).lower().split()
        reward, done = 0.0, False
        if len(words) == 2 and words[0] == "flip" and words[1] in {"1", "2", "3", "4", "5"}:
            s = int(words[1]) - 1
            for lamp in self.wiring[s]:
                self.lamps[lamp] = not self.lamps[lamp]
            msg = f"You flipped switch {s + 1}."
            if all(self.lamps):
                msg, reward, done = msg + " Every lamp is lit!", 1.0, True
        else:
            msg = "Use \\boxed{flip K} with K from 1 to 5."
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\nLamps: {self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return [f"\\boxed{{flip {s + 1}}}" for s in self._fewest_flips()]
