"""Benchmarks: `python -m spade_jax.bench {sampler,train,moe} [flags]`, one JSON line each.

Each benchmark lives in its own module with a `main(argv)`; this file only dispatches.
"""

import importlib
import sys

from spade_jax import cli
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
    "moe": "spade_jax.bench_moe",
}


USAGE = (f"usage: python -m spade_jax.bench {{{','.join(BENCHMARKS)}}} [flags]\n"
         "  (python -m spade_jax.bench NAME --help lists a benchmark's flags)")


def _main(argv: list[str]) -> None:
  hostmem.retain_freed_memory()
  if argv[:1] in (["-h"], ["--help"]):
    print(USAGE)
    return
  if not argv or argv[0] not in BENCHMARKS:
    sys.exit(USAGE)
  module = importlib.import_module(BENCHMARKS[argv[0]])
  from spade_jax.convert import CheckpointError

  try:
    module.main(argv[1:])
  except CheckpointError as e:  # a bad --model: one line, as generate and train give
    sys.exit(f"error: {e}")


def main(argv=None) -> None:
  cli.quiet_broken_pipe(_main, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
  main()
