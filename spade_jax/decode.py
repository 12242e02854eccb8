"""The device side of sampling: a cached forward over a chunk, token selection, the decode loop.

`forward_chunk` runs the model over a chunk of C new tokens per row (a prompt, an observation, or
the one token of a decode step), writes their keys/values into the cache and returns the logits
of the chunk's last position only (prompt logits are never computed). Attention reads only the
first `span` slots of the cache, a static bucket that covers the live prefix: `decode_loop` runs
one `lax.while_loop` per span bucket, each leaving as soon as the cache outgrows its span, so the
cost of a step follows the live length, not the capacity.

Token selection: logits / T, then top-k (static k) and top-p, then a categorical draw with a key
folded from (seed, row id, step). The reported log-prob follows `logprobs.token_logprobs`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from spade_jax import kv_cache
from spade_jax import logprobs
from spade_jax import model as model_lib
from spade_jax.kv_cache import Cache

# Finish reasons, as stored per row. NONE: padding row or a row not continued this call.
NONE, EOS, STOP, LENGTH = 0, 1, 2, 3
FINISH_REASONS = ("none", "eos", "stop", "length")


class SampleParams(NamedTuple):
  """What a call decides per row. Temperature <= 0 means greedy."""

  temperature_B: jax.Array  # float32 [B]
  top_p_B: jax.Array  # float32 [B]
  row_id_B: jax.Array  # int32 [B]: stable row identity for the PRNG (survives compaction)
  seed: jax.Array  # int32 []


class Loop(NamedTuple):
  """The while_loop carry of one sampling call."""

  cache: Cache
  last_B: jax.Array  # int32: last sampled token, not yet in the cache
  done_B: jax.Array  # bool
  finish_B: jax.Array  # int32, one of the finish codes
  n_B: jax.Array  # int32: tokens sampled so far
  step: jax.Array  # int32 []: decode steps taken (the PRNG counter)
  tokens_BN: jax.Array  # int32 [B, max_new]
  logp_BN: jax.Array  # float32 [B, max_new]


def prepare(params, cfg: model_lib.ModelConfig):
  """Per-layer weights in the compute dtype and the output matrix as [D, V], made once per call.

  On CPU, slicing a layer out of the stacked weights inside the decode loop (which `lax.scan`
  over layers does) copies it on every step, and a transposed tied embedding is transposed on
  every step; both cost more than the step itself. Run this as its own jitted program so the
  results are materialised once per sampling call.
  """
  p = model_lib.cast(params, cfg)
  layers = [jax.tree.map(lambda a, i=i: a[i], p["layers"]) for i in range(cfg.n_layers)]
  head_DV = p["embed"].T if cfg.tie_embeddings else p["lm_head"]
  return {"embed": p["embed"], "layers": layers, "final_norm": p["final_norm"],
          "head_DV": head_DV}


def _chunk_inputs(cache: Cache, valid_BC):
  """Logical positions of the chunk, the slot validity after writing it, the chunk's slots."""
  C = valid_BC.shape[1]
  valid_BC = valid_BC.astype(bool)
  pos_BC = cache.pos_B[:, None] + jnp.cumsum(valid_BC, axis=1, dtype=jnp.int32) - 1
  valid_BS = jax.lax.dynamic_update_slice(cache.valid_BS, valid_BC, (0, cache.length))
  slot_C = cache.length + jnp.arange(C, dtype=jnp.int32)
  return pos_BC, valid_BS, slot_C


def _mask(valid_BS, slot_C, span: int):
  """[B, C, span]: a query at slot t sees valid slots <= t."""
  return (valid_BS[:, None, :span] &
          (jnp.arange(span, dtype=jnp.int32)[None, None, :] <= slot_C[None, :, None]))


def _layer(p, x, k_all, v_all, l, cos, sin, start, attend, cfg: model_lib.ModelConfig):
  """One block that writes its chunk's keys/values at slot `start`, then attends via `attend`."""
  h = model_lib.rms_norm(x, p["attn_norm"], cfg.norm_eps)
  q, k, v = model_lib.qkv(p, h, cos, sin, cfg)
  # Write first, then read: the chunk attends to itself through the cache.
  k_all = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), (l, 0, start, 0, 0))
  v_all = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), (l, 0, start, 0, 0))
  x = x + jnp.einsum("bthk,hkd->btd", attend(q, k_all, v_all, l), p["wo"])
  x = x + model_lib.mlp(p, model_lib.rms_norm(x, p["mlp_norm"], cfg.norm_eps))
  return x, k_all, v_all


