"""Packing trained samples (designer first, then agent) into the learner's fixed-shape batch.

The batch always has `global_batch` rows, so the train step compiles once per length bucket:
extra samples are trimmed (agent samples go first), missing rows are empty (mask 0), which the
loss ignores. Lengths are rounded up to a few buckets (`length_bucket`), so the varying lengths
of episodes from step to step do not recompile the train step every time.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def assemble(designer: Sequence[dict[str, Any]], agent: Sequence[dict[str, Any]],
             global_batch: int) -> tuple[list[dict[str, Any]], int]:
  """Designer samples first, then agent samples, trimmed to the global batch.
  Returns (samples, number of designer samples kept)."""
  samples = list(designer)[:global_batch]
  n_designer = len(samples)
  samples += list(agent)[:global_batch - n_designer]
  return samples, n_designer


def length_bucket(n: int, minimum: int = 64) -> int:
  """The smallest of minimum * {1, 1.5} * 2^i that holds n: at most 50% padding."""
  b = minimum
  while True:
    for size in (b, b * 3 // 2):
      if size >= n:
        return size
    b *= 2


def pack(samples: Sequence[dict[str, Any]], rows: int, multiple: int = 64,
         pad_id: int = 0) -> dict[str, np.ndarray]:
  """Samples with tokens/mask/logp/temperature/advantage -> right-padded learner arrays."""
  if len(samples) > rows:
    raise ValueError(f"{len(samples)} samples for a batch of {rows} rows")
  longest = max([len(s["tokens"]) for s in samples] + [1])
  T = length_bucket(longest, multiple)
  out = {
      "tokens_BT": np.full((rows, T), pad_id, np.int32),
      "loss_mask_BT": np.zeros((rows, T), np.float32),
      "logp_behaviour_BT": np.zeros((rows, T), np.float32),
      "advantages_B": np.zeros((rows,), np.float32),
      "temperature_B": np.ones((rows,), np.float32),
  }
  for i, s in enumerate(samples):
    n = len(s["tokens"])
    if not (len(s["mask"]) == len(s["logp"]) == n):
      raise ValueError(f"sample {i}: tokens, mask and logp lengths differ")
    out["tokens_BT"][i, :n] = s["tokens"]
    out["loss_mask_BT"][i, :n] = s["mask"]
    out["logp_behaviour_BT"][i, :n] = s["logp"]
    out["advantages_B"][i] = s["advantage"]
    out["temperature_B"][i] = s["temperature"]  # greedy (0) is scored at 1: logprobs.py
  return out
