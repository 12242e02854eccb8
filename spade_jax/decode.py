"""The device side of sampling: chunk prefill, the decode step, token selection, the loop.

`prefill_chunk` runs the model over a chunk of C new tokens per row (a prompt or an observation),
writes their keys/values into the cache and returns the logits of the chunk's last position only
(prompt logits are never computed); its layers run under `lax.scan`. `decode_step` feeds one
token per row through layers unrolled over per-layer weights (see `prepare` for why). Attention
(`_attend`) reads the cache in fixed blocks up to the live length, so a step's cost follows the
live length, not the cache capacity, without a program per span. `decode_loop` is one
`lax.while_loop` that exits when every row has stopped.

Token selection: logits / T, then top-k (static k) and top-p, then a categorical draw with a key
folded from (seed, row id, step). The reported log-prob follows `logprobs.token_logprobs`.

A mixture-of-experts model runs its sparse layers through `moe.block` (its router in float32,
experts dispatched as `dispatch` says), and `with_experts` / `routing` return the experts each
fed token was routed to, [..., sparse layers, k], for the learner to replay (`moe`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from spade_jax import kv_cache
from spade_jax import logprobs
from spade_jax import model as model_lib
from spade_jax import moe as moe_lib
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
  # int16 [B, max_new, Ls, k] when recording routing: the experts of sampled token n when it was
  # fed (-1 until then; the last one is never fed in this call)
  experts_BNLk: jax.Array | None = None


def prepare(params, cfg: model_lib.ModelConfig, vocab_major: bool = False):
  """Per-layer weights in the compute dtype and the output matrix, made once per call.

  On CPU, slicing a layer out of the stacked weights inside the decode loop (which `lax.scan`
  over layers does) copies it on every step, and a transposed tied embedding is transposed on
  every step; both cost more than the step itself. Run this as its own jitted program so the
  results are materialised once per sampling call. The output matrix is [V, D] when
  `vocab_major` (a tied embedding as it is: faster for a batch of rows) or [D, V] (faster for a
  single row).
  """
  p = model_lib.cast(params, cfg)
  layers = [moe_lib.layer_params(p, cfg, i) for i in range(cfg.n_layers)]
  vocab_major = vocab_major and cfg.vocab_size != cfg.d_model  # the shape tells which it is
  if cfg.tie_embeddings:
    head = p["embed"] if vocab_major else p["embed"].T
  else:
    head = p["lm_head"].T if vocab_major else p["lm_head"]
  return {"embed": p["embed"], "layers": layers, "final_norm": p["final_norm"], "head": head}


def _chunk_inputs(cache: Cache, valid_BC):
  """Logical positions of the chunk, the slot validity after writing it, the chunk's slots."""
  C = valid_BC.shape[1]
  valid_BC = valid_BC.astype(bool)
  pos_BC = cache.pos_B[:, None] + jnp.cumsum(valid_BC, axis=1, dtype=jnp.int32) - 1
  valid_BS = jax.lax.dynamic_update_slice(cache.valid_BS, valid_BC, (0, cache.length))
  slot_C = cache.length + jnp.arange(C, dtype=jnp.int32)
  return pos_BC, valid_BS, slot_C


# Attention reads the cache in blocks of this many slots, up to the live length only: a
# `fori_loop` with a dynamic trip count and an online softmax, so neither the cost of a step nor
# the number of compiled programs depends on a static span, and a long chunk never materialises
# [C, S] scores. A single-token decode step reads smaller blocks: its batched [G, Dh] x [Dh, blk]
# products are tiny, and on CPU 64-slot blocks are faster than 128 (and than 32) for the
# attention of a batch-8 or batch-32 step; chunks keep 128.
BLOCK, DECODE_BLOCK = 128, 64


