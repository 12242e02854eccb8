"""Optimization: order jobs on one machine to minimise the total weighted completion time.

Level L: min(11, L + 1) jobs with durations 1..3 + L (at most 15); every weight is 1 up to
level 3 (shortest job first is optimal), from level 4 on weights go up to 1 + L // 2 (at
most 7). Instances have no ties, so one order is best. A winning play schedules every job
once, in the best order (L + 1 turns); a finished schedule that is not the best is cleared.
"""

import random

LEVEL = 1
NAMES = "ABCDEFGHIJK"


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


class JobOrderEnv:
    """Jobs with a duration and a weight run one after another on one machine. A job's completion
    time is when it finishes; the cost of a schedule is the sum of weight x completion time.
    Schedule the next job each turn with \\boxed{letter}; when every job is placed, a schedule of
    the lowest possible cost wins, any other is reported and cleared."""

    def __init__(self, max_turns=None):
        self.n = min(11, LEVEL + 1)
        self.max_dur = min(15, 3 + LEVEL)
        self.max_weight = 1 if LEVEL <= 3 else min(7, 1 + LEVEL // 2)
        self.max_turns = max_turns or min(25, 2 * self.n + 2)

    def _cost(self, order):
        t = total = 0
        for j in order:
            t += self.dur[j]
            total += self.weight[j] * t
        return total

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.jobs = list(NAMES[:self.n])
        while True:
            self.dur = {j: rng.randint(1, self.max_dur) for j in self.jobs}
            self.weight = {j: rng.randint(1, self.max_weight) for j in self.jobs}
            ratios = [self.dur[j] / self.weight[j] for j in self.jobs]
            if len(set(ratios)) == self.n:
                break
        self.best_cost = self._cost(self._best())
        self.order, self.turn, self.attempts = [], 0, 0
        table = "\n".join(f"  {j}: duration {self.dur[j]}, weight {self.weight[j]}" for j in self.jobs)
        obs = (f"{self.n} jobs run one at a time on one machine, starting at time 0:\n{table}\n"
               "Cost = sum over jobs of weight x completion time. Build the schedule of lowest "
               "cost: each turn, name the next job, e.g. \\boxed{A}. A finished schedule that is "
               f"not the cheapest is cleared. You have {self.max_turns} turns.")
        return obs, {"turn": 0}

    def _best(self):
        return sorted(self.jobs, key=lambda j: self.dur[j] / self.weight[j])

    def step(self, action):
        self.turn += 1
        job = _boxed(action).strip(" .").upper()
        reward, done = 0.0, False
        if job not in self.jobs:
            msg = f"Name one job: {', '.join(self.jobs)}."
        elif job in self.order:
            msg = f"Job {job} is already scheduled."
        else:
            self.order.append(job)
            msg = f"Job {job} runs next, finishing at time {sum(self.dur[j] for j in self.order)}."
            if len(self.order) == self.n:
                cost = self._cost(self.order)
                if cost == self.best_cost:
                    msg, reward, done = msg + f" Schedule {''.join(self.order)} costs {cost}: the cheapest!", 1.0, True
                else:
                    msg += (f" Schedule {''.join(self.order)} costs {cost}, but a cheaper one exists; "
                            "the schedule is cleared.")
                    self.order, self.attempts = [], self.attempts + 1
        truncated = not done and self.turn >= self.max_turns
        left = [j for j in self.jobs if j not in self.order]
        obs = (f"{msg}\nScheduled: {' '.join(self.order) or 'nothing yet'}; left: {' '.join(left) or 'none'}.\n"
               f"Turn {self.turn}/{self.max_turns}.")
        return obs, reward, done, truncated, {"turn": self.turn}

    def solution(self):
        best = self._best()
        if self.order == best[:len(self.order)]:
            return [f"\\boxed{{{j}}}" for j in best[len(self.order):]]
        rest = [j for j in self.jobs if j not in self.order]  # finish (and lose) this attempt first
        return [f"\\boxed{{{j}}}" for j in rest + best]
