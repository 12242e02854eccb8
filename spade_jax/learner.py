"""The GRPO learner: one jitted, sharded `train_step(state, batch) -> (state, metrics)`.

A batch holds whole sequences (designer programs and agent episodes alike), their per-token loss
mask, the sampler's log-probs and temperatures, and one advantage per sequence. The step scores
the sequences with the current policy in sequence chunks (the full [B, T, V] logits never exist;
each chunk's logits are recomputed in the backward pass), evaluates `rl.policy_loss`, accumulates
gradients over micro-batches, and applies AdamW with global-norm clipping. With one optimizer step
per batch, logp_old is the current log-prob under stop-gradient, so no extra forward pass runs;
with `minibatches > 1` logp_old is computed once for the whole batch first. A step whose loss or
gradient is not finite leaves the state unchanged and reports `skipped = 1`.

Batch fields (token-aligned: index t of every [B, T] array refers to tokens_BT[:, t], which is
scored from the logits at t - 1, so loss_mask_BT[:, 0] must be 0):
  tokens_BT int32, loss_mask_BT float32 (1 on trained tokens), advantages_B float32,
  logp_behaviour_BT float32 (the sampler's log-probs; anything where the mask is 0),
  temperature_B float32 (the sampling temperature; `logprobs.token_logprobs` convention),
  optional positions_BT int32 and valid_BT bool (left padding; default 0..T-1 and all valid),
  optional prefix_tokens_UP int32 and prefix_slot_B int32 (rows that begin with the same prompt:
  `prefix.find`, which the step runs itself when `share_prefix` is on),
  logp_ref_BT float32 only when kl_beta != 0 (no reference pass otherwise),
  optional score_index_BM int32 (the positions to score, see `score_index`; built from the loss
  mask when absent),
  experts_BTLk int (a MoE model with `routing_replay` only: the experts the sampler routed each
  token to, [B, T, sparse layers, k], -1 where it did not; `rl.routing_replay` builds a row).

Objectives (`LearnerConfig.objective`): "grpo", the policy loss above, and "sft", supervised
fine-tuning (the warm start, `spade_jax.sft`): cross-entropy on the masked tokens through the
same scoring path (chunked log-probs, hand-written backward, shared prefixes, micro-batches),

  loss = sum_i [sum_t mask * -logp / sum_t mask] / n_samples,

the mean over samples of each sample's token-mean negative log-likelihood: the GRPO loss's own
reduction, so micro-batches add up to the full batch the same way, and a long sample (a designer
program) weighs as much as a short one (an agent episode). An SFT batch needs only tokens_BT,
loss_mask_BT and temperature_B (1.0: the model's own distribution).

A mixture-of-experts model runs its expert block under autodiff (the dense layers keep their
hand-written backward pieces). With `routing_replay` the learner routes each token to the
experts the sampler chose, taking only their weights from its own router, so the ratio compares
the same experts ("rollout routing replay": GRPO on Qwen3-30B-A3B is reported to collapse when
trainer and sampler route differently); `router_aux_coef` adds transformers' load-balancing loss
(0 by default, as the paper trains: docs/method.md §8b).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from spade_jax import logprobs, prefix, rl, sharding
from spade_jax import model as model_lib
from spade_jax import moe as moe_lib


OBJECTIVES = ("grpo", "sft")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """Optimiser, loss and memory knobs. Defaults: docs/method.md §7 (games recipe)."""

  lr: float = 1e-6
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.98
  adam_eps: float = 1e-8
  max_grad_norm: float = 1.0
  eps_low: float = 0.2
  eps_high: float = 0.28
  tis_cap: float = 2.0
  kl_beta: float = 0.0
  kl_clamp: float = 10.0
  micro_batch: int = 0  # samples per gradient-accumulation step; 0 = the whole (mini)batch
  minibatches: int = 1  # optimizer steps per batch; > 1 computes logp_old once up front
  chunk: int = 256  # sequence positions scored at a time (bounds the [B, chunk, V] logits)
  remat: bool = False  # recompute each layer's activations in the backward pass
  entropy: bool = True  # report the policy entropy over trained tokens (costs a softmax)
  share_prefix: bool = True  # run a prompt that several rows begin with once (`prefix`)
  routing_replay: bool = False  # MoE: route as the sampler did (batch field experts_BTLk)
  router_aux_coef: float = 0.0  # MoE: weight of the load-balancing loss
  moe_impl: str = "auto"  # MoE: the grouped matmul (`moe.IMPLS`)
  objective: str = "grpo"  # one of OBJECTIVES: the policy loss, or cross-entropy (warm start)

  def __post_init__(self):
    if self.objective not in OBJECTIVES:
      raise ValueError(f"invalid LearnerConfig: objective {self.objective!r} is not one of "
                       f"{OBJECTIVES}")
    if self.objective == "sft" and (self.kl_beta or self.minibatches != 1 or
                                    self.routing_replay):
      raise ValueError("invalid LearnerConfig: objective 'sft' takes no KL term, one optimizer "
                       f"step per batch and no routing replay (kl_beta={self.kl_beta}, "
                       f"minibatches={self.minibatches}, routing_replay={self.routing_replay})")
    if self.minibatches < 1 or self.micro_batch < 0 or self.chunk < 1:
      raise ValueError(f"invalid LearnerConfig: minibatches={self.minibatches}, "
                       f"micro_batch={self.micro_batch}, chunk={self.chunk}")
    if not (0 <= self.eps_low < 1 and self.eps_high >= 0 and self.tis_cap > 0):
      raise ValueError(f"invalid clipping: eps_low={self.eps_low}, eps_high={self.eps_high}, "
                       f"tis_cap={self.tis_cap}")


class TrainState(NamedTuple):
  step: jax.Array  # int32 scalar: optimizer updates applied
  params: Any  # float32 master parameters
  opt_state: Any
  rng: jax.Array  # uint32[2] raw key, for the caller's sampling; folded with the step by users


def optimizer(cfg: LearnerConfig) -> optax.GradientTransformation:
  return optax.chain(
      optax.clip_by_global_norm(cfg.max_grad_norm),
      optax.adamw(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.adam_eps, weight_decay=cfg.weight_decay))


# ---------------------------------------------------------------------------------------------
# Scoring


def score_index(loss_mask_BT, granularity: int = 0) -> np.ndarray:
  """Host side: int32 [B, M], each row's positions t with loss_mask[t] != 0 in order, padded with
  0 (position 0 is never scored). M is the longest row's count rounded up to `granularity`
  (default T // 8), so the number of distinct shapes the step compiles for stays small."""
  mask = np.asarray(loss_mask_BT) != 0
  B, T = mask.shape
  g = granularity or max(1, T // 8)
  M = min(T, max(1, -(-int(mask.sum(axis=1).max()) // g) * g))
  out = np.zeros((B, M), np.int32)
  for b in range(B):
    pos = np.flatnonzero(mask[b])
    out[b, :len(pos)] = pos
  return out


def score(params, batch: Mapping[str, jax.Array], mcfg: model_lib.ModelConfig, chunk: int,
          remat: bool = False, entropy: bool = False, dispatch: moe_lib.Dispatch | None = None):
  """Token-aligned log-probs [B, T] (index 0 is 0) and, optionally, entropies of the predicting
  distributions, at each row's temperature.

  With `score_index_BM` in the batch (see `score_index`) only those positions are scored and the
  rest read 0: the output projection, the model's largest matmul, runs on trained tokens only.
  Logits exist one [B, chunk, V] block at a time and are recomputed, not stored, for the backward.
  With `prefix_tokens_UP` / `prefix_slot_B` each shared prompt runs once (`prefix`).
  """
  return _score(params, batch, mcfg, chunk, remat, entropy, dispatch)[:2]


def _score(params, batch, mcfg, chunk, remat=False, entropy=False, dispatch=None):
  """`score` and, for a MoE model, its `moe.RouterStats` (else None)."""
  tokens = batch["tokens_BT"]
  B, T = tokens.shape
  routing = stats = None
  if mcfg.n_experts:
    replay = batch.get("experts_BTLk")
    replay = None if replay is None else (jnp.transpose(replay.astype(jnp.int32), (2, 0, 1, 3)),)
    valid = batch.get("valid_BT")
    routing = moe_lib.Routing(dispatch, replay, None if valid is None else (valid,))
  if "prefix_tokens_UP" in batch:
    h = prefix.hidden_states(params, tokens, batch["prefix_tokens_UP"], batch["prefix_slot_B"],
                             mcfg, remat, routing)
  else:
    valid = batch.get("valid_BT")
    mask_BTS = None if valid is None else model_lib.default_mask(T, valid)
    h = model_lib.hidden_states(params, tokens, mcfg, batch.get("positions_BT"), mask_BTS, remat,
                                routing)
  if routing is not None:
    h, stats = h
  head = {k: params[k] for k in ("embed", "lm_head", "final_norm") if k in params}
  idx = batch.get("score_index_BM")
  if idx is None:
    idx = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  M = idx.shape[1]
  C = min(chunk, M)
  n = -(-M // C)
  idx = jnp.pad(idx, ((0, 0), (0, n * C - M)))  # padding slots point at position 0: unscored
  # The token at t is predicted from the hidden state at t - 1.
  h_BMD = jnp.take_along_axis(h, jnp.maximum(idx - 1, 0)[..., None], axis=1)
  h_BMD = model_lib.rms_norm(h_BMD, head["final_norm"], mcfg.norm_eps).astype(mcfg.dtype)
  tgt_BM = jnp.take_along_axis(tokens, idx, axis=1)
  temp_N = jnp.repeat(batch["temperature_B"].astype(jnp.float32), C)
  w = head["embed"] if mcfg.tie_embeddings else head["lm_head"]

  def one_chunk(h_BCD, tgt_BC):  # only h is kept for the backward pass, never the logits
    lp, ent = logprobs.hidden_logprobs(h_BCD.reshape(B * C, -1), w, tgt_BC.reshape(-1),
                                       temp_N, mcfg.tie_embeddings)
    return lp.reshape(B, C), (jax.lax.stop_gradient(ent).reshape(B, C) if entropy else None)

  chunks = (h_BMD.reshape(B, n, C, -1).swapaxes(0, 1), tgt_BM.reshape(B, n, C).swapaxes(0, 1))
  _, (lp_nBC, ent_nBC) = jax.lax.scan(lambda c, x: (c, one_chunk(*x)), None, chunks)

  rows = jnp.arange(B)[:, None]
  def place(x_nBC):  # back to token positions; padding slots add 0 at position 0
    x_BM = x_nBC.swapaxes(0, 1).reshape(B, n * C)
    return jnp.zeros((B, T), x_BM.dtype).at[rows, idx].add(jnp.where(idx > 0, x_BM, 0.0))

  return place(lp_nBC), (place(ent_nBC) if entropy else None), stats


def loss_fn(params, mb, n_samples, mcfg: model_lib.ModelConfig, cfg: LearnerConfig,
            dispatch: moe_lib.Dispatch | None = None, share: float = 1.0):
  """(loss, stats) of one micro-batch; `n_samples` counts the non-empty rows of the whole batch
  and `share` is the micro-batch's fraction of it (the load-balancing loss is the mean of the
  micro-batches' losses, as transformers computes it per forward pass)."""
  logp, ent, router = _score(params, mb, mcfg, cfg.chunk, cfg.remat, cfg.entropy, dispatch)
  if cfg.objective == "sft":
    loss, stats = sft_loss(logp, mb["loss_mask_BT"], n_samples, ent)
    return _with_router_aux(loss, stats, router, cfg, share)
  logp_old = mb["logp_old_BT"] if "logp_old_BT" in mb else jax.lax.stop_gradient(logp)
  loss, stats = rl.policy_loss(logp, logp_old, mb["logp_behaviour_BT"], mb["advantages_B"],
                               mb["loss_mask_BT"], n_samples, eps_low=cfg.eps_low,
                               eps_high=cfg.eps_high, tis_cap=cfg.tis_cap, kl_beta=cfg.kl_beta,
                               logp_ref_BT=mb.get("logp_ref_BT"), kl_clamp=cfg.kl_clamp,
                               entropy_BT=ent)
  return _with_router_aux(loss, stats, router, cfg, share)


def _with_router_aux(loss, stats, router, cfg: LearnerConfig, share: float):
  if router is not None and cfg.router_aux_coef:
    aux = share * moe_lib.aux_loss(router)
    loss = loss + cfg.router_aux_coef * aux
    stats = dict(stats, router_aux_loss=jax.lax.stop_gradient(aux))
  return loss, stats


def sft_loss(logp_BT, mask_BT, n_samples, entropy_BT=None):
  """Cross-entropy of the masked tokens: sum_i [sum_t mask * -logp / sum_t mask] / n_samples.

  `n_samples` counts the samples with a non-empty mask in the WHOLE batch (as in
  `rl.policy_loss`), so micro-batch losses add up to the full-batch loss; empty rows add 0.
  Returns (loss, stats), stats additive sums over this micro-batch (`finalize_sft_stats`).
  """
  mask = mask_BT.astype(jnp.float32)
  n_tok_B = mask.sum(axis=1)
  row_w_B = jnp.where(n_tok_B > 0, 1.0 / jnp.maximum(n_tok_B, 1.0), 0.0) / n_samples
  on = mask > 0
  nll = jnp.where(on, -logp_BT, 0.0)  # masked positions may hold anything: never multiplied
  loss = jnp.sum(nll * row_w_B[:, None])
  sg = jax.lax.stop_gradient
  confident = on & (sg(logp_BT) > -np.log(2.0))
  stats = dict(tokens=mask.sum(), samples=jnp.sum(n_tok_B > 0).astype(jnp.float32),
               nll_sum=sg(jnp.sum(nll)), confident_sum=jnp.sum(confident).astype(jnp.float32))
  if entropy_BT is not None:
    stats["entropy_sum"] = jnp.sum(sg(entropy_BT) * mask)
  return loss, stats


def finalize_sft_stats(stats: Mapping[str, jax.Array]) -> dict:
  """Whole-batch SFT metrics: the token-mean NLL, the fraction of tokens given p > 1/2 (the
  token is then surely the argmax), the entropy."""
  tok = jnp.maximum(stats["tokens"], 1.0)
  out = {"tokens": stats["tokens"], "samples": stats["samples"],
         "nll_token_mean": stats["nll_sum"] / tok,
         "p_above_half_frac": stats["confident_sum"] / tok}
  if "entropy_sum" in stats:
    out["entropy_mean"] = stats["entropy_sum"] / tok
  return out


# ---------------------------------------------------------------------------------------------
# The step


def _split(tree, m: int, batch_layout):
  """[B, ...] -> [m, B/m, ...] with micro-batch j = rows j, j+m, j+2m, ...: every device's shard
  of the batch holds rows of every micro-batch, so each micro-batch stays spread over the mesh."""
  def one(x):
    y = x.reshape(x.shape[0] // m, m, *x.shape[1:]).swapaxes(0, 1)
    if batch_layout is not None:
      mesh, spec = batch_layout
      y = jax.lax.with_sharding_constraint(
          y, NamedSharding(mesh, P(None, spec, *([None] * (x.ndim - 1)))))
    return y
  return jax.tree.map(one, tree)


def _grads(params, batch, mcfg, cfg, micro: int, batch_layout, dispatch=None):
  """Gradient and stats of the whole `batch`, accumulated over micro-batches of `micro` rows."""
  n_samples = jnp.maximum(jnp.sum(jnp.sum(batch["loss_mask_BT"], axis=1) > 0), 1).astype(
      jnp.float32)
  vg = jax.value_and_grad(loss_fn, has_aux=True)
  B = batch["tokens_BT"].shape[0]
  if micro == 0 or micro == B:
    (loss, stats), grads = vg(params, batch, n_samples, mcfg, cfg, dispatch)
    return loss, grads, stats
  mbs = _split(batch, B // micro, batch_layout)

  def body(carry, mb):
    loss_acc, g_acc, s_acc = carry
    (loss, stats), g = vg(params, mb, n_samples, mcfg, cfg, dispatch, micro / B)
    return (loss_acc + loss, jax.tree.map(jnp.add, g_acc, g), rl.combine_stats(s_acc, stats)), None

  first = jax.tree.map(lambda x: x[0], mbs)
  (loss, stats), grads = vg(params, first, n_samples, mcfg, cfg, dispatch, micro / B)
  rest = jax.tree.map(lambda x: x[1:], mbs)
  (loss, grads, stats), _ = jax.lax.scan(body, (loss, grads, stats), rest)
  return loss, grads, stats


def _update(state: TrainState, batch, mcfg, cfg, tx, micro, batch_layout, dispatch=None):
  loss, grads, stats = _grads(state.params, batch, mcfg, cfg, micro, batch_layout, dispatch)
  grad_norm = optax.tree.norm(grads)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  def apply(params, opt_state):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  # A non-finite step leaves params and optimizer state untouched (a branch, not a select: the
  # select would be one more pass over both).
  params, opt_state = jax.lax.cond(ok, apply, lambda p, o: (p, o), state.params, state.opt_state)
  new = TrainState(state.step + ok.astype(jnp.int32), params, opt_state, state.rng)
  finalize = finalize_sft_stats if cfg.objective == "sft" else rl.finalize_stats
  metrics = dict(finalize(stats), loss=loss, grad_norm=grad_norm,
                 skipped=1.0 - ok.astype(jnp.float32))
  if "router_aux_loss" in stats:
    metrics["router_aux_loss"] = stats["router_aux_loss"]
  return new, metrics


def _train_step(state: TrainState, batch, mcfg, cfg, tx, batch_layout, dispatch=None):
  B = batch["tokens_BT"].shape[0]
  M = cfg.minibatches
  if M == 1:
    new, metrics = _update(state, batch, mcfg, cfg, tx, cfg.micro_batch, batch_layout, dispatch)
    return new, dict(metrics, lr=jnp.float32(cfg.lr))
  # Several optimizer steps on one batch: the ratio is taken against the policy that started it.
  def old_logp(mb):
    return score(state.params, mb, mcfg, cfg.chunk, dispatch=dispatch)[0]
  micro = cfg.micro_batch or B
  if micro < B:
    logp_old = jax.lax.map(old_logp, _split(batch, B // micro, batch_layout))
    logp_old = logp_old.swapaxes(0, 1).reshape(B, -1)
  else:
    logp_old = old_logp(batch)
  batch = dict(batch, logp_old_BT=jax.lax.stop_gradient(logp_old))
  mini = _split(batch, M, batch_layout)
  sub_micro = 0 if cfg.micro_batch in (0, B // M) else cfg.micro_batch
  state, per_mb = jax.lax.scan(
      lambda s, mb: _update(s, mb, mcfg, cfg, tx, sub_micro, batch_layout, dispatch), state, mini)
  metrics = {k: (v.max() if k.endswith("_max") else v.mean()) for k, v in per_mb.items()}
  return state, dict(metrics, lr=jnp.float32(cfg.lr))


class Learner(NamedTuple):
  """What the loop holds: `init_state(params, seed)` and `train_step(state, batch)`."""

  model_cfg: model_lib.ModelConfig
  cfg: LearnerConfig
  mesh: Mesh
  state_shardings: TrainState
  init_state: Callable[..., TrainState]
  train_step: Callable[[TrainState, Mapping[str, Any]], tuple[TrainState, dict]]
  jitted_step: Callable  # the same step without the host-side batch checks


def batch_fields(cfg: LearnerConfig) -> tuple[str, ...]:
  if cfg.objective == "sft":
    return ("tokens_BT", "loss_mask_BT", "temperature_B")
  fields = ("tokens_BT", "loss_mask_BT", "advantages_B", "logp_behaviour_BT", "temperature_B")
  return fields + (("logp_ref_BT",) if cfg.kl_beta != 0.0 else ())


def validate_batch(batch: Mapping[str, Any], cfg: LearnerConfig, n_batch_shards: int = 1,
                   model_cfg: model_lib.ModelConfig | None = None) -> None:
  """Host-side checks that turn bad input into a clear error instead of a NaN update."""
  replay = bool(cfg.routing_replay and model_cfg is not None and model_cfg.n_experts)
  required = batch_fields(cfg) + (("experts_BTLk",) if replay else ())
  optional = ("positions_BT", "valid_BT", "score_index_BM", "prefix_tokens_UP", "prefix_slot_B")
  missing = [k for k in required if k not in batch]
  extra = [k for k in batch if k not in required + optional]
  if missing or extra:
    raise ValueError(f"batch fields: missing {missing}, unexpected {extra} (kl_beta="
                     f"{cfg.kl_beta}; logp_ref_BT is needed exactly when kl_beta != 0; "
                     f"experts_BTLk exactly when routing_replay is on for a MoE model)")
  B, T = np.shape(batch["tokens_BT"])
  if replay:
    shape = (B, T, len(model_cfg.sparse_layers), model_cfg.experts_per_token)
    e = np.asarray(batch["experts_BTLk"])
    if e.shape != shape or not np.issubdtype(e.dtype, np.integer):
      raise ValueError(f"batch['experts_BTLk'] has shape {e.shape} ({e.dtype}), expected integer "
                       f"experts of shape {shape}")
    if e.size and (e.min() < -1 or e.max() >= model_cfg.n_experts):
      raise ValueError(f"experts_BTLk must lie in [-1, {model_cfg.n_experts})")
  for k, v in batch.items():
    if k == "experts_BTLk":
      continue
    want = (B,) if k.endswith("_B") else (B, T)
    if k == "score_index_BM":  # [B, M] for any M, positions inside the sequence
      want = (B, np.shape(v)[-1] if np.ndim(v) == 2 else -1)
      if np.size(v) and (np.min(v) < 0 or np.max(v) >= T):
        raise ValueError(f"score_index_BM has positions outside [0, {T})")
    if k == "prefix_tokens_UP":  # checked below, against the rows
      continue
    if np.shape(v) != want:
      raise ValueError(f"batch[{k!r}] has shape {np.shape(v)}, expected {want}")
  mask = np.asarray(batch["loss_mask_BT"])
  if np.any(mask[:, 0] != 0):
    raise ValueError("loss_mask_BT[:, 0] must be 0: the first token has no prediction")
  if not np.any(mask.sum(axis=1) > 0):
    raise ValueError("every loss mask in the batch is empty: nothing to train on")
  if "advantages_B" in batch and not np.all(np.isfinite(np.asarray(batch["advantages_B"]))):
    raise ValueError("advantages_B has non-finite values")
  on = mask > 0
  for k in ("logp_behaviour_BT", "logp_ref_BT"):
    if k in batch and not np.all(np.isfinite(np.asarray(batch[k])[on])):
      raise ValueError(f"{k} has non-finite values on trained tokens")
  if not np.all(np.isfinite(np.asarray(batch["temperature_B"]))):
    raise ValueError("temperature_B has non-finite values")
  M = cfg.minibatches
  micro = cfg.micro_batch or B // M
  if B % (M * n_batch_shards) or (B // M) % micro or micro % n_batch_shards:
    raise ValueError(f"batch {B} must split into {M} minibatches of micro-batches of {micro} "
                     f"rows, each divisible by the {n_batch_shards} batch shards")
  if ("prefix_tokens_UP" in batch) != ("prefix_slot_B" in batch):
    raise ValueError("prefix_tokens_UP and prefix_slot_B come together")
  if "prefix_tokens_UP" in batch:
    if not _prefixes_apply(batch, cfg):
      raise ValueError("shared prefixes need right-padded rows (no positions_BT / valid_BT) "
                       "and one optimizer step per batch (minibatches 1)")
    prefix.check(batch["tokens_BT"], batch["prefix_tokens_UP"], batch["prefix_slot_B"],
                 B // micro)
    if len(batch["prefix_tokens_UP"]) // (B // micro) % n_batch_shards:
      raise ValueError(f"{len(batch['prefix_tokens_UP'])} shared prefixes do not divide over "
                       f"the {n_batch_shards} batch shards in each micro-batch")


def _prefixes_apply(batch: Mapping[str, Any], cfg: LearnerConfig) -> bool:
  """Shared prefixes fit right-padded rows (one position per column) and a step that scores the
  batch once (several minibatch steps would need a layout per minibatch)."""
  return cfg.minibatches == 1 and "positions_BT" not in batch and "valid_BT" not in batch


def with_shared_prefixes(batch: Mapping[str, Any], cfg: LearnerConfig, n_batch_shards: int = 1):
  """The batch with `prefix.find`'s split when sharing applies and saves work, else as given.

  With micro-batches the rows are reordered first (`prefix.grouping_order`) so that rows which
  share a prompt fall into the same micro-batch; the loss, a mean over rows, does not change.
  """
  B = np.shape(batch["tokens_BT"])[0]
  if not cfg.share_prefix or "prefix_tokens_UP" in batch or not _prefixes_apply(batch, cfg):
    return batch
  micro = cfg.micro_batch or B
  parts = B // micro
  bucket = -(-micro // 8 // n_batch_shards) * n_batch_shards  # U in steps of ~micro/8
  tokens = np.asarray(batch["tokens_BT"])
  order = prefix.grouping_order(tokens, parts) if parts > 1 else np.arange(B)
  split = prefix.find(tokens[order], parts, bucket)
  if split is None:
    return batch
  rows = {k: np.asarray(v)[order] for k, v in batch.items()}
  return dict(rows, prefix_tokens_UP=split.tokens_UP, prefix_slot_B=split.slot_B)


def prefix_saving(batch: Mapping[str, Any]) -> float:
  """The fraction of the batch's token positions that shared prefixes spare the model."""
  if "prefix_tokens_UP" not in batch:
    return 0.0
  (B, T), (N, P) = np.shape(batch["tokens_BT"]), np.shape(batch["prefix_tokens_UP"])
  return 1.0 - (N * P + B * (T - P)) / (B * T)


def make_learner(model_cfg: model_lib.ModelConfig, cfg: LearnerConfig, mesh: Mesh,
                 rules: Mapping[str, tuple[str, ...]] = sharding.DEFAULT_RULES) -> Learner:
  """Builds the sharded, jitted step for params laid out by `sharding.param_shardings`."""
  tx = optimizer(cfg)
  dispatch = (moe_lib.make_dispatch(mesh, rules, cfg.moe_impl) if model_cfg.n_experts else None)
  p_sh = sharding.param_shardings(model_cfg, mesh, rules)
  rep = sharding.replicated(mesh)
  abstract = jax.eval_shape(lambda: model_lib.init_params(model_cfg, jax.random.key(0)))
  opt_sh = optax.tree_map_params(tx, lambda _, s: s, jax.eval_shape(tx.init, abstract), p_sh,
                                 transform_non_params=lambda _: rep)
  state_sh = TrainState(rep, p_sh, opt_sh, rep)
  batch_layout = (mesh, sharding.spec_for(("batch",), rules, mesh=mesh)[0])
  n_shards = sharding.batch_shards(mesh, rules)

  def batch_sh(batch):
    return {k: sharding.batch_sharding(mesh, rules, np.ndim(v)) for k, v in batch.items()}

  step_fn = functools.partial(_train_step, mcfg=model_cfg, cfg=cfg, tx=tx,
                              batch_layout=batch_layout, dispatch=dispatch)
  jitted_by_fields: dict[tuple, Any] = {}

  def jitted(batch):
    key = tuple(sorted((k, np.ndim(v)) for k, v in batch.items()))
    if key not in jitted_by_fields:
      jitted_by_fields[key] = jax.jit(step_fn, in_shardings=(state_sh, batch_sh(batch)),
                                      out_shardings=(state_sh, rep), donate_argnums=(0,))
    return jitted_by_fields[key]

  opt_init = jax.jit(tx.init, out_shardings=opt_sh)

  def init_state(params, seed: int = 0) -> TrainState:
    """Step 0 and fresh AdamW moments for `params` (already in `state_shardings.params`)."""
    return TrainState(jax.device_put(jnp.int32(0), rep), params, opt_init(params),
                      jax.device_put(jax.random.PRNGKey(seed), rep))

  def jitted_step(state: TrainState, batch: Mapping[str, Any]):
    batch = with_shared_prefixes(batch, cfg, n_shards)
    if "score_index_BM" not in batch:
      batch = dict(batch, score_index_BM=score_index(batch["loss_mask_BT"]))
    saving = prefix_saving(batch)
    batch = {k: jax.device_put(v, s) for (k, v), s in zip(batch.items(), batch_sh(batch).values())}
    state, metrics = jitted(batch)(state, batch)
    return state, dict(metrics, prefix_saving=np.float32(saving))

  def train_step(state: TrainState, batch: Mapping[str, Any]):
    validate_batch(batch, cfg, n_shards, model_cfg)
    return jitted_step(state, batch)

  return Learner(model_cfg, cfg, mesh, state_sh, init_state, train_step, jitted_step)
