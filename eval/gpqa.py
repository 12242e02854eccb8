"""GPQA-Diamond (198 four-way multiple-choice questions) from a user-supplied file.

GPQA is gated (its authors ask that it not be redistributed in plain text), so no package ships
it. Supply the official `gpqa_diamond.csv` — or a JSONL with the same fields — in --data_dir:
"Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"
(and optionally "Record ID"). Choices are shuffled once per question with a seed derived from the
question text, so every checkpoint sees the same letter order. The answer is the last boxed
letter, else the last "answer is (X)"; accuracy over samples.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random

from . import extract
from .generation import Prompt
from .protocol import Benchmark, Unavailable, user_file

FIELDS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
          "Incorrect Answer 3")
TEMPLATE = ("Answer the following multiple-choice question. Think step by step, then give the "
            "letter of the correct choice as \\boxed{{X}}.\n\n{question}\n\nA) {A}\nB) {B}\n"
            "C) {C}\nD) {D}")


def _rows(path: str) -> list[dict]:
  with open(path, encoding="utf-8", newline="") as f:
    if path.endswith(".csv"):
      return list(csv.DictReader(f))
    rows = []
    for lineno, line in enumerate(f, 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise Unavailable(f"{path}:{lineno}: not JSON ({e})") from None
    return rows


def load(ctx) -> list[dict]:
  path = user_file(ctx.data_dir, ("gpqa_diamond.csv", "gpqa_diamond.jsonl"),
                   "gpqa_diamond needs the (gated) GPQA-Diamond file")
  items = []
  for k, row in enumerate(_rows(path)):
    missing = [f for f in FIELDS if not isinstance(row.get(f), str) or not row[f].strip()]
    if missing:
      raise Unavailable(f"{path}: row {k + 1} lacks {missing}")
    choices = [row[f].strip() for f in FIELDS[1:]]
    rng = random.Random(int(hashlib.sha256(row["Question"].encode()).hexdigest()[:16], 16))
    order = list(range(4))
    rng.shuffle(order)
    letters = dict(zip("ABCD", (choices[i] for i in order)))
    gold = "ABCD"[order.index(0)]
    ident = row.get("Record ID") or str(k)
    items.append({"id": f"gpqa_diamond/{ident}", "gold": gold,
                  "prompt": Prompt(({"role": "user", "content": TEMPLATE.format(
                      question=row["Question"].strip(), **letters)},),
                      oracle=f"The answer is \\boxed{{{gold}}}.")})
  if not items:
    raise Unavailable(f"{path}: no questions")
  return items


def grade(pairs, ctx) -> list[dict]:
  out = []
  for item, completion in pairs:
    letter = extract.choice_letter(completion)
    out.append({"extracted": letter, "score": float(letter == item["gold"])})
  return out


BENCHMARKS = [Benchmark("gpqa_diamond", "science", load, grade, offline=False)]
