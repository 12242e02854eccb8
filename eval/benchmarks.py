"""Every benchmark by name, and the selection syntax of `--benchmarks`.

A selection is a comma-separated list of benchmark names, family names (math, code, reasoning,
tool_use, science), `all`, or environment suites `envs:DIR` (every program of DIR played by the
agent; see envs.py; not part of `all`). Unknown names, and suite directories that do not exist
or hold no programs, are an error before any model is loaded.
"""

from __future__ import annotations

from . import bfcl, envs, gpqa, humaneval, livecodebench, math_bench, rgym
from .presets import ENVS_PREFIX
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
    elif part.startswith(ENVS_PREFIX):
      picked = [envs.benchmark(part[len(ENVS_PREFIX):])]
      if any(b.name == picked[0].name for b in out):
        raise ValueError(f"{part}: another suite in the list is also named {picked[0].name} "
                         "(rows are named by the directory's base name)")
    else:
      raise ValueError(f"unknown benchmark {part!r}; benchmarks: {', '.join(REGISTRY)}; "
                       f"families: {', '.join(families)}; or all; or envs:DIR")
    out += [b for b in picked if b not in out]
  if not out:
    raise ValueError("no benchmark selected (--benchmarks LIST)")
  return out


def saved(name: str) -> Benchmark | None:
  """The benchmark that re-grades samples saved under `name`; None if there is none."""
  if name.startswith(ENVS_PREFIX):
    return envs.saved(name)
  return REGISTRY.get(name)
