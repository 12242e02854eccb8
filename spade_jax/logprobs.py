"""The one definition of a sampled token's log-prob, shared by the sampler and the learner.

Convention (SPADE.md §7: sampler and learner score at the same temperature):

  logp(token) = log_softmax(logits / T)[token]

over the FULL vocabulary, at the row's own sampling temperature T. Top-k / top-p truncation only
decides which token is drawn; it does not renormalise the reported log-prob. The learner scores
with this same function and the same per-sample T, so on-policy ratios are exactly 1 up to
numerics, and truncated importance sampling absorbs the small mass the truncation removed.
Greedy rows (T <= 0) are scored at T = 1.0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def effective_temperature(temperature_B):
  """The temperature log-probs are taken at: T for sampled rows, 1.0 for greedy rows (T <= 0)."""
  t = jnp.asarray(temperature_B, jnp.float32)
  return jnp.where(t > 0, t, 1.0)


def token_logprobs(logits_BTV, tokens_BT, temperature_B):
  """log_softmax(logits / T)[token] in float32, shape [B, T].

  logits_BTV: [B, T, V] logits that predict tokens_BT (already shifted by the caller).
  temperature_B: [B] (or scalar) per-row temperature; T <= 0 means greedy and is scored at 1.0.
  """
  t_B = jnp.broadcast_to(effective_temperature(temperature_B), logits_BTV.shape[:1])
  scaled = logits_BTV.astype(jnp.float32) / t_B[:, None, None]
  picked = jnp.take_along_axis(scaled, tokens_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(scaled, axis=-1)
