"""Corpus documents that ground the designer (docs/method.md §8), read through grain.

A corpus is a JSONL file whose lines are objects with a string `text` field; other fields are kept
as metadata and never shown to the model. Documents are cut to `max_words` whitespace words and
drawn in a seeded random order (a fresh permutation each pass), one fresh document per designer
attempt. The iterator position is a small JSON dict, saved in checkpoints so a resumed run draws
the same documents an uninterrupted run would.

Without a user file, `build_default_corpus` assembles real technical text that is already on the
machine — the docstrings of number-theory, combinatorics, statistics and logic code in the
standard library and in sympy — and caches it as JSONL in the run's workdir.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
from typing import Any, Iterator

import grain

# Modules whose public docstrings make the embedded default corpus, in a fixed order.
DEFAULT_MODULES = (
    "math", "statistics", "itertools", "heapq", "fractions", "bisect", "functools", "collections",
    "sympy.ntheory.factor_", "sympy.ntheory.primetest", "sympy.ntheory.residue_ntheory",
    "sympy.ntheory.modular", "sympy.ntheory.continued_fraction", "sympy.ntheory.partitions_",
    "sympy.combinatorics.permutations", "sympy.combinatorics.partitions",
    "sympy.combinatorics.graycode", "sympy.combinatorics.prufer", "sympy.combinatorics.subsets",
    "sympy.functions.combinatorial.numbers", "sympy.functions.combinatorial.factorials",
    "sympy.logic.boolalg", "sympy.logic.inference", "sympy.sets.sets", "sympy.geometry.point",
    "sympy.geometry.polygon", "sympy.geometry.line", "sympy.stats.rv_interface",
    "sympy.solvers.diophantine.diophantine", "sympy.discrete.convolutions",
    "sympy.utilities.iterables",
)
MIN_WORDS = 40


@dataclasses.dataclass(frozen=True)
class Document:
  doc_id: str
  text: str
  meta: dict


def cut_words(text: str, max_words: int) -> str:
  words = text.split()
  return text if len(words) <= max_words else " ".join(words[:max_words])


def read_jsonl(path: str, max_words: int) -> list[Document]:
  """All documents of a JSONL corpus; any malformed line is an error naming the line."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"corpus file {path!r} does not exist")
  docs = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
      if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise ValueError(f"{path}:{lineno}: expected an object with a string 'text' field")
      if not obj["text"].strip():
        continue
      meta = {k: v for k, v in obj.items() if k != "text"}
      doc_id = str(meta.get("id", f"{os.path.basename(path)}:{lineno}"))
      docs.append(Document(doc_id, cut_words(obj["text"], max_words), meta))
  if not docs:
    raise ValueError(f"corpus file {path!r} has no documents")
  return docs


def _public_docstrings(module_name: str) -> Iterator[tuple[str, str]]:
  module = importlib.import_module(module_name)
  if module.__doc__ and len(module.__doc__.split()) >= MIN_WORDS:
    yield module_name, inspect.cleandoc(module.__doc__)
  public = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
  for name in sorted(public):
    obj = getattr(module, name, None)
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
      continue
    if getattr(obj, "__module__", module_name) != module_name:
      continue  # re-exported from elsewhere; it is collected there, once
    doc = inspect.getdoc(obj)
    if doc and len(doc.split()) >= MIN_WORDS:
      yield f"{module_name}.{name}", f"{module_name}.{name}\n\n{doc}"


def build_default_corpus(path: str, modules=DEFAULT_MODULES) -> str:
  """Writes the docstring corpus to `path` (atomically) unless it is already there."""
  if os.path.exists(path):
    return path
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  seen = set()
  with open(tmp, "w", encoding="utf-8") as f:
    for module_name in modules:
      for doc_id, text in _public_docstrings(module_name):
        if doc_id not in seen:
          seen.add(doc_id)
          f.write(json.dumps({"id": doc_id, "text": text, "source": module_name}) + "\n")
  os.replace(tmp, path)
  return path


class Corpus:
  """Seeded, resumable stream of documents: `next()`, `get_state()`, `set_state(state)`."""

  def __init__(self, docs: list[Document], seed: int):
    self.docs = docs
    dataset = grain.MapDataset.range(len(docs)).shuffle(seed=seed).repeat()
    self._it = iter(dataset.to_iter_dataset())

  def __len__(self) -> int:
    return len(self.docs)

  def next(self) -> Document:
    return self.docs[int(next(self._it))]

  def get_state(self) -> dict[str, Any]:
    return self._it.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._it.set_state(state)
