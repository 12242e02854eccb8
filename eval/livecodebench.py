"""LiveCodeBench v6 (code generation) from a user-supplied JSONL, executed in our sandbox.

No package ships LiveCodeBench. Supply the release's problems (`code_generation_lite`, e.g. the
problems of release_v6, `test6.jsonl`) as `livecodebench_v6.jsonl` in --data_dir, one problem per
line in LiveCodeBench's schema: question_id, question_content, starter_code, public_test_cases
and private_test_cases (each a JSON list of {"input", "output", "testtype"}: "stdin" or
"functional"; private tests may be LiveCodeBench's base64 + zlib + pickle encoding, which is
decoded with an unpickler that admits nothing but plain strings), metadata (JSON, with
"func_name" for functional problems). An optional "solution" field is used by the `oracle`
generator (the release has no reference solutions).

Prompts follow LiveCodeBench's own; the code is the last fenced python block. A problem is
solved when every test passes: stdin tests compare stdout (trailing whitespace ignored),
functional tests call `Solution().<func_name>(*args)` with JSON-decoded arguments and compare
with the JSON-decoded expected value. Every test runs in `spade_jax.sandbox.execute`.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib

from . import extract
from .generation import Prompt
from .protocol import Benchmark, Unavailable, user_file

SYSTEM = ("You are an expert Python programmer. You will be given a question (problem "
          "specification) and will generate a correct Python program that matches the "
          "specification and passes all tests.")
STDIN_FMT = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not "
             "directly test on the sample inputs). Enclose your code within delimiters as "
             "follows. Ensure that when the python program runs, it reads the inputs, runs the "
             "algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```")
CALL_FMT = ("You will use the following starter code to write the solution to the problem and "
            "enclose your code within delimiters.\n```python\n{starter}\n```")


class _StringsOnly(pickle.Unpickler):
  def find_class(self, module, name):
    raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _tests(raw, where: str) -> list[dict]:
  if isinstance(raw, list):
    tests = raw
  else:
    try:
      tests = json.loads(raw)
    except (json.JSONDecodeError, TypeError):
      try:
        blob = zlib.decompress(base64.b64decode(raw))
        tests = json.loads(_StringsOnly(io.BytesIO(blob)).load())
      except Exception as e:  # noqa: BLE001 - any failure here is a malformed file
        raise Unavailable(f"{where}: test cases are neither JSON nor LiveCodeBench-encoded "
                          f"({type(e).__name__})") from None
  if not isinstance(tests, list) or not all(
      isinstance(t, dict) and {"input", "output", "testtype"} <= set(t) for t in tests):
    raise Unavailable(f"{where}: test cases must be a list of {{input, output, testtype}}")
  return tests


def load(ctx) -> list[dict]:
  path = user_file(ctx.data_dir, ("livecodebench_v6.jsonl",),
                   "livecodebench_v6 needs the LiveCodeBench v6 problems file")
  items = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise Unavailable(f"{where}: not JSON ({e})") from None
      if not isinstance(row, dict) or not row.get("question_id") or not row.get(
          "question_content"):
        raise Unavailable(f"{where}: need question_id and question_content")
      tests = _tests(row.get("public_test_cases", "[]"), where) + _tests(
          row.get("private_test_cases", "[]"), where)
      if not tests:
        raise Unavailable(f"{where}: no test cases")
      meta = row.get("metadata") or {}
      meta = json.loads(meta) if isinstance(meta, str) else meta
      functional = tests[0]["testtype"] == "functional"
      if functional and not meta.get("func_name"):
        raise Unavailable(f"{where}: functional tests need metadata.func_name")
      fmt = (CALL_FMT.format(starter=row.get("starter_code", "")) if functional else STDIN_FMT)
      solution = row.get("solution")
      items.append({
          "id": f"livecodebench_v6/{row['question_id']}", "gold": None, "tests": tests,
          "func_name": meta.get("func_name"),
          "prompt": Prompt(({"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"### Question:\n{row['question_content']}"
                                                        f"\n\n### Format: {fmt}\n\n### Answer: "
                                                        "(use the provided format with "
                                                        "backticks)"}),
                           oracle=f"```python\n{solution}\n```" if solution else "")})
  if not items:
    raise Unavailable(f"{path}: no problems")
  return items


def programs(item: dict, code: str) -> list:
  from spade_jax.sandbox.execute import Program

  out = []
  for t in item["tests"]:
    if t["testtype"] == "functional":
      args = [a for a in t["input"].split("\n") if a.strip()]
      check = (f"\n\nimport json as _json\n_args = [_json.loads(a) for a in {args!r}]\n"
               f"_got = Solution().{item['func_name']}(*_args)\n"
               f"_want = _json.loads({t['output']!r})\n"
               "_got = list(_got) if isinstance(_got, tuple) else _got\n"
               "assert _got == _want, (_got, _want)\n")
      out.append(Program(code + check))
    else:
      out.append(Program(code, stdin=t["input"], expected_stdout=t["output"]))
  return out


def grade(pairs, ctx) -> list[dict]:
  from spade_jax.sandbox.execute import run_programs

  progs, out = {}, []
  for k, (item, completion) in enumerate(pairs):
    code = extract.code_block(completion)
    out.append({"extracted": code})
    if code and code.strip():
      for j, prog in enumerate(programs(item, code)):
        progs[(k, j)] = prog
  verdicts = run_programs(ctx.pool(), progs, ctx.protocol.timeout_s) if progs else {}
  for k, g in enumerate(out):
    mine = [v for (kk, _), v in verdicts.items() if kk == k]
    g["tests_passed"] = sum(v.passed for v in mine)
    g["score"] = float(bool(mine) and all(v.passed for v in mine))
  return out


BENCHMARKS = [Benchmark("livecodebench_v6", "code", load, grade, offline=False)]
