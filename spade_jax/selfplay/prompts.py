"""Prompts for the three uses of the one policy: designer, hint writer, agent (docs/method.md §1–4, §8).

Each function returns chat messages; the tokenizer's chat template renders them. Texts are kept
here, as data, so an ablation that changes a prompt changes one place.
"""

from __future__ import annotations

import re
from typing import Sequence

from spade_jax.selfplay import memory as memory_lib

Message = dict[str, str]

SKILL_DESCRIPTIONS = {
    "Mathematical_Reasoning":
        "arithmetic, number theory, algebra or counting that the player has to work out step "
        "by step before acting",
    "Logical_Deduction":
        "inferring a hidden configuration from clues and feedback by ruling possibilities out",
    "Spatial_Reasoning":
        "moving through or rearranging things on a grid, map or board while keeping track of "
        "positions and directions",
    "Pattern_Recognition":
        "discovering the rule behind a sequence, grid or transformation and applying it to new "
        "cases",
    "Optimization":
        "choosing among options under constraints to reach the best achievable value, where "
        "greedy choices are not always enough",
    "Causal_Inference":
        "intervening on a hidden system and working out which causes produce which effects",
}

_CONTRACT = """\
Rules for the program:
- Define exactly one class whose name ends in `Env`. It must be constructible with no arguments (a `max_turns` keyword argument with a default is fine).
- `reset(self, seed=None)` returns `(observation, info)`: a non-empty string that explains the task, lists the actions the player can take, and says that every action goes inside \\boxed{{...}}; and a dict.
- `step(self, action)` returns `(observation, reward, terminated, truncated, info)`. Read the player's action from the last \\boxed{{...}} in `action`, falling back to the raw text.
- The reward is a float in [0, 1]: exactly 1.0 when the goal is reached, a smaller value for partial progress, 0.0 otherwise. Set `terminated=True` only when the goal is reached and `truncated=True` when your own turn limit runs out.
- Reaching the goal must take at least {min_turns} interactions. Guessing, repeating one action, or sending many answers at once must not win.
- Keep the hidden state inside the object. All randomness comes from `random.Random(seed)` created in `reset`, so the same seed and the same actions always give the same transcript.
- Use only the Python standard library (math, random, re, json, collections, itertools, ...). No files, network, subprocesses or threads.
- Optionally define `solution(self)`, returning a list of actions that wins from the current reset."""

_ANSWER_FORMAT = ("Answer with the complete program in a single ```python code block and "
                  "nothing else.")


def _code_block(code: str) -> str:
  return f"```python\n{code.rstrip()}\n```"


def designer_reply(program: str) -> str:
  """A program written out as the designer's answer asks for it (a replayed designer's reply)."""
  return _code_block(program)


def memory_block(positives: Sequence[memory_lib.Record],
                 negatives: Sequence[memory_lib.Record], few_shots: Sequence[str]) -> str:
  """The §8 memory section: frontier examples to build on, saturated ones to avoid. While the
  memory has nothing for this skill, hand-written environments show the expected format."""
  parts = []
  if positives:
    parts.append("Environments you wrote earlier for this skill that sat at the player's "
                 "frontier (sometimes won, and a hint helped). Build something new in the same "
                 "spirit:")
    for r in positives:
      parts.append(f"Win rate {r.win_rate:.2f}, hint gain {r.regret:+.2f}:\n{_code_block(r.code)}")
  elif few_shots:
    parts.append("An example of a well-formed environment (for the format only; design a "
                 "different game):")
    parts.extend(_code_block(c) for c in few_shots)
  for r in negatives:
    how = "always" if r.win_rate > 0.5 else "never"
    parts.append(f"Avoid environments like this one: the player {how} won it (win rate "
                 f"{r.win_rate:.2f}), so nothing was learned:\n{_code_block(r.code)}")
  return "\n\n".join(parts)


def designer(skill: str, document: str | None, mem_block: str, min_turns: int) -> list[Message]:
  """The environment designer's prompt; `document=None` gives the skill-only ablation."""
  if skill not in SKILL_DESCRIPTIONS:
    raise ValueError(f"unknown skill {skill!r}; known: {sorted(SKILL_DESCRIPTIONS)}")
  parts = [
      "You design interactive text environments that train a reasoning player. Write one "
      "Python program that implements a multi-turn game.",
      f"Skill to exercise: {skill.replace('_', ' ')} — {SKILL_DESCRIPTIONS[skill]}.",
  ]
  if document is not None:
    parts.append(
        "Ground the game in the source material below: take a rule, structure or quantity from "
        "it and make it the core mechanic. The player never sees the text, so do not ask about "
        f"the text itself.\n<source>\n{document}\n</source>")
  parts.append(_CONTRACT.format(min_turns=min_turns))
  if mem_block:
    parts.append(mem_block)
  parts.append(_ANSWER_FORMAT)
  return [{"role": "user", "content": "\n\n".join(parts)}]


def hint_writer(code: str) -> list[Message]:
  """Asks for a 1–3 sentence strategy hint that does not give the answer away (docs/method.md §3)."""
  return [{"role": "user", "content": (
      "Below is the source code of a text game. Write a strategy hint for a player who cannot "
      "see the code: one to three sentences on how to approach the game well. Do not reveal "
      "the exact answer, any secret value, or a winning sequence of actions.\n\n"
      f"{_code_block(code)}\n\nReply with the hint only.")}]


def clean_hint(text: str, max_sentences: int = 3, max_chars: int = 600) -> str:
  """The hint as appended to the observation; empty means hint generation failed."""
  text = re.sub(r"\s+", " ", text.replace("HINT:", "")).strip().strip('"')
  sentences = re.split(r"(?<=[.!?])\s+", text)
  return " ".join(sentences[:max_sentences])[:max_chars].strip()


AGENT_INSTRUCTION = ("You are playing a language game over several turns. Think step by step, "
                     "then give your action inside \\boxed{}.")


def agent_first_turn(observation: str, hint: str | None = None) -> list[Message]:
  if hint:
    observation = f"{observation}\n\nHINT: {hint}"
  return [{"role": "user", "content": f"{AGENT_INSTRUCTION}\n\n{observation}"}]
