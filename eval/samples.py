"""Per-sample JSONL: written line by line as samples are graded, read back for re-scoring.

One line per graded sample: benchmark, problem id, sample index, the prompt messages, the
completion (a string, or the step responses of a multi-turn episode), the gold answer, the
extracted answer, the score in [0, 1] and the verdict. Each line is flushed when written, so an
interrupted run keeps everything it finished.
"""

from __future__ import annotations

import json
import os
from typing import Iterator

REQUIRED = ("benchmark", "id", "sample", "completion", "score")


class SampleFileError(ValueError):
  """A saved sample file cannot be read back; the message names the file and line."""


class Writer:
  def __init__(self, path: str):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self.path = path
    self._f = open(path, "a", encoding="utf-8")

  def write(self, record: dict) -> None:
    self._f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    self._f.flush()

  def close(self) -> None:
    self._f.close()


def read(path: str) -> Iterator[dict]:
  """Records of a sample file; a malformed line is an error naming file and line."""
  try:
    f = open(path, encoding="utf-8")
  except OSError as e:
    raise SampleFileError(f"{path}: cannot open ({e.strerror})") from None
  with f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise SampleFileError(f"{path}:{lineno}: not JSON ({e.msg})") from None
      if not isinstance(rec, dict):
        raise SampleFileError(f"{path}:{lineno}: not a JSON object")
      missing = [k for k in REQUIRED if k not in rec]
      if missing:
        raise SampleFileError(f"{path}:{lineno}: missing fields {missing}")
      if not isinstance(rec["score"], (int, float)) or not 0 <= rec["score"] <= 1:
        raise SampleFileError(f"{path}:{lineno}: score must be a number in [0, 1]")
      yield rec
