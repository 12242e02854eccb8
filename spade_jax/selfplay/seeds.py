"""Every random choice of the loop is keyed by integers (run seed, step, phase, ...), never by a
stateful generator, so a resumed run makes exactly the choices an uninterrupted one makes."""

import numpy as np


def derive(*parts: int) -> int:
  """A non-negative int32 seed from a tuple of integers."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)
