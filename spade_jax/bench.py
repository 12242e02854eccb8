"""Benchmarks: `python -m spade_jax.bench {sampler,train} [flags]`, one JSON line each.

Each benchmark lives in its own module with a `main(argv)`; this file only dispatches.
"""

import importlib
import sys

from spade_jax import hostmem


def accelerator_peak(table: dict[str, float]) -> float | None:
  """The `table` entry whose key is a substring of the first device's kind; None on CPU or for a
  kind the table lacks (each benchmark's peak FLOP/s or bandwidth figures)."""
  import jax

  device = jax.devices()[0]
  if device.platform == "cpu":
    return None
  return next((v for k, v in table.items() if k in device.device_kind), None)


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
