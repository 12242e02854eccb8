"""Packing trained samples (designer first, then agent) into the learner's fixed-shape batch.

The batch always has `global_batch` rows, so the train step compiles once per length bucket:
missing rows are empty (mask 0), which the loss ignores (it averages over non-empty rows).
Lengths are rounded up to a few buckets (`length_bucket`), so the varying lengths of episodes
from step to step do not recompile the train step every time.

When there are more samples than rows, whole agent groups are left out, chosen at random (seeded
by run and step): an agent advantage is a z-score within its group, so a group cut in part would
keep advantages computed over plays that are not trained, and cutting the same last groups every
time would never train the environments listed last. Designer samples go first; only if they
alone overflow the batch is a seeded random subset of them kept.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from spade_jax.selfplay import records


def assemble(designer: Sequence[records.Sample], agent: Sequence[records.Sample],
             global_batch: int, seed: int) -> tuple[list[records.Sample], int]:
  """(samples: designer first, then the agent groups that fit; agent samples left out)."""
  rng = np.random.default_rng(seed)
  designer = list(designer)
  if len(designer) > global_batch:
    keep = np.sort(rng.choice(len(designer), size=global_batch, replace=False))
    designer = [designer[i] for i in keep]
  room = global_batch - len(designer)
  groups: dict[int, list[records.Sample]] = {}
  for s in agent:
    groups.setdefault(s.group, []).append(s)
  kept = []
  for g in (list(groups) if len(agent) <= room else rng.permutation(list(groups)).tolist()):
    if len(groups[g]) <= room:
      kept.append(g)
      room -= len(groups[g])
  kept_set = set(kept)
  chosen = [s for s in agent if s.group in kept_set]  # in their original order
  return designer + chosen, len(agent) - len(chosen)


def length_bucket(n: int, minimum: int = 64) -> int:
  """The smallest of minimum * {1, 1.5} * 2^i that holds n: at most 50% padding."""
  b = minimum
  while True:
    for size in (b, b * 3 // 2):
      if size >= n:
        return size
    b *= 2


def pack(samples: Sequence[records.Sample], rows: int, multiple: int = 64,
         pad_id: int = 0, experts_Lk: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
  """Samples -> right-padded learner arrays of `rows` rows. With `experts_Lk` (a MoE policy
  replaying its routing) also `experts_BTLk`: each sample's recorded experts, -1 (route
  afresh) where a sample has none, e.g. a replayed designer program."""
  if len(samples) > rows:
    raise ValueError(f"{len(samples)} samples for a batch of {rows} rows")
  longest = max([len(s.tokens) for s in samples] + [1])
  T = length_bucket(longest, multiple)
  out = {
      "tokens_BT": np.full((rows, T), pad_id, np.int32),
      "loss_mask_BT": np.zeros((rows, T), np.float32),
      "logp_behaviour_BT": np.zeros((rows, T), np.float32),
      "advantages_B": np.zeros((rows,), np.float32),
      "temperature_B": np.ones((rows,), np.float32),
  }
  for i, s in enumerate(samples):
    n = len(s.tokens)
    out["tokens_BT"][i, :n] = s.tokens
    out["loss_mask_BT"][i, :n] = s.mask
    out["logp_behaviour_BT"][i, :n] = s.logp
    out["advantages_B"][i] = s.advantage
    out["temperature_B"][i] = s.temperature  # greedy (0) is scored at 1: logprobs.py
  if experts_Lk is not None:
    out["experts_BTLk"] = np.full((rows, T, *experts_Lk), -1, np.int16)
    for i, s in enumerate(samples):
      if s.experts is not None:
        out["experts_BTLk"][i, :len(s.experts)] = s.experts
  return out
