"""Causal_Inference: find the activator and the inhibitor of a trait by controlled experiments."""

import random

GENES = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]


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


class GeneKnockoutEnv:
    """Six genes; the trait appears exactly when a hidden activator gene is ON and a hidden
    inhibitor gene is OFF. Run experiments by choosing which genes are ON, e.g.
    \\boxed{test alpha gamma}, and observe the trait; then name both with
    \\boxed{answer ACTIVATOR INHIBITOR}. A field survey is shown first, but in the wild the genes
    are correlated, so it cannot tell the two roles apart on its own."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.activator, self.inhibitor = rng.sample(GENES, 2)
        self.turn = 0
        # Confounded survey: activator and inhibitor are always ON together in the wild.
        rows = []
        for _ in range(4):
            on = {g for g in GENES if rng.random() < 0.5}
            if self.activator in on:
                on.add(self.inhibitor)
            else:
                on.discard(self.inhibitor)
            rows.append(f"  ON: {', '.join(sorted(on)) or 'none':45s} trait: {'yes' if self._trait(on) else 'no'}")
        obs = ("Genes: " + ", ".join(GENES) + ". One activator gene causes a trait unless one "
               "inhibitor gene is also ON.\nField survey (genes are correlated in the wild):\n"
               + "\n".join(rows) + "\n"
               "Experiment with \\boxed{test GENE GENE ...} (the listed genes ON, the rest OFF; "
               "\\boxed{test} for none), then answer with \\boxed{answer ACTIVATOR INHIBITOR}. "
               f"You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _trait(self, on):
        return self.activator in on and self.inhibitor not in on

    def step(self, action):
        self.turn += 1
        words = _boxed(action).lower().replace(",", " ").split()
        reward, done = 0.0, False
        if words and words[0] == "test" and all(w in GENES for w in words[1:]) \
                and len(set(words[1:])) == len(words) - 1:
            on = set(words[1:])
            msg = f"With {', '.join(sorted(on)) or 'no genes'} ON, the trait is {'present' if self._trait(on) else 'absent'}."
        elif len(words) == 3 and words[0] == "answer" and words[1] in GENES and words[2] in GENES:
            if (words[1], words[2]) == (self.activator, self.inhibitor):
                msg, reward, done = "Both roles identified correctly!", 1.0, True
            else:
                msg = "That is not the right pair of roles."
        else:
            msg = "Use \\boxed{test GENE ...} or \\boxed{answer ACTIVATOR INHIBITOR}."
        truncated = not done and self.turn >= self.max_turns
        return f"{msg} Turn {self.turn}/{self.max_turns}.", reward, done, truncated, {"turn": self.turn}

    def solution(self):
        others = [g for g in GENES if g not in (self.activator, self.inhibitor)]
        return [f"\\boxed{{test {self.activator}}}", f"\\boxed{{test {self.activator} {self.inhibitor}}}",
                f"\\boxed{{test {' '.join(others)}}}", f"\\boxed{{answer {self.activator} {self.inhibitor}}}"]