def _one_pass_decode() -> bool:
  """Whether a decode step attends over the whole cache in one masked pass instead of blocks.

  On a GPU every iteration of a loop with a dynamic trip count sends its predicate back to the
  host, once per layer and block. Measured on an H200 (SmolLM2-135M shapes, bfloat16, batch 1,
  capacity 256, 128 new tokens): 1.29 ms per step in one pass, 4.08 ms with 64-slot blocks. The
  price is reading the whole capacity's keys/values every step. On CPU the block loop is what
  keeps a step's cost to the live length, and a TPU runs the loop on the device.
  """
  return jax.default_backend() == "gpu"


def _block(S: int, C: int) -> int:
  if C == 1 and _one_pass_decode():
    return S
  blk = DECODE_BLOCK if C == 1 else BLOCK
  return blk if S % blk == 0 else S


def _attend(q_BCHD, k_BKSD, v_BKSD, valid_BS, slot_C, n_live):
  """Grouped-query attention of a chunk (queries at slots slot_C) over cache slots < n_live.

  A query at slot t sees valid slots <= t. Float32 online softmax over blocks; fully masked
  rows give zeros (as `attention.attention`, in the cache's [B, K, S, Dh] layout).
  """
  B, C, H, Dh = q_BCHD.shape
  K, S = k_BKSD.shape[1], k_BKSD.shape[2]
  G, blk = H // K, _block(S, C)
  q = jnp.transpose(q_BCHD.reshape(B, C, K, G, Dh), (0, 2, 3, 1, 4)) * jnp.asarray(
      Dh ** -0.5, q_BCHD.dtype)  # [B, K, G, C, Dh]

  def body(i, carry):
    m, l, acc = carry
    start = i * blk
    kb = jax.lax.dynamic_slice_in_dim(k_BKSD, start, blk, axis=2)
    vb = jax.lax.dynamic_slice_in_dim(v_BKSD, start, blk, axis=2)
    s = jnp.einsum("bkgcd,bksd->bkgcs", q, kb, preferred_element_type=jnp.float32)
    slots = start + jnp.arange(blk, dtype=jnp.int32)
    mask = (jax.lax.dynamic_slice_in_dim(valid_BS, start, blk, axis=1)[:, None, :] &
            (slots[None, None, :] <= slot_C[None, :, None]))[:, None, None]  # [B,1,1,C,blk]
    s = jnp.where(mask, s, -jnp.inf)
    m_new = jnp.maximum(m, s.max(-1))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    p = jnp.exp(s - m_safe[..., None])
    corr = jnp.exp(m - m_safe)
    l = l * corr + p.sum(-1)
    acc = acc * corr[..., None] + jnp.einsum("bkgcs,bksd->bkgcd", p.astype(v_BKSD.dtype), vb,
                                             preferred_element_type=jnp.float32)
    return m_new, l, acc

  init = (jnp.full((B, K, G, C), -jnp.inf, jnp.float32), jnp.zeros((B, K, G, C), jnp.float32),
          jnp.zeros((B, K, G, C, Dh), jnp.float32))
  if blk == S:  # one block: no loop
    _, l, acc = body(0, init)
  else:
    _, l, acc = jax.lax.fori_loop(0, (n_live + blk - 1) // blk, body, init)
  out = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
  return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, C, H, Dh).astype(v_BKSD.dtype)


def _layer(p, x, k_BKSD, v_BKSD, cos, sin, start, attend, cfg: model_lib.ModelConfig,
           dispatch=None):
  """One block that writes its chunk's keys/values at slot `start`, then attends via `attend`;
  returns (x, k, v, the experts of each token [B, C, k] in a sparse layer, else None)."""
  q, k, v = model_lib.qkv(p, x, cos, sin, cfg)
  # Write first, then read: the chunk attends to itself through the cache.
  k_BKSD = jax.lax.dynamic_update_slice(k_BKSD, jnp.swapaxes(k, 1, 2).astype(k_BKSD.dtype),
                                        (0, 0, start, 0))
  v_BKSD = jax.lax.dynamic_update_slice(v_BKSD, jnp.swapaxes(v, 1, 2).astype(v_BKSD.dtype),
                                        (0, 0, start, 0))
  x = x + jnp.einsum("bthk,hkd->btd", attend(q, k_BKSD, v_BKSD), p["wo"])
  if "moe" in p:
    y, r = moe_lib.block(p["moe"], model_lib.rms_norm(x, p["mlp_norm"], cfg.norm_eps), cfg,
                         dispatch)
    return x + y, k_BKSD, v_BKSD, r.experts
  x = x + model_lib.mlp(p, x, cfg)
  return x, k_BKSD, v_BKSD, None


