"""Mathematical_Reasoning: name two-digit numbers whose digits add up to a given sum."""

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


class DigitSumEnv:
    """Three rounds. Each round gives a digit sum S; answer with a two-digit number (10 to 99)
    whose two digits add up to S, never one you have already used."""

    ROUNDS = 3

    def __init__(self, max_turns=8):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.sums = [rng.randint(4, 15) for _ in range(self.ROUNDS)]
        self.used, self.round, self.turn = [], 0, 0
        obs = ("Three rounds: each gives a digit sum S. Answer with a two-digit number (10 to 99) "
               "whose digits add up to S, e.g. for S = 5 \\boxed{23} (2 + 3 = 5). A number may be "
               f"used only once.\nRound 1: S = {self.sums[0]}. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        text = _boxed(action).strip(" .")
        reward, done = 0.0, False
        s = self.sums[self.round]
        if not (text.isdigit() and len(text) == 2 and text[0] != "0"):
            msg = "Answer with one two-digit number from 10 to 99, e.g. \\boxed{23}."
        elif int(text) in self.used:
            msg = f"{text} was already used; pick another."
        elif int(text[0]) + int(text[1]) != s:
            msg = f"The digits of {text} add up to {int(text[0]) + int(text[1])}, not {s}."
        else:
            self.used.append(int(text))
            self.round += 1
            msg = f"Yes: {text[0]} + {text[1]} = {s}."
            if self.round == self.ROUNDS:
                msg, reward, done = msg + " All rounds done!", 1.0, True
            else:
                msg += f" Round {self.round + 1}: S = {self.sums[self.round]}."
        truncated = not done and self.turn >= self.max_turns
        obs = f"{msg}\nUsed: {', '.join(map(str, self.used)) or 'none'}. Turn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        used, out = list(self.used), []
        for s in self.sums[self.round:]:
            n = next(x for x in range(10, 100) if x // 10 + x % 10 == s and x not in used)
            used.append(n)
            out.append(f"\\boxed{{{n}}}")
        return out
