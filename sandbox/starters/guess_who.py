"""Logical_Deduction: identify a hidden suspect by asking yes/no questions about attributes."""

import random

NAMES = ["Ada", "Bruno", "Cleo", "Dmitri", "Elena", "Farid", "Greta", "Hugo",
         "Ines", "Jonas", "Kemal", "Lena", "Mateo", "Nora", "Oskar", "Priya"]
ATTRIBUTES = {"hat": ["yes", "no"], "glasses": ["yes", "no"], "hair": ["dark", "fair"],
              "coat": ["red", "blue"], "age": ["young", "old"]}


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


class GuessWhoEnv:
    """Sixteen suspects with five binary attributes; one is the culprit. Ask
    \\boxed{ask ATTRIBUTE VALUE} (answered yes/no) or accuse with \\boxed{accuse NAME}.
    A wrong accusation costs a turn. Every suspect has a distinct combination of attributes, so
    well-chosen questions (about four) single out the culprit."""

    def __init__(self, max_turns=10):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        combos = [(h, g, hr, c, a) for h in ATTRIBUTES["hat"] for g in ATTRIBUTES["glasses"]
                  for hr in ATTRIBUTES["hair"] for c in ATTRIBUTES["coat"] for a in ATTRIBUTES["age"]]
        rng.shuffle(combos)
        keys = list(ATTRIBUTES)
        self.suspects = {n: dict(zip(keys, combo)) for n, combo in zip(NAMES, combos)}
        self.culprit = rng.choice(NAMES)
        self.turn = 0
        table = "\n".join(f"  {n:7s} " + ", ".join(f"{k}={v}" for k, v in a.items())
                          for n, a in self.suspects.items())
        obs = (
            "One of these suspects is the culprit:\n" + table + "\n"
            "Ask a yes/no question with \\boxed{ask ATTRIBUTE VALUE} (e.g. \\boxed{ask hair dark}), "
            "or accuse with \\boxed{accuse NAME}.\n"
            f"You have {self.max_turns} turns. Put every action inside \\boxed{{...}}."
        )
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        words = _boxed(action).split()
        reward, done = 0.0, False
        if len(words) == 3 and words[0].lower() == "ask":
            key, value = words[1].lower(), words[2].lower()
            if key in ATTRIBUTES and value in ATTRIBUTES[key]:
                answer = "yes" if self.suspects[self.culprit][key] == value else "no"
                msg = f"Is the culprit's {key} {value}? {answer.capitalize()}."
            else:
                msg = "Unknown attribute or value. Attributes: " + ", ".join(
                    f"{k} ({'/'.join(v)})" for k, v in ATTRIBUTES.items()) + "."
        elif len(words) == 2 and words[0].lower() == "accuse":
            name = words[1].capitalize()
            if name == self.culprit:
                msg, reward, done = f"{name} confesses. Case closed!", 1.0, True
            elif name in self.suspects:
                msg = f"{name} has an alibi. Keep investigating."
            else:
                msg = f"There is no suspect called {words[1][:20]}."
        else:
            msg = "Use \\boxed{ask ATTRIBUTE VALUE} or \\boxed{accuse NAME}."
        truncated = not done and self.turn >= self.max_turns
        return f"{msg} Turn {self.turn}/{self.max_turns}.", reward, done, truncated, {"turn": self.turn}

    def solution(self):
        attrs = self.suspects[self.culprit]
        return [f"\\boxed{{ask {k} {v}}}" for k, v in attrs.items()] + [f"\\boxed{{accuse {self.culprit}}}"]