def _logits(final_norm, head, x_BCD, cfg, vocab_major: bool = False):
  h = model_lib.rms_norm(x_BCD[:, -1], final_norm, cfg.norm_eps)
  return logprobs.head_logits(h, head, vocab_major)


def prefill_chunk(params, cache: Cache, tokens_BC, valid_BC, cfg: model_lib.ModelConfig,
                  dispatch=None, with_experts: bool = False):
  """Appends a chunk of C tokens per row; returns (logits [B, V] of its last slot, new cache)
  and, `with_experts`, the experts of every chunk token [B, C, Ls, k] int32.

  Chunks are left-padded (valid_BC False on the pads), so the last slot holds every live row's
  latest token and its logits are the only ones computed. The caller guarantees length + C <= S
  and keeps C small (long prompts go in several chunks): attention then never builds more than
  [C, BLOCK] scores. Layers run under `lax.scan` over the stacked params, which keeps compile
  time flat in depth (the per-layer weight copy that makes scan slow for a decode step is
  amortised over the chunk here); the chunk's new keys/values are written back after it. A MoE
  model runs one scan per `moe.layer_runs` run.
  """
  B, C = tokens_BC.shape
  start = cache.length
  pos_BC, valid_BS, slot_C = _chunk_inputs(cache, valid_BC)
  cos, sin = model_lib.rope_tables(pos_BC, cfg.head_dim, cfg.rope_theta)
  p_all = model_lib.cast(params, cfg)
  attend = lambda q, k, v: _attend(q, k, v, valid_BS, slot_C, start + C)

  def body(x, xs):
    p, k_l, v_l = xs
    x, k_l, v_l, experts = _layer(p, x, k_l, v_l, cos, sin, start, attend, cfg, dispatch)
    chunk = lambda a: jax.lax.dynamic_slice_in_dim(a, start, C, axis=2)
    return x, (chunk(k_l), chunk(v_l), experts)

  x = model_lib.embed(p_all, tokens_BC)
  ks, vs, outs = jnp.stack(cache.k), jnp.stack(cache.v), []
  for run in moe_lib.layer_runs(cfg):
    rows = lambda a: a if (run.first, run.end) == (0, cfg.n_layers) else a[run.first:run.end]
    x, out = jax.lax.scan(body, x, (moe_lib.run_params(p_all, cfg, run), rows(ks), rows(vs)))
    outs.append(out)
  new_k, new_v = (jnp.concatenate(a) if len(a) > 1 else a[0]
                  for a in ([o[0] for o in outs], [o[1] for o in outs]))
  write = lambda a, n: jax.lax.dynamic_update_slice(a, n, (0, 0, start, 0))
  k = tuple(write(a, new_k[l]) for l, a in enumerate(cache.k))
  v = tuple(write(a, new_v[l]) for l, a in enumerate(cache.v))
  head_DV = p_all["embed"].T if cfg.tie_embeddings else p_all["lm_head"]
  logits_BV = _logits(p_all["final_norm"], head_DV, x, cfg)
  cache = Cache(k, v, valid_BS, start + C, cache.pos_B + valid_BC.astype(jnp.int32).sum(1))
  if not with_experts:
    return logits_BV, cache
  experts = jnp.concatenate([e for _, _, e in outs if e is not None])  # [Ls, B, C, k]
  return logits_BV, cache, jnp.transpose(experts, (1, 2, 0, 3))


