"""Grouped-query attention over whole sequences (training and scoring), with a flash-style
backward and, for causal masks, query blocks that skip the keys after each block's end.

Shape letters as in `model`: B batch, T query time, S key time, H query heads, K kv heads,
G = H // K, Dh head dim. The decode loop's cached attention lives in `decode`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _grouped(q_BTHD, k_BSKD, v_BSKD):
  """[B, T, H, Dh] queries and [B, S, K, Dh] keys/values as [B, K, G*T, Dh] and [B, K, S, Dh]:
  each kv head's G query heads stacked along the query axis, so both attention products are
  plain matmuls batched over (batch, kv head)."""
  B, T, H, Dh = q_BTHD.shape
  K = k_BSKD.shape[2]
  q = q_BTHD.reshape(B, T, K, H // K, Dh).transpose(0, 2, 3, 1, 4).reshape(B, K, H // K * T, Dh)
  return q, k_BSKD.transpose(0, 2, 1, 3), v_BSKD.transpose(0, 2, 1, 3)


def _probs(q, k, mask_BTS, lse=None):
  """Softmax probabilities [B, K, G*T, S] in float32 (zero rows where nothing is visible) and the
  log-sum-exp of each row; given `lse`, the probabilities are rebuilt from it instead."""
  B, K, GT, Dh = q.shape
  T = mask_BTS.shape[1]
  s = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32) * (Dh ** -0.5)
  m = jnp.tile(mask_BTS[:, None], (1, 1, GT // T, 1))  # [B, 1, G*T, S], query rows as in q
  s = jnp.where(m, s, -jnp.inf)
  if lse is None:
    lse = jax.nn.logsumexp(s, axis=-1)
  p = jnp.exp(s - jnp.where(jnp.isfinite(lse), lse, 0.0)[..., None])
  return p, lse


def _attend(q, k, v, mask_BTS):
  p, lse = _probs(q, k, mask_BTS)
  out = jnp.einsum("bkqs,bksd->bkqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return out.astype(v.dtype), lse


def _rows(x, G: int, t0: int, t1: int):
  """The rows of queries t0..t1-1 (all G heads of each group) of a [B, K, G*T, ...] array."""
  B, K, GT, *rest = x.shape
  return x.reshape(B, K, G, GT // G, *rest)[:, :, :, t0:t1].reshape(B, K, G * (t1 - t0), *rest)


def _unrows(parts, G: int):
  """Inverse of `_rows` over consecutive query spans: the [B, K, G*T, ...] array."""
  if len(parts) == 1:
    return parts[0]
  B, K, _, *rest = parts[0].shape
  whole = jnp.concatenate([x.reshape(B, K, G, -1, *rest) for x in parts], axis=3)
  return whole.reshape(B, K, -1, *rest)


def causal_spans(T: int, offset: int = 0, max_blocks: int = 8, min_block: int = 64):
  """Query blocks (t0, t1, offset + t1) for a causal mask whose queries sit at key positions
  offset..offset+T-1: the queries t0..t1-1 can see keys < offset + t1 only, so each block skips
  the keys after its end. At most `max_blocks` of at least `min_block` positions: with no offset,
  at 4 blocks the products cover 10/16 of the full square, at 8 blocks 9/16."""
  size = max(min_block, -(-T // max_blocks))
  return tuple((t0, min(t0 + size, T), offset + min(t0 + size, T)) for t0 in range(0, T, size))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, mask_BTS, spans):
  return _attention_fwd(q, k, v, mask_BTS, spans)[0]


def _attention_fwd(q, k, v, mask_BTS, spans):
  G = q.shape[2] // mask_BTS.shape[1]
  outs, lses = zip(*(
      _attend(_rows(q, G, t0, t1), k[:, :, :s1], v[:, :, :s1], mask_BTS[:, t0:t1, :s1])
      for t0, t1, s1 in spans))
  return _unrows(outs, G), (q, k, v, mask_BTS, _unrows(lses, G))


def _attention_bwd(spans, res, dout):
  """Flash-style backward: the probabilities are rebuilt from the saved log-sum-exp, so a layer
  keeps [B, K, G*T] floats for its softmax instead of two [B, K, G*T, S] score/probability
  arrays (which, stacked over the layers of a scan, cost more to write and read than the extra
  query-key product costs to recompute)."""
  q, k, v, mask_BTS, lse = res
  G = q.shape[2] // mask_BTS.shape[1]
  scale = q.shape[-1] ** -0.5
  dq, dk, dv = [], jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
  for t0, t1, s1 in spans:
    q_i, k_i = _rows(q, G, t0, t1), k[:, :, :s1]
    p, _ = _probs(q_i, k_i, mask_BTS[:, t0:t1, :s1], _rows(lse, G, t0, t1))
    dout_i = _rows(dout, G, t0, t1).astype(jnp.float32)
    dp = jnp.einsum("bkqd,bksd->bkqs", dout_i, v[:, :, :s1].astype(jnp.float32))
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * scale
    dq.append(jnp.einsum("bkqs,bksd->bkqd", ds, k_i.astype(jnp.float32)))
    pad = ((0, 0), (0, 0), (0, k.shape[2] - s1), (0, 0))
    dk += jnp.pad(jnp.einsum("bkqs,bkqd->bksd", ds, q_i.astype(jnp.float32)), pad)
    dv += jnp.pad(jnp.einsum("bkqs,bkqd->bksd", p, dout_i), pad)
  return _unrows(dq, G).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, causal: bool = False):
  """Grouped-query attention; softmax in float32. Fully masked query rows give zeros.

  `causal=True` promises that the mask lets no query see a later key, the queries being the
  last T of the S key positions (as `default_mask`, with an offset of S - T when S > T): the
  queries then run in blocks (`causal_spans`) that skip the keys past each block's end.
  """
  B, T, H, Dh = q_BTHD.shape
  K, S = k_BSKD.shape[2], k_BSKD.shape[1]
  spans = causal_spans(T, S - T) if causal and S >= T else ((0, T, S),)
  out = _attention(*_grouped(q_BTHD, k_BSKD, v_BSKD), mask_BTS, spans)
  return out.reshape(B, K, H // K, T, Dh).transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh)
