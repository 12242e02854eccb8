"""Every random choice of the loop is keyed by integers (run seed, step, phase, ...), never by a
stateful generator, so a resumed run makes exactly the choices an uninterrupted one makes. The
phases are declared here once, so no two choices share a key by accident."""

import numpy as np

DESIGNER = 1  # (seed, step, DESIGNER, attempt): the designer's sampler call
HINT = 2  # (seed, step, HINT): the hint writer's sampler call
RESET = 3  # (seed, step, RESET, pool index): an environment's reset seed for the step
HINTED_PLAYS = 4  # (seed, step, HINTED_PLAYS): the agent's sampling in hinted plays
PLAYS = 5  # (seed, step, PLAYS): the agent's sampling in unhinted plays
TRIM = 6  # (seed, step, TRIM): which whole groups a full batch leaves out
MEMORY = 7  # (seed, step, MEMORY, slot, attempt): memory examples in a designer prompt
ADMISSION = 8  # (seed, step, ADMISSION, attempt): the validator's hidden seeds and probes
POOL = 9  # (seed, step, POOL): which environments a baseline plays this step


def derive(*parts: int) -> int:
  """A non-negative int32 seed from a tuple of integers."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)
