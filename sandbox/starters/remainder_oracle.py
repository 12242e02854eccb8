"""Mathematical_Reasoning: recover a hidden number from its remainders (Chinese remainder theorem)."""

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


class RemainderOracleEnv:
    """A hidden integer x in [0, 1000). Ask for x mod m (each modulus at most once), then answer.

    No two allowed moduli have a product of 1000 or more, so at least three questions are needed
    before the answer is determined: the episode takes at least four interactions.
    """

    MODULI = (3, 4, 5, 7, 8, 9, 11, 13)

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.x = self.rng.randrange(1000)
        self.asked = {}
        self.turn = 0
        obs = (
            "A secret integer x satisfies 0 <= x < 1000.\n"
            f"You may ask for the remainder of x modulo one of {list(self.MODULI)} "
            "(each modulus once) with \\boxed{mod M}, and answer with \\boxed{answer N}.\n"
            f"You have {self.max_turns} turns. Put every action inside \\boxed{{...}}."
        )
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        words = _boxed(action).lower().split()
        reward, done = 0.0, False
        if len(words) == 2 and words[0] == "mod" and words[1].isdigit():
            m = int(words[1])
            if m not in self.MODULI:
                msg = f"Modulus {m} is not allowed; choose from {list(self.MODULI)}."
            elif m in self.asked:
                msg = f"You already know x mod {m} = {self.asked[m]}."
            else:
                self.asked[m] = self.x % m
                msg = f"x mod {m} = {self.asked[m]}."
        elif len(words) == 2 and words[0] == "answer" and words[1].isdigit():
            if int(words[1]) == self.x:
                msg, reward, done = f"Correct, x = {self.x}.", 1.0, True
            else:
                msg = f"{words[1]} is not x."
        else:
            msg = "Unknown action. Use \\boxed{mod M} or \\boxed{answer N}."
        known = ", ".join(f"x mod {m} = {r}" for m, r in sorted(self.asked.items())) or "nothing yet"
        truncated = not done and self.turn >= self.max_turns
        return f"{msg}\nKnown: {known}. Turn {self.turn}/{self.max_turns}.", reward, done, truncated, {"turn": self.turn}

    def solution(self):
        return ["\\boxed{mod 8}", "\\boxed{mod 11}", "\\boxed{mod 13}", f"\\boxed{{answer {self.x}}}"]