def _finish_chunk(w_final_norm, head_DV, x, cache, k_all, v_all, valid_BS, valid_BC, cfg):
  h = model_lib.rms_norm(x[:, -1], w_final_norm, cfg.norm_eps)
  logits_BV = jnp.einsum("bd,dv->bv", h, head_DV, preferred_element_type=jnp.float32)
  C = valid_BC.shape[1]
  new = Cache(k_all, v_all, valid_BS, cache.length + C,
              cache.pos_B + valid_BC.astype(jnp.int32).sum(1))
  return logits_BV, new


def prefill_chunk(params, cache: Cache, tokens_BC, valid_BC, cfg: model_lib.ModelConfig,
                  span: int):
  """Appends a chunk of C tokens per row; returns (logits [B, V] of its last slot, new cache).

  Chunks are left-padded (valid_BC False on the pads), so the last slot holds every live row's
  latest token and its logits are the only ones computed. Attention reads slots < span (static;
  the caller guarantees length + C <= span <= S). Layers run under `lax.scan` on the stacked
  params, which keeps compile time flat in depth; the per-layer weight copy that costs so much
  in a decode step is amortised over the chunk here.
  """
  B, C = tokens_BC.shape
  pos_BC, valid_BS, slot_C = _chunk_inputs(cache, valid_BC)
  mask = _mask(valid_BS, slot_C, span)
  cos, sin = model_lib.rope_tables(pos_BC, cfg.head_dim, cfg.rope_theta)
  p_all = model_lib.cast(params, cfg)
  K, Dh = cfg.n_kv_heads, cfg.head_dim

  def attend(q, k_all, v_all, l):
    k = jax.lax.dynamic_slice(k_all, (l, 0, 0, 0, 0), (1, B, span, K, Dh))[0]
    v = jax.lax.dynamic_slice(v_all, (l, 0, 0, 0, 0), (1, B, span, K, Dh))[0]
    return model_lib.attention(q, k, v, mask)

  def body(carry, xs):
    x, k_all, v_all = carry
    p, l = xs
    return _layer(p, x, k_all, v_all, l, cos, sin, cache.length, attend, cfg), None

  x = model_lib.embed(p_all, tokens_BC, cfg)
  (x, k_all, v_all), _ = jax.lax.scan(
      body, (x, cache.k_LBSKD, cache.v_LBSKD),
      (p_all["layers"], jnp.arange(cfg.n_layers, dtype=jnp.int32)))
  head_DV = p_all["embed"].T if cfg.tie_embeddings else p_all["lm_head"]
  return _finish_chunk(p_all["final_norm"], head_DV, x, cache, k_all, v_all, valid_BS, valid_BC,
                       cfg)


def decode_step(w, cache: Cache, tok_B, live_B, cfg: model_lib.ModelConfig,
                spans: tuple[int, ...]):
  """Feeds one token per row (rows with live_B False write an invalid slot); returns
  (logits [B, V], new cache).

  `w` comes from `prepare`; layers are unrolled over their own weight arrays. Attention reads
  only the smallest span in `spans` (static, ascending, last = capacity) that covers the live
  prefix: a `lax.switch` per layer between small attention-only branches, so the step's cost
  follows the live length while the expensive part of the step is compiled once.
  """
  pos_BC, valid_BS, slot_C = _chunk_inputs(cache, live_B[:, None])
  cos, sin = model_lib.rope_tables(pos_BC, cfg.head_dim, cfg.rope_theta)
  which = jnp.sum(jnp.asarray(spans, jnp.int32) < cache.length + 1).astype(jnp.int32)

  def branch(span):
    def attend(q, k_all, v_all, l):
      return model_lib.attention(q, k_all[l, :, :span], v_all[l, :, :span],
                                 _mask(valid_BS, slot_C, span))
    return attend

  branches = [branch(s) for s in spans]

  def attend(q, k_all, v_all, l):
    return jax.lax.switch(which, [lambda q, k, v, b=b: b(q, k, v, l) for b in branches],
                          q, k_all, v_all)

  k_all, v_all = cache.k_LBSKD, cache.v_LBSKD
  x = jnp.take(w["embed"], tok_B[:, None], axis=0)
  for l, p in enumerate(w["layers"]):
    x, k_all, v_all = _layer(p, x, k_all, v_all, l, cos, sin, cache.length, attend, cfg)
  return _finish_chunk(w["final_norm"], w["head_DV"], x, cache, k_all, v_all, valid_BS,
                       live_B[:, None], cfg)


