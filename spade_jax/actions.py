"""How answers and actions are read out of a completion: `\\boxed{...}` contents.

One rule for every reader (the agent's action in self-play, graded answers in eval): every
complete box counts, braces matched (nesting and `\\{` / `\\}` literals allowed); an unclosed box
(a completion cut by its token limit) is not an answer, so the last *complete* box wins even when
a later one was left open. Standard library only.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_all(text: str) -> list[str]:
  """Contents of every complete \\boxed{...} (and \\fbox{...}) in order, stripped."""
  out = []
  for m in _BOXED.finditer(text):
    depth, i = 1, m.end()
    while i < len(text) and depth:
      c = text[i]
      if c == "\\" and i + 1 < len(text):  # \{ and \} are literal braces
        i += 2
        continue
      depth += {"{": 1, "}": -1}.get(c, 0)
      i += 1
    if depth == 0:
      out.append(text[m.end():i - 1].strip())
  return out


def last_boxed(text: str) -> str | None:
  """The last complete box's content; None if the text has none."""
  boxes = boxed_all(text)
  return boxes[-1] if boxes else None


def boxed_action(completion: str, max_chars: int = 2000) -> str:
  """The action sent to an environment: the last complete box re-wrapped as \\boxed{X}; a
  completion without one is passed as (truncated) raw text, for the environment to parse."""
  content = last_boxed(completion)
  if content is None:
    return completion.strip()[:max_chars]
  return f"\\boxed{{{content[:max_chars]}}}"