def decode_step(w, cache: Cache, tok_B, live_B, cfg: model_lib.ModelConfig, dispatch=None,
                with_experts: bool = False):
  """Feeds one token per row (rows with live_B False write an invalid slot); returns
  (logits [B, V], new cache) and, `with_experts`, the token's experts [B, Ls, k] int32.

  `w` comes from `prepare`; layers are unrolled over their own weight arrays. Attention reads
  only the blocks that cover the live prefix, so the step's cost follows the live length, not
  the capacity.
  """
  pos_BC, valid_BS, slot_C = _chunk_inputs(cache, live_B[:, None])
  cos, sin = model_lib.rope_tables(pos_BC, cfg.head_dim, cfg.rope_theta)
  attend = lambda q, k, v: _attend(q, k, v, valid_BS, slot_C, cache.length + 1)
  ks, vs, experts = list(cache.k), list(cache.v), []
  x = model_lib.embed(w, tok_B[:, None])
  for l, p in enumerate(w["layers"]):
    x, ks[l], vs[l], e = _layer(p, x, ks[l], vs[l], cos, sin, cache.length, attend, cfg, dispatch)
    experts += [] if e is None else [e[:, 0]]
  vocab_major = w["head"].shape[0] == cfg.vocab_size != cfg.d_model
  logits_BV = _logits(w["final_norm"], w["head"], x, cfg, vocab_major)
  cache = Cache(tuple(ks), tuple(vs), valid_BS, cache.length + 1,
                cache.pos_B + live_B.astype(jnp.int32))
  if not with_experts:
    return logits_BV, cache
  return logits_BV, cache, jnp.stack(experts, axis=1)


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
                eos_ids: tuple[int, ...], stop_ids: tuple[int, ...],
                cache_sh: Cache | None = None, dispatch=None, routing: bool = False) -> Loop:
  """Samples up to `max_new` tokens per live row, starting from the logits of the prefilled
  prompt. Rows stop on an eos/stop id or at max_new; the loop ends when all have stopped.
  `routing` records the experts of every token fed (`Loop.experts_BNLk`).

  The caller guarantees S >= cache.length + max_new - 1 (the last sampled token is never fed).
  """
  B = live_B.shape[0]
  experts = None
  if routing:
    shape = (B, max_new, len(cfg.sparse_layers), cfg.experts_per_token)
    experts = jnp.full(shape, -1, jnp.int16)
  s = Loop(cache, jnp.zeros((B,), jnp.int32), ~live_B, jnp.full((B,), NONE, jnp.int32),
           jnp.zeros((B,), jnp.int32), jnp.zeros((), jnp.int32),
           jnp.zeros((B, max_new), jnp.int32), jnp.zeros((B, max_new), jnp.float32), experts)
  tok, logp = select_tokens(logits_BV, sp, s.step, top_k, greedy)
  s = _record(s, tok, logp, eos_ids, stop_ids, max_new)

  def step(s: Loop) -> Loop:
    out = decode_step(w, s.cache, s.last_B, ~s.done_B, cfg, dispatch, routing)
    logits, cache = out[:2]
    if routing:  # the token fed is the last one recorded, at column n - 1
      rows, col = jnp.arange(B), jnp.maximum(s.n_B - 1, 0)
      fed = jnp.where((~s.done_B)[:, None, None], out[2].astype(jnp.int16),
                      s.experts_BNLk[rows, col])
      s = s._replace(experts_BNLk=s.experts_BNLk.at[rows, col].set(fed))
    cache = kv_cache.constrain(cache, cache_sh)
    tok, logp = select_tokens(logits, sp, s.step + 1, top_k, greedy)
    return _record(s._replace(cache=cache, step=s.step + 1), tok, logp, eos_ids, stop_ids,
                   max_new)

  return jax.lax.while_loop(lambda s: ~s.done_B.all(), step, s)
