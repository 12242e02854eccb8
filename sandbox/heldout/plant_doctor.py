"""Causal_Inference: find which growing conditions a plant's health depends on, and fix them."""

import random

FACTORS = ["water", "light", "soil", "warmth"]
LEVELS = ["very low", "low", "medium", "high", "very high"]


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


class PlantDoctorEnv:
    """A plant's health (0-10) depends on only two of four conditions (water, light, soil,
    warmth), each best at a hidden level; the other two have no effect. Change one condition a
    step per turn with \\boxed{more water} or \\boxed{less light}; bring the health to 10."""

    def __init__(self, max_turns=14):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.causes = rng.sample(FACTORS, 2)
            self.ideal = {f: rng.randint(0, 4) for f in self.causes}
            self.level = {f: rng.randint(0, 4) for f in FACTORS}
            gaps = [abs(self.level[f] - self.ideal[f]) for f in self.causes]
            if min(gaps) >= 1 and sum(gaps) >= 3:
                break
        self.turn = 0
        obs = ("A plant's health (0 to 10) depends on only two of its four growing conditions; each of "
               "those two is best at one particular level, and the other two conditions do nothing.\n"
               f"{self._render()}\nChange one condition by one step per turn: \\boxed{{more water}}, "
               "\\boxed{less light}, and so on (water, light, soil, warmth). Bring the health to 10. "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _health(self):
        return 10 - sum(abs(self.level[f] - self.ideal[f]) for f in self.causes)

    def _render(self):
        now = ", ".join(f"{f} {LEVELS[self.level[f]]}" for f in FACTORS)
        return f"Conditions: {now}. Health: {self._health()}/10."

    def step(self, action):
        self.turn += 1
        words = _boxed(action).lower().split()
        reward, done = 0.0, False
        if len(words) != 2 or words[0] not in ("more", "less") or words[1] not in FACTORS:
            msg = "Use \\boxed{more X} or \\boxed{less X} with X one of water, light, soil, warmth."
        else:
            f, delta = words[1], 1 if words[0] == "more" else -1
            if not 0 <= self.level[f] + delta <= 4:
                msg = f"The {f} is already {LEVELS[self.level[f]]}."
            else:
                self.level[f] += delta
                msg = f"The {f} is now {LEVELS[self.level[f]]}."
                if self._health() == 10:
                    msg, reward, done = msg + " The plant is thriving!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\n{self._render()}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        out = []
        for f in self.causes:
            d = self.ideal[f] - self.level[f]
            out += [f"\\boxed{{{'more' if d > 0 else 'less'} {f}}}"] * abs(d)
        return out
