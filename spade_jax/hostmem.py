"""Host allocator settings for the command-line entry points (glibc only).

XLA's CPU runtime allocates each execution's temporaries as one large block and frees it at the
end. glibc serves blocks that large with a fresh mmap and unmaps them on free, so every train
step pays for touching gigabytes of new pages again (1.6 M minor faults and about 4 s of kernel
time per SmolLM2 step at batch 8 x 256 on 2 cores). `retain_freed_memory` makes the allocator
keep freed memory for reuse instead: no mmap for large blocks, no trimming of the heap, one arena
(per-thread arenas would still unmap their heaps). The process then stays at its peak resident
size; steady-state steps fault no pages at all.

Called at the start of `spade_jax.train`, `spade_jax.generate`, `spade_jax.bench` and
`eval.run`, never on import. Set SPADE_JAX_HOST_MALLOC=default to leave the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ENV = "SPADE_JAX_HOST_MALLOC"
# mallopt parameters from glibc's malloc.h.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8


def retain_freed_memory() -> bool:
  """Applies the settings above; returns whether they took effect (False off glibc or opted out)."""
  if os.environ.get(ENV, "retain") == "default":
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  # -1 reaches glibc as SIZE_MAX: the heap top is never handed back.
  return all(mallopt(p, v) == 1 for p, v in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0),
                                               (M_TRIM_THRESHOLD, -1)))
