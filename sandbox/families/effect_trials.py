"""Causal_Inference: measure the effect of each treatment by controlled trials.

Level L: min(6, 1 + L // 2) treatments with hidden additive effects on a yield, from -(2 + L)
to 2 + L (at most 14; zero allowed from level 3); the baseline yield (no treatment) is told
up to level 4 and must be measured from level 5 on. A winning play runs one trial per
treatment (plus one with none from level 5), then states each effect: 2 turns at level 1,
13 at level 10.
"""

import random

LEVEL = 1
NAMES = "ABCDEF"


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


class EffectTrialsEnv:
    """A field's yield is a hidden baseline plus the hidden effect of each treatment applied.
    \\boxed{trial A C} grows a plot with treatments A and C (\\boxed{trial none}: none) and
    reports its yield; \\boxed{effect A -3} states that applying A changes the yield by -3, once A
    has been in a trial. State every treatment's effect correctly to win; a wrong statement is
    refused."""

    def __init__(self, max_turns=None):
        self.names = list(NAMES[:min(6, 1 + LEVEL // 2)])
        self.span = min(14, 2 + LEVEL)
        self.baseline_shown = LEVEL <= 4
        n = len(self.names)
        self.max_turns = max_turns or min(25, 2 * n + (not self.baseline_shown) + 4)

    def reset(self, seed=None):
        rng = random.Random(seed)
        low = 0 if LEVEL >= 3 else 1
        self.effect = {}
        for x in self.names:
            size = rng.randint(low, self.span)
            self.effect[x] = size * rng.choice((1, -1))
        self.baseline = rng.randint(self.span + 5, self.span + 25)
        self.known, self.tried, self.turn = set(), set(), 0
        told = (f"With no treatment the yield is {self.baseline}." if self.baseline_shown
                else "The yield with no treatment is not told.")
        which = (f"Treatments {', '.join(self.names)} each change" if len(self.names) > 1
                 else "Treatment A changes")
        pair = " ".join(self.names[:2])
        obs = (f"{which} a field's yield by a fixed hidden amount (effects add up). {told}\n"
               f"\\boxed{{trial {pair}}} grows a plot with "
               f"treatment{'s' * (len(self.names) > 1)} {' and '.join(self.names[:2])} "
               "(\\boxed{trial none} with none) and reports its yield. \\boxed{effect A -3} states "
               "that A changes the yield by -3 (only once A has been in a trial). "
               f"State every effect correctly to win. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        words = _boxed(action).upper().replace(",", " ").replace("=", " ").split()
        reward, done = 0.0, False
        if words and words[0] == "TRIAL" and (words[1:] == ["NONE"] or (
                0 < len(words) - 1 <= len(self.names) and set(words[1:]) <= set(self.names)
                and len(set(words[1:])) == len(words) - 1)):
            used = [w for w in words[1:] if w != "NONE"]
            self.tried.update(used)
            yield_ = self.baseline + sum(self.effect[x] for x in used)
            msg = f"Trial with {', '.join(used) or 'no treatment'}: yield {yield_}."
        elif (len(words) == 3 and words[0] == "EFFECT" and words[1] in self.names
              and words[2].lstrip("+-").isdigit() and len(words[2]) < 6):
            x, value = words[1], int(words[2])
            if x in self.known:
                msg = f"The effect of {x} is already known: {self.effect[x]:+d}."
            elif x not in self.tried:
                msg = f"Run a trial with {x} before stating its effect."
            elif value != self.effect[x]:
                msg = f"No, {x} does not change the yield by {value:+d}."
            else:
                self.known.add(x)
                msg = f"Right: {x} changes the yield by {value:+d}."
                if len(self.known) == len(self.names):
                    msg, reward, done = msg + " Every effect is known!", 1.0, True
        else:
            msg = "Use \\boxed{trial A B ...}, \\boxed{trial none} or \\boxed{effect X N}."
        truncated = not done and self.turn >= self.max_turns
        known = ", ".join(f"{x} {self.effect[x]:+d}" for x in self.names if x in self.known) or "none"
        obs = f"{msg}\nEffects stated: {known}.\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        left = [x for x in self.names if x not in self.known]
        trials = [] if self.baseline_shown else ["\\boxed{trial none}"]
        trials += [f"\\boxed{{trial {x}}}" for x in left]  # (again, if tried already: harmless)
        return trials + [f"\\boxed{{effect {x} {self.effect[x]}}}" for x in left]
