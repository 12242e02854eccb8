"""Answer extraction from completions: boxed answers, <answer> tags, code blocks, choices.

All extractors return None when the completion holds no answer of that form, so a grader can
tell "no answer" from "wrong answer" in the saved samples.
"""

from __future__ import annotations

import re

from spade_jax.actions import boxed_all, last_boxed  # noqa: F401 -- one rule, shared with self-play

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def answer_tag(text: str) -> str | None:
  """Content of the last complete <answer>...</answer>, stripped."""
  found = _ANSWER.findall(text)
  return found[-1].strip() if found else None


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def code_block(text: str, prefer: tuple[str, ...] = ("python", "py", "python3")) -> str | None:
  """The last fenced block tagged with a `prefer` language, else the last fenced block.

  A model that opens a fence and is cut off before closing it still wrote code: the unclosed
  tail counts as a block when no closed one exists.
  """
  blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
  if not blocks:
    m = re.search(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*)\Z", text, re.DOTALL)
    return m.group(2) if m else None
  tagged = [b for lang, b in blocks if lang in prefer]
  return (tagged or [b for _, b in blocks])[-1]


_CHOICE_PATTERNS = (
    re.compile(r"answer\s*(?:is|:)?\s*[:\s]*\(?\s*([A-D])\s*\)?(?![A-Za-z])", re.IGNORECASE),
)


def choice_letter(text: str, letters: str = "ABCD") -> str | None:
  """A multiple-choice letter: the last boxed letter, else the last "answer is (X)"."""
  for box in reversed(boxed_all(text)):
    m = re.fullmatch(r"\(?\s*(?:\\text\{)?\s*([A-Za-z])\s*\}?\s*\)?", box)
    if m and m.group(1).upper() in letters:
      return m.group(1).upper()
  for pat in _CHOICE_PATTERNS:
    found = [x.upper() for x in pat.findall(text) if x.upper() in letters]
    if found:
      return found[-1]
  return None