def select_tokens(logits_BV, sp: SampleParams, step, top_k: int, greedy: bool):
  """Draws one token per row; returns (tokens [B], log-probs [B] per the shared convention)."""
  if greedy:
    tok_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  else:
    t_B = logprobs.effective_temperature(sp.temperature_B)
    scaled = logits_BV / t_B[:, None]
    V = scaled.shape[-1]
    # top_k = 0 means no top-k: the top-p cut then needs the whole vocabulary sorted.
    vals_BK, idx_BK = jax.lax.top_k(scaled, top_k if 0 < top_k < V else V)
    probs = jax.nn.softmax(vals_BK, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
    vals_BK = jnp.where(before < sp.top_p_B[:, None], vals_BK, -jnp.inf)  # keeps the top one
    keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(
        jax.random.key(sp.seed), r), step))(sp.row_id_B)
    pick_B = jax.vmap(jax.random.categorical)(keys, vals_BK)
    sampled = jnp.take_along_axis(idx_BK, pick_B[:, None], axis=-1)[:, 0].astype(jnp.int32)
    tok_B = jnp.where(sp.temperature_B > 0, sampled,
                      jnp.argmax(logits_BV, axis=-1).astype(jnp.int32))
  logp_B = logprobs.token_logprobs(logits_BV[:, None], tok_B[:, None], sp.temperature_B)[:, 0]
  return tok_B, logp_B


def _record(s: Loop, tok_B, logp_B, eos_ids, stop_ids, max_new: int) -> Loop:
  """Stores this step's token for rows still running and decides who stops."""
  live = ~s.done_B
  B = tok_B.shape[0]
  rows = jnp.arange(B)
  col = jnp.minimum(s.n_B, max_new - 1)
  tokens = s.tokens_BN.at[rows, col].set(jnp.where(live, tok_B, s.tokens_BN[rows, col]))
  logp = s.logp_BN.at[rows, col].set(jnp.where(live, logp_B, s.logp_BN[rows, col]))
  n_B = s.n_B + live
  is_eos = jnp.isin(tok_B, jnp.asarray(eos_ids or (-1,), jnp.int32))
  is_stop = jnp.isin(tok_B, jnp.asarray(stop_ids or (-1,), jnp.int32))
  reason = jnp.where(is_eos, EOS, jnp.where(is_stop, STOP,
                                            jnp.where(n_B >= max_new, LENGTH, NONE)))
  stops = live & (reason != NONE)
  return s._replace(last_B=jnp.where(live, tok_B, s.last_B), done_B=s.done_B | stops,
                    finish_B=jnp.where(stops, reason, s.finish_B), n_B=n_B, tokens_BN=tokens,
                    logp_BN=logp)


def decode_loop(w, cache: Cache, logits_BV, live_B, sp: SampleParams,
                cfg: model_lib.ModelConfig, *, max_new: int, top_k: int, greedy: bool,
                eos_ids: tuple[int, ...], stop_ids: tuple[int, ...], spans: tuple[int, ...],
                cache_sh: Cache | None = None) -> Loop:
  """Samples up to `max_new` tokens per live row, starting from the logits of the prefilled
  prompt. Rows stop on an eos/stop id or at max_new; the loop ends when all have stopped.

  `spans` are the static attention widths, ascending, the last one the capacity S; the caller
  guarantees S >= cache.length + max_new - 1 (the last sampled token is never fed).
  """
  B = live_B.shape[0]
  s = Loop(cache, jnp.zeros((B,), jnp.int32), ~live_B, jnp.full((B,), NONE, jnp.int32),
           jnp.zeros((B,), jnp.int32), jnp.zeros((), jnp.int32),
           jnp.zeros((B, max_new), jnp.int32), jnp.zeros((B, max_new), jnp.float32))
  tok, logp = select_tokens(logits_BV, sp, s.step, top_k, greedy)
  s = _record(s, tok, logp, eos_ids, stop_ids, max_new)

  def step(s: Loop) -> Loop:
    logits, cache = decode_step(w, s.cache, s.last_B, ~s.done_B, cfg, spans)
    cache = kv_cache.constrain(cache, cache_sh)
    tok, logp = select_tokens(logits, sp, s.step + 1, top_k, greedy)
    return _record(s._replace(cache=cache, step=s.step + 1), tok, logp, eos_ids, stop_ids,
                   max_new)

  return jax.lax.while_loop(lambda s: ~s.done_B.all(), step, s)
