"""Benchmarks: `python -m spade_jax.bench {sampler,train} [flags]`, one JSON line each.

Each benchmark lives in its own module with a `main(argv)`; this file only dispatches.
"""

import importlib
import sys

from spade_jax import hostmem

BENCHMARKS = {
    "sampler": "spade_jax.bench_sampler",
    "train": "spade_jax.bench_train",
}


def main(argv=None) -> None:
  argv = list(sys.argv[1:] if argv is None else argv)
  hostmem.retain_freed_memory()
  if not argv or argv[0] not in BENCHMARKS:
    sys.exit(f"usage: python -m spade_jax.bench {{{','.join(BENCHMARKS)}}} [flags]")
  importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
  main()
