"""Shared prompt prefixes: each distinct prompt of a batch runs through the model once.

A GRPO batch holds groups of samples drawn from one prompt (docs/method.md §5: eight plays of each
environment), so many rows begin with the same tokens. Scoring them row by row repeats the
prompt's forward and backward pass once per sample. Here the batch is split at a position P into
U distinct prefixes [U, P] and every row's continuation [B, T - P]: the prefixes go through the
layers once, each continuation attends to its own prefix's keys and values (gathered per row; the
backward pass sums their gradients over the rows that share them), and the hidden states come
out as the [B, T, D] of the plain forward pass. The result is the same function of the
parameters; only the repeated work is gone.

`find` (host side) picks P and the distinct prefixes, `grouping_order` puts rows that share a
prompt into the same micro-batch, and `hidden_states` is the forward pass. A mixture-of-experts
model routes each token by itself (dropless), so running a prefix once changes nothing there
either; replayed routing for a prefix is that of the first row that begins with it (the rows of a
group share their prompt's prefill in the sampler, hence its routing).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from spade_jax import attention as attention_lib
from spade_jax import model as model_lib
from spade_jax import moe as moe_lib


class Split(NamedTuple):
  tokens_UP: np.ndarray  # int32 [U, P]: the distinct prefixes (padded with copies of the first)
  slot_B: np.ndarray  # int32 [B]: the prefix each row begins with


def split_points(T: int, minimum: int = 32) -> list[int]:
  """The candidate split points: minimum * {1, 1.5} * 2^i short of T, so a batch's shared part
  loses at most a third to rounding and the step compiles for few distinct P."""
  out, b = [], minimum
  while b < T:
    out += [p for p in (b, b * 3 // 2) if p < T]
    b *= 2
  return out


def find(tokens_BT, parts: int = 1, slot_multiple: int = 1, min_saving: float = 0.05,
         minimum: int = 32) -> Split | None:
  """The split point P (one of `split_points`) that leaves the fewest token positions to run,
  parts * U * P + B * (T - P), or None unless it saves at least `min_saving` of the B * T.

  The rows form `parts` micro-batches, micro-batch j holding rows j, j + parts, ... (the
  learner's interleaved split), each with its own U prefixes: U is the most distinct prefixes of
  any micro-batch, rounded up to a multiple of `slot_multiple` (the batch shards, times a bucket
  so that U takes few values). The prefixes are laid out so that the same split hands each
  micro-batch its own (prefix u of micro-batch j is row u * parts + j), and a row's slot counts
  within its micro-batch.
  """
  tokens = np.asarray(tokens_BT)
  B, T = tokens.shape
  micro = [_sorted_runs(tokens[j::parts]) for j in range(parts)]
  best_cost, best = B * T * (1.0 - min_saving), None
  for P in split_points(T, minimum):
    # In sorted order a new prefix starts wherever a row shares fewer than P tokens with the last.
    starts = [np.concatenate([[0], np.cumsum(lcp < P)]) for _, lcp in micro]
    U = -(-max(int(st[-1]) + 1 for st in starts) // slot_multiple) * slot_multiple
    cost = parts * U * P + B * (T - P)
    if cost <= best_cost:
      best_cost = cost
      prefixes, slots = [], []
      for j, ((order, _), st) in enumerate(zip(micro, starts)):
        first = order[np.flatnonzero(np.diff(st, prepend=-1))]  # each prefix's first sorted row
        rows = np.concatenate([first, np.full(U - len(first), first[0])])
        prefixes.append(tokens[j::parts][rows, :P])
        slots.append(np.empty_like(st))
        slots[-1][order] = st
      best = Split(np.stack(prefixes).swapaxes(0, 1).reshape(U * parts, P).astype(np.int32),
                   np.stack(slots).T.reshape(B).astype(np.int32))
  return best


def _sorted_runs(tokens_BT):
  """The rows' lexicographic order and, along it, how many leading tokens each row shares with
  the row before it ([B - 1])."""
  order = _lexicographic(tokens_BT)
  ranked = tokens_BT[order]
  differ = ranked[1:] != ranked[:-1]
  return order, np.where(differ.any(axis=1), differ.argmax(axis=1), tokens_BT.shape[1])


def _lexicographic(tokens_BT):
  return np.lexsort(tokens_BT.T[::-1])  # the last key sorts first: column 0 leads


def grouping_order(tokens_BT, parts: int) -> np.ndarray:
  """A row order under which the interleaved micro-batches hold runs of lexicographically sorted
  rows, so rows that share a prompt land in the same micro-batch: new row r * parts + j is the
  (j * B / parts + r)-th row in sorted order. The loss is a mean over rows: the order is free."""
  tokens = np.asarray(tokens_BT)
  B = tokens.shape[0]
  i = np.arange(B)
  order = np.empty(B, np.int64)
  order[i % (B // parts) * parts + i // (B // parts)] = _lexicographic(tokens)
  return order


def check(tokens_BT, tokens_UP, slot_B, parts: int = 1) -> None:
  """Host side: a clear error unless every row begins with the prefix its slot names, among its
  micro-batch's prefixes (laid out as `find` does)."""
  tokens, prefixes, slot = (np.asarray(a) for a in (tokens_BT, tokens_UP, slot_B))
  B, T = tokens.shape
  if (prefixes.ndim != 2 or slot.shape != (B,) or not 0 < prefixes.shape[1] < T
      or len(prefixes) % parts):
    raise ValueError(f"shared prefixes {prefixes.shape} / slots {slot.shape} do not fit tokens "
                     f"{tokens.shape} in {parts} micro-batches: need [U * micro-batches, P] with "
                     f"0 < P < T and one slot per row")
  if slot.min() < 0 or slot.max() >= len(prefixes) // parts:
    raise ValueError(f"prefix slots must lie in [0, {len(prefixes) // parts})")
  rows = np.arange(B)
  own = prefixes[slot * parts + rows % parts]  # row b's prefix: its micro-batch's slot-th
  bad = np.flatnonzero((own != tokens[:, :prefixes.shape[1]]).any(axis=1))
  if len(bad):
    raise ValueError(f"rows {bad.tolist()} do not begin with the shared prefix of their slot")


def hidden_states(params, tokens_BT, tokens_UP, slot_B, cfg: model_lib.ModelConfig,
                  remat: bool = False, routing: moe_lib.Routing | None = None):
  """`model.hidden_states` of right-padded (or unpadded) rows that begin with the prefixes
  `tokens_UP[slot_B]`: [B, T, D] float32, each prefix run once; given `routing` (a MoE model,
  its replay one [Ls, B, T, k] array for the rows), (hidden states, `moe.RouterStats`)."""
  (U, P), (B, T) = tokens_UP.shape, tokens_BT.shape
  S = T - P
  pos_P = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (U, P))
  pos_S = jnp.broadcast_to(jnp.arange(P, T, dtype=jnp.int32), (B, S))
  ropes = tuple(model_lib.rope_tables(pos, cfg.head_dim, cfg.rope_theta) for pos in (pos_P, pos_S))
  prefix_mask, rest_mask = model_lib.default_mask(P), model_lib.default_mask(S, offset=P)

  def attend(qkvs):
    (q_p, k_p, v_p), (q_s, k_s, v_s) = qkvs
    k = jnp.concatenate([k_p[slot_B], k_s], axis=1)  # [B, T, K, Dh]: own prefix, then own rest
    v = jnp.concatenate([v_p[slot_B], v_s], axis=1)
    return [attention_lib.attention(q_p, k_p, v_p, prefix_mask, causal=True),
            attention_lib.attention(q_s, k, v, rest_mask, causal=True)]

  xs = (model_lib.embed(params, tokens_UP).astype(jnp.float32),
        model_lib.embed(params, tokens_BT[:, P:]).astype(jnp.float32))
  if not cfg.n_experts:
    h_p, h_s = model_lib.layer_stack(params, xs, ropes, attend, cfg, remat)
    return jnp.concatenate([h_p[slot_B], h_s], axis=1)
  want_stats, routing = routing is not None, routing or moe_lib.Routing()
  if routing.replay is not None:
    (r,) = routing.replay
    first_U = jnp.argmax(slot_B[None, :] == jnp.arange(U)[:, None], axis=1)  # 0 for unused slots
    routing = routing._replace(replay=(r[:, first_U, :P], r[:, :, P:]))
  (h_p, h_s), stats = model_lib.layer_stack(params, xs, ropes, attend, cfg, remat, routing)
  h = jnp.concatenate([h_p[slot_B], h_s], axis=1)
  return (h, stats) if want_stats else h
