"""Logical_Deduction: break a hidden colour code from exact / misplaced feedback (Mastermind)."""

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


class CodeBreakerEnv:
    """Guess a hidden code of 4 letters from A-F (repeats allowed). Each guess is scored with the
    number of exact matches and of right letters in the wrong place."""

    LETTERS = "ABCDEF"
    LENGTH = 4

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.code = "".join(rng.choice(self.LETTERS) for _ in range(self.LENGTH))
        self.turn, self.history = 0, []
        obs = (
            f"A secret code of {self.LENGTH} letters from {self.LETTERS} (repeats allowed) is hidden.\n"
            "Guess it: each guess is answered with 'exact' (right letter, right place) and "
            "'misplaced' (right letter, wrong place).\n"
            f"Write a guess like \\boxed{{ABCD}}. You have {self.max_turns} guesses."
        )
        return obs, {"turn": 0}

    @staticmethod
    def score(guess, code):
        exact = sum(g == c for g, c in zip(guess, code))
        common = sum(min(guess.count(ch), code.count(ch)) for ch in set(guess))
        return exact, common - exact

    def step(self, action):
        self.turn += 1
        guess = _boxed(action).upper().replace(" ", "").replace(",", "")
        reward, done = 0.0, False
        if len(guess) != self.LENGTH or any(ch not in self.LETTERS for ch in guess):
            msg = f"A guess is exactly {self.LENGTH} letters from {self.LETTERS}, e.g. \\boxed{{AABC}}."
        else:
            exact, misplaced = self.score(guess, self.code)
            self.history.append(f"{guess}: exact={exact} misplaced={misplaced}")
            msg = f"{guess} -> exact={exact}, misplaced={misplaced}."
            if exact == self.LENGTH:
                msg, reward, done = msg + " You broke the code!", 1.0, True
        truncated = not done and self.turn >= self.max_turns
        obs = msg + "\nHistory:\n" + "\n".join(self.history[-10:]) + f"\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        # Two probing guesses that are not the code, then the code itself.
        probes = [g for g in ("AABB", "CCDD", "EEFF", "ABCD") if g != self.code][:2]
        return [f"\\boxed{{{g}}}" for g in probes + [self.code]]
