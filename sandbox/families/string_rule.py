"""Pattern_Recognition: infer a hidden string transformation from examples and apply it.

Level L: the rule chains 1 (levels 1-3), 2 (4-7) or 3 (8+) operations from a library that
grows from 3 operations at level 1 to 8 at level 6; words have min(8, 3 + L // 2) letters;
2 queries at level 1, 3 at levels 2-5, 4 from level 6. Examples are added until every rule of
the library consistent with them gives the same answers to the queries. A winning play
answers each query once.
"""

import itertools
import random

LEVEL = 1
LETTERS = "abcdefghijklmnopqrstuvwxyz"


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


def _shift(s, k):
    return "".join(LETTERS[(LETTERS.index(ch) + k) % 26] for ch in s)


OPS = [
    ("reverse", lambda s: s[::-1]),
    ("shift+1", lambda s: _shift(s, 1)),
    ("rotate", lambda s: s[1:] + s[:1]),
    ("swap_pairs", lambda s: "".join(s[i:i + 2][::-1] for i in range(0, len(s), 2))),
    ("shift-1", lambda s: _shift(s, -1)),
    ("double_first", lambda s: s[:1] + s),
    ("drop_last", lambda s: s[:-1]),
    ("swap_ends", lambda s: s[-1:] + s[1:-1] + s[:1] if len(s) > 1 else s),
]


class StringRuleEnv:
    """Examples show words before and after a hidden rule (a few simple letter operations in a
    row). Each turn, answer one query: the query word after the rule, in \\boxed{...}. A wrong
    answer is refused and the same query stays."""

    def __init__(self, max_turns=None):
        self.depth = 1 if LEVEL <= 3 else 2 if LEVEL <= 7 else 3
        self.ops = OPS[:min(len(OPS), 2 + LEVEL)]
        self.length = min(8, 3 + LEVEL // 2)
        self.n_queries = 2 if LEVEL == 1 else 3 if LEVEL <= 5 else 4
        self.max_turns = max_turns or min(25, self.n_queries + 3 + min(LEVEL, 12) // 4)
        self.rules = [r for d in range(1, self.depth + 1) for r in itertools.product(range(len(self.ops)), repeat=d)]

    def _apply(self, rule, word):
        for i in rule:
            word = self.ops[i][1](word)
        return word

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            rule = tuple(rng.randrange(len(self.ops)) for _ in range(self.depth))
            words = ["".join(rng.choice(LETTERS) for _ in range(self.length)) for _ in range(10)]
            outs = [self._apply(rule, w) for w in words]
            if len(set(words)) < 10 or len(set(outs)) < 10 or any(o == w for o, w in zip(outs, words)):
                continue
            queries, examples = words[:self.n_queries], []
            consistent = self.rules
            for w in words[self.n_queries:]:
                examples.append(w)
                consistent = [r for r in consistent if self._apply(r, w) == self._apply(rule, w)]
                answers = {tuple(self._apply(r, q) for q in queries) for r in consistent}
                if len(examples) >= 2 and len(answers) == 1:
                    break
            if len(answers) == 1:
                break
        self.rule, self.queries, self.examples = rule, queries, examples
        self.answered, self.turn = 0, 0
        shown = "\n".join(f"  {w} -> {self._apply(rule, w)}" for w in examples)
        obs = ("A hidden rule (a few simple letter operations applied in order) turns each word into "
               f"another:\n{shown}\nApply the same rule to each query; answer one per turn inside "
               f"\\boxed{{...}}.\nQuery 1: {queries[0]}. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def step(self, action):
        self.turn += 1
        text = _boxed(action).lower().replace(" ", "")
        reward, done = 0.0, False
        query = self.queries[self.answered]
        if not text.isalpha() or len(text) > 20:
            msg = "Answer with the transformed word only, letters a-z, e.g. \\boxed{abc}."
        elif text != self._apply(self.rule, query):
            msg = f"No, '{text}' is not what the rule makes of {query}."
        else:
            self.answered += 1
            msg = f"Right: {query} -> {text}."
            if self.answered == self.n_queries:
                msg, reward, done = msg + " All queries answered!", 1.0, True
            else:
                msg += f" Query {self.answered + 1}: {self.queries[self.answered]}."
        truncated = not done and self.turn >= self.max_turns
        shown = "; ".join(f"{w} -> {self._apply(self.rule, w)}" for w in self.examples)
        obs = f"{msg}\nExamples: {shown}\nTurn {self.turn}/{self.max_turns}."
        return obs, reward, done, truncated, {"turn": self.turn, "answered": self.answered}

    def solution(self):
        return [f"\\boxed{{{self._apply(self.rule, q)}}}" for q in self.queries[self.answered:]]
