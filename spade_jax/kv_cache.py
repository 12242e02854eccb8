"""The KV cache of a batch of conversations, and the bucketed shapes it lives in.

The cache holds every layer's keys and values for `S` slots per row, one [B, K, S, Dh] array per
layer: separate arrays let a decode step update each in place, and with the slots next to the
head dim a decode step's attention reads each (row, kv head) block contiguously. All rows share one write
pointer (`length`): a chunk of `C` tokens goes to slots [length, length + C) of every row, so a
write is one `dynamic_update_slice` rather than a per-row scatter. Rows that have nothing to say
(padding, a row that already stopped) write into their slot anyway but mark it invalid in
`valid_BS`, and their logical position `pos_B` does not advance. Rotary embeddings use the logical
position, never the slot index, so a gap of invalid slots changes nothing but the order of a few
float sums; `repack` closes the gaps between turns (and drops rows whose episode ended).

Shapes come from a small ladder of buckets so that only a few programs are ever compiled.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from spade_jax import model as model_lib
from spade_jax import sharding as sharding_lib

CACHE_AXES = ("batch", "kv_heads", "cache_len", "head_dim")


class Cache(NamedTuple):
  k: tuple[jax.Array, ...]  # L x [B, K, S, Dh]
  v: tuple[jax.Array, ...]  # L x [B, K, S, Dh]
  valid_BS: jax.Array  # bool: slot s of row b holds one of that row's tokens
  length: jax.Array  # int32 []: slots in use; the next chunk is written here
  pos_B: jax.Array  # int32 [B]: logical position of the row's next token (= its valid slots)


def ladder(limit: int, minimum: int = 16) -> tuple[int, ...]:
  """Bucket sizes up to the first one >= `limit`: powers of two, plus 1.5x powers of two from
  384 up (which keep a bucket's waste, padding and attention over unused slots, under 50% at the
  sizes where it costs the most)."""
  out, p = [], minimum
  while not out or out[-1] < limit:
    out.append(p)
    if p >= 256 and out[-1] < limit:
      out.append(p * 3 // 2)
    p *= 2
  return tuple(out)


def bucket(n: int, minimum: int = 16) -> int:
  """The smallest ladder size >= n."""
  return next(b for b in ladder(max(n, minimum), minimum) if b >= n)


def batch_bucket(n: int, multiple: int = 1) -> int:
  """Power of two >= n, rounded up to a multiple of the devices the batch is split over."""
  b = 1 << max(0, (n - 1).bit_length())
  return -(-b // multiple) * multiple


def batch_multiple(mesh: Mesh, rules) -> int:
  """How many ways the batch dim is split: the product of the mesh axes of the "batch" rule."""
  return sharding_lib.batch_shards(mesh, rules)


def _cache_rules(rules):
  return {**rules, "cache_len": ()}


def shardings(cfg: model_lib.ModelConfig, mesh: Mesh, rules, B: int, S: int) -> Cache:
  """NamedShardings of a cache: batch over the batch rule, kv heads over the kv_heads rule."""
  shape = (B, cfg.n_kv_heads, S, cfg.head_dim)
  kv = NamedSharding(mesh, sharding_lib.spec_for(CACHE_AXES, _cache_rules(rules), shape, mesh,
                                                 "kv cache"))
  per_layer = (kv,) * cfg.n_layers
  return Cache(per_layer, per_layer, sharding_lib.batch_sharding(mesh, rules, 2),
               sharding_lib.replicated(mesh), sharding_lib.batch_sharding(mesh, rules, 1))


def constrain(cache: Cache, cache_sh: Cache | None) -> Cache:
  if cache_sh is None:
    return cache
  return jax.lax.with_sharding_constraint(cache, cache_sh)


def empty(cfg: model_lib.ModelConfig, B: int, S: int) -> Cache:
  """An empty cache (inside jit, so XLA allocates it directly in place)."""
  shape = (B, cfg.n_kv_heads, S, cfg.head_dim)
  dt = jnp.dtype(cfg.dtype)
  kv = tuple(jnp.zeros(shape, dt) for _ in range(cfg.n_layers))
  return Cache(kv, kv, jnp.zeros((B, S), bool), jnp.zeros((), jnp.int32),
               jnp.zeros((B,), jnp.int32))


def repack(cache: Cache, rows_B, keep_B, S: int) -> Cache:
  """Gathers rows `rows_B` of `cache` into a cache of capacity S, valid slots packed at the end.

  Each kept row's valid slots move, in order, to [m - count_b, m) with m = max kept count, so the
  shared write pointer becomes m and no gaps remain. Rows with keep_B False come out empty.
  Requires m <= S (the caller knows every row's count). Only the first min(S, S_old) slots can
  hold anything (m <= both), so the gather runs over those and the rest of the new cache is
  zeros: fanning a prompt cache out into a large capacity costs the prompt, not the capacity.
  """
  valid = cache.valid_BS[rows_B] & keep_B[:, None]
  count_B = valid.sum(-1).astype(jnp.int32)
  m = count_B.max()
  S_old = valid.shape[1]
  W = min(S, S_old)
  # Stable order with the valid slots first: src_BS[b, r] is the slot of row b's r-th token.
  src_BS = jnp.argsort(~valid, axis=-1, stable=True).astype(jnp.int32)
  rank_BW = jnp.arange(W, dtype=jnp.int32)[None, :] - (m - count_B)[:, None]
  new_valid = (rank_BW >= 0) & (rank_BW < count_B[:, None])
  gather_BW = jnp.take_along_axis(src_BS, jnp.clip(rank_BW, 0, S_old - 1), axis=-1)

  def move(kv_BKSD):
    kv = kv_BKSD[rows_B]
    B, K, _, Dh = kv.shape
    idx = jnp.broadcast_to(gather_BW[:, None, :, None], (B, K, W, Dh))
    out = jnp.where(new_valid[:, None, :, None], jnp.take_along_axis(kv, idx, axis=2),
                    jnp.zeros((), kv.dtype))
    return jnp.pad(out, ((0, 0), (0, 0), (0, S - W), (0, 0)))

  return Cache(tuple(map(move, cache.k)), tuple(map(move, cache.v)),
               jnp.pad(new_valid, ((0, 0), (0, S - W))), m,
               jnp.where(keep_B, cache.pos_B[rows_B], 0))
