"""hostmem: freed host memory is kept for reuse (no fresh page faults), and the opt-out works.

Each case runs in its own interpreter: the settings are process-wide and must not leak into the
test process.
"""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Allocates, touches and frees 256 MiB twice; prints whether the settings took effect and the
# minor page faults of the second round (about 65k pages when the block goes back to the OS).
PROBE = """
import ctypes, resource
from spade_jax import hostmem
applied = hostmem.retain_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def touch(n):
  p = libc.malloc(n)
  ctypes.memset(p, 1, n)
  libc.free(p)
touch(256 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch(256 << 20)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _probe(**env) -> tuple[str, int]:
  out = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, check=True,
                       capture_output=True, text=True, cwd=ROOT).stdout.split()
  return out[0], int(out[1])


def test_freed_memory_is_reused_without_page_faults():
  applied, faults = _probe()
  assert applied == "True"
  assert faults < 2000, faults


def test_opt_out_leaves_the_allocator_alone():
  applied, faults = _probe(SPADE_JAX_HOST_MALLOC="default")
  assert applied == "False"
  assert faults > 30000, faults  # glibc maps and unmaps a block this large each time
