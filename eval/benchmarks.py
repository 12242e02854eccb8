"""Every benchmark by name, and the selection syntax of `--benchmarks`.

A selection is a comma-separated list of benchmark names, family names (math, code, reasoning,
tool_use, science) or `all`. Unknown names are an error before any model is loaded.
"""

from __future__ import annotations

from . import bfcl, gpqa, humaneval, livecodebench, math_bench, rgym
from .protocol import Benchmark

REGISTRY: dict[str, Benchmark] = {
    b.name: b for mod in (math_bench, humaneval, livecodebench, gpqa, rgym, bfcl)
    for b in mod.BENCHMARKS}


def select(spec: str) -> list[Benchmark]:
  families = sorted({b.family for b in REGISTRY.values()})
  out: list[Benchmark] = []
  for part in [p.strip() for p in spec.split(",") if p.strip()]:
    if part == "all":
      picked = list(REGISTRY.values())
    elif part in REGISTRY:
      picked = [REGISTRY[part]]
    elif part in families:
      picked = [b for b in REGISTRY.values() if b.family == part]
    else:
      raise ValueError(f"unknown benchmark {part!r}; benchmarks: {', '.join(REGISTRY)}; "
                       f"families: {', '.join(families)}; or all")
    out += [b for b in picked if b not in out]
  if not out:
    raise ValueError("no benchmark selected (--benchmarks LIST)")
  return out
