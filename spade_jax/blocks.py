"""Building blocks of the decoder with hand-written backward passes: RMSNorm, rotary tables,
the linear layers (`dense`, `norm_dense`) and the fused SwiGLU output product.

Each custom VJP keeps fewer or cheaper residuals than autodiff would under the layer scan, or
keeps XLA's CPU backend on its fast bfloat16 kernels; the docstrings say which. `model`
re-exports them, so `model.dense` and the rest keep their names.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


def rms_norm(x, w, eps: float):
  """RMSNorm in float32, cast back to the input dtype before the scale (as HF does)."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return w.astype(x.dtype) * y.astype(x.dtype)


def rope_tables(positions_BT, head_dim: int, theta: float):
  """cos/sin of shape [B, T, Dh/2] for the half-split (rotate_half) rotary convention."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = positions_BT.astype(jnp.float32)[..., None] * inv_freq
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BTND, cos_BTd, sin_BTd):
  x1, x2 = jnp.split(x_BTND.astype(jnp.float32), 2, axis=-1)
  c, s = cos_BTd[:, :, None, :], sin_BTd[:, :, None, :]
  return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x_BTND.dtype)


def _as_matrices(x, w, n_in: int):
  lead, ins, outs = x.shape[:-n_in], w.shape[:n_in], w.shape[n_in:]
  return (x.reshape(math.prod(lead), math.prod(ins)), w.reshape(math.prod(ins), math.prod(outs)),
          lead, outs)


def matmul(a, b):
  """a @ b of 2-d arrays, accumulated and returned in float32 (bfloat16 inputs stay bfloat16).

  Asking for a float32 result is what sends a bfloat16 product to XLA's CPU dot library (the
  AVX-512 / AMX bfloat16 kernels); a bfloat16 result takes a much slower generic path.
  """
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def transposed(a):
  """a.T of a 2-d array, materialised as a row-major copy.

  XLA's CPU backend runs a bfloat16 product in its dot library only when both operands are
  row-major; a plain transpose is folded into the product instead, which then runs in float32 at
  a third of the speed. A transpose written through a 3-d reshape stays a copy (one pass over
  `a`). Backends that fold it back lose nothing.
  """
  m, n = a.shape
  g = next((g for g in (16, 8, 4, 2) if m % g == 0), 1)
  return a.reshape(g, m // g, n).transpose(2, 0, 1).reshape(n, m)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def dense(x, w, n_in: int, dtype=None):
  """Contracts the last `n_in` dims of `x` with the first `n_in` of `w`: [..., *in] -> [..., *out].

  The same product as an einsum, with its operands cast to `dtype` (default: x's dtype), float32
  accumulation and the result in x's dtype; the backward pass is two plain matmuls over the
  flattened tokens (dx = dy w^T, dw = x^T dy) with the same operand dtype. Only the operands are
  cast here and x, w are saved as given, so float32 activations with bfloat16 products keep
  float32 residuals (XLA's CPU backend turns each bfloat16 write into a scanned stack into a
  convert of the whole stack). Left to autodiff, XLA's CPU backend folds the weight-gradient
  transpose into the elementwise fusion that produces dy (a strided write of the largest
  activation); here it falls on x instead.
  """
  x2, w2, lead, outs = _as_matrices(x, w, n_in)
  dt = dtype or x.dtype
  return matmul(x2.astype(dt), w2.astype(dt)).astype(x.dtype).reshape(*lead, *outs)


def _dense_fwd(x, w, n_in, dtype):
  return dense(x, w, n_in, dtype), (x, w)


def _dense_bwd(n_in, dtype, res, dy):
  x, w = res
  x2, w2, lead, outs = _as_matrices(x, w, n_in)
  dt = dtype or x.dtype
  dy2 = dy.reshape(x2.shape[0], w2.shape[1]).astype(dt)
  # dx: a product over both operands' last dim (an explicit w.T would run in float32 on CPU).
  # dw: in bfloat16 through a materialised x^T (see `transposed`); float32 has its own TN kernel.
  dx = jax.lax.dot_general(dy2, w2.astype(dt), (((1,), (1,)), ((), ())),
                           preferred_element_type=jnp.float32).astype(x.dtype).reshape(x.shape)
  x2t = x2.astype(dt).T if jnp.dtype(dt) == jnp.float32 else transposed(x2.astype(dt))
  dw = matmul(x2t, dy2)
  return dx, dw.astype(w.dtype).reshape(w.shape)


dense.defvjp(_dense_fwd, _dense_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def norm_dense(x, norm_w, ws, eps: float, dtype=None):
  """`dense(rms_norm(x, norm_w, eps), w, 1, dtype)` for each w of the tuple `ws`.

  The backward pass keeps x and recomputes the norm: under the layer scan that is one
  [tokens, d_model] residual stack per norm, where autodiff kept three (x, the normalised x
  and the scaled output the products read).
  """
  h = rms_norm(x, norm_w, eps)
  return tuple(dense(h, w, 1, dtype) for w in ws)


def _norm_dense_fwd(x, norm_w, ws, eps, dtype):
  return norm_dense(x, norm_w, ws, eps, dtype), (x, norm_w, ws)


def _norm_dense_bwd(eps, dtype, res, dys):
  x, norm_w, ws = res
  h, norm_vjp = jax.vjp(functools.partial(rms_norm, eps=eps), x, norm_w)
  dh, dws = zip(*(_dense_bwd(1, dtype, (h, w), dy) for w, dy in zip(ws, dys)))
  return (*norm_vjp(sum(dh)), dws)


norm_dense.defvjp(_norm_dense_fwd, _norm_dense_bwd)


def swiglu(gate, up):
  return jax.nn.silu(gate) * up


def _swiglu_grads(gate, up, dy):
  """(d gate, d up) of `swiglu` for the output cotangent dy."""
  sig = jax.nn.sigmoid(gate)
  return dy * up * sig * (1 + gate * (1 - sig)), dy * gate * sig


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def swiglu_down(gate, up, w_down, dtype=None):
  """`dense(swiglu(gate, up), w_down)`, whose backward keeps only gate, up and w_down and
  recomputes the product's input from them. Left to autodiff, the product's input, the sigmoid
  and its intermediate products are saved too, each a [layers, tokens, d_ff] stack under the
  layer scan, written and read back."""
  return dense(swiglu(gate, up), w_down, 1, dtype)


def _swiglu_down_fwd(gate, up, w_down, dtype):
  return swiglu_down(gate, up, w_down, dtype), (gate, up, w_down)


def _swiglu_down_bwd(dtype, res, dy):
  gate, up, w_down = res
  ds, dw = _dense_bwd(1, dtype, (swiglu(gate, up), w_down), dy)
  return (*_swiglu_grads(gate, up, ds), dw)


swiglu_down.defvjp(_swiglu_down_fwd, _swiglu_down_bwd)
