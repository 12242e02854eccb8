"""The one definition of a sampled token's log-prob, shared by the sampler and the learner.

Convention (docs/method.md §7: sampler and learner score at the same temperature):

  logp(token) = log_softmax(logits / T)[token]

over the FULL vocabulary, at the row's own sampling temperature T. Top-k / top-p truncation only
decides which token is drawn; it does not renormalise the reported log-prob. The learner scores
with this same function and the same per-sample T, so on-policy ratios are exactly 1 up to
numerics, and truncated importance sampling absorbs the small mass the truncation removed.
Greedy rows (T <= 0) are scored at T = 1.0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def effective_temperature(temperature_B):
  """The temperature log-probs are taken at: T for sampled rows, 1.0 for greedy rows (T <= 0)."""
  t = jnp.asarray(temperature_B, jnp.float32)
  return jnp.where(t > 0, t, 1.0)


def tempered(logits_BTV, temperature_B):
  """logits / T in float32, at each row's effective temperature ([B] or scalar T)."""
  t_B = jnp.broadcast_to(effective_temperature(temperature_B), logits_BTV.shape[:1])
  return logits_BTV.astype(jnp.float32) / t_B.reshape(-1, *([1] * (logits_BTV.ndim - 1)))


def _picked(z, tokens):
  """z[..., token] for each position."""
  return jnp.take_along_axis(z, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(z, lse):
  """Entropy of softmax(z) along the last axis, given its log-normaliser lse = logsumexp(z)."""
  return lse - jnp.sum(jnp.exp(z - lse[..., None]) * z, axis=-1)


def token_logprobs(logits_BTV, tokens_BT, temperature_B):
  """log_softmax(logits / T)[token] in float32, shape [B, T].

  logits_BTV: [B, T, V] logits that predict tokens_BT (already shifted by the caller).
  temperature_B: [B] (or scalar) per-row temperature; T <= 0 means greedy and is scored at 1.0.
  """
  z = tempered(logits_BTV, temperature_B)
  return _picked(z, tokens_BT) - jax.nn.logsumexp(z, axis=-1)


# ---------------------------------------------------------------------------------------------
# The learner's path: log-probs straight from hidden states, with a hand-written backward pass.


def head_logits(h_ND, w, vocab_major: bool):
  """Float32 logits h @ w for an output matrix w stored [V, D] (`vocab_major`) or [D, V]."""
  dims = (((1,), (1,)), ((), ())) if vocab_major else (((1,), (0,)), ((), ()))
  return jax.lax.dot_general(h_ND, w.astype(h_ND.dtype), dims,
                             preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def hidden_logprobs(h_ND, w, tokens_N, temperature_N, vocab_major: bool):
  """`token_logprobs` of the logits h @ w (w is [V, D] when `vocab_major`, else [D, V]), plus the
  entropy of each tempered distribution (no gradient), as float32 [N] each.

  One output projection per call and one in the backward pass, which recomputes the logits from
  h rather than storing them: only h and the per-row log-normaliser are kept. The gradient of the
  log-prob with respect to the logits is (onehot(token) - softmax) / T, formed in one pass.
  """
  logp, ent, _ = _hidden_logprobs_fwd_math(h_ND, w, tokens_N, temperature_N, vocab_major)
  return logp, ent


def _hidden_logprobs_fwd_math(h_ND, w, tokens_N, temperature_N, vocab_major):
  z = tempered(head_logits(h_ND, w, vocab_major), temperature_N)
  lse = jax.nn.logsumexp(z, axis=-1)
  return _picked(z, tokens_N) - lse, entropy(z, lse), lse


def _hidden_logprobs_fwd(h_ND, w, tokens_N, temperature_N, vocab_major):
  logp, ent, lse = _hidden_logprobs_fwd_math(h_ND, w, tokens_N, temperature_N, vocab_major)
  return (logp, ent), (h_ND, w, tokens_N, temperature_N, lse)


def _hidden_logprobs_bwd(vocab_major, res, cotangents):
  h_ND, w, tokens_N, temperature_N, lse = res
  g_N = cotangents[0]  # the entropy output carries no gradient
  z = tempered(head_logits(h_ND, w, vocab_major), temperature_N)
  onehot = jnp.arange(z.shape[1], dtype=jnp.int32)[None, :] == tokens_N[:, None]
  scale_N = g_N / effective_temperature(temperature_N)
  dlogits = ((onehot - jnp.exp(z - lse[:, None])) * scale_N[:, None]).astype(h_ND.dtype)
  # dh contracts dlogits with w's vocabulary axis: the head product with the orientation swapped.
  dh = head_logits(dlogits, w, not vocab_major)
  dw = jnp.dot(h_ND.T, dlogits, preferred_element_type=jnp.float32)  # [D, V]
  dw = dw.T if vocab_major else dw
  return (dh.astype(h_ND.dtype), dw.astype(w.dtype), np.zeros(tokens_N.shape, jax.dtypes.float0),
          jnp.zeros_like(temperature_N))


hidden_logprobs.defvjp(_hidden_logprobs_fwd, _hidden_logprobs_bwd)
