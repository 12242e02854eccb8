"""One decoder for the Llama, Qwen2 and Qwen3 dense families, as pure functions over a pytree.

The parameters are a plain nested dict of arrays. Every leaf is declared once in `param_table`,
which gives its shape, its logical axis names (used by `sharding.py` to place it on the mesh) and
how to initialise it; `init_params`, `logical_axes` and the checkpoint converters all read that one
table. Transformer layers are stacked on a leading "layers" axis and run with `lax.scan`, so compile
time stays flat in depth.

Shape letters: B batch, T query time, S key time, D model, H query heads, K kv heads,
G = H // K query heads per kv head, Dh head dim, F ffn, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from spade_jax import attention as attention_lib

Params = dict[str, Any]

FAMILIES = ("llama", "qwen2", "qwen3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a decoder. Frozen and hashable: it is a static argument of jitted functions."""

  family: str
  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  d_ff: int
  rope_theta: float
  norm_eps: float
  qk_norm: bool
  qkv_bias: bool
  tie_embeddings: bool
  max_seq_len: int
  dtype: str = "float32"  # compute dtype; params stay float32

  def __post_init__(self):
    problems = []
    if self.family not in FAMILIES:
      problems.append(f"family {self.family!r} is not one of {FAMILIES}")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                 "max_seq_len"):
      if int(getattr(self, name)) <= 0:
        problems.append(f"{name} must be positive, got {getattr(self, name)}")
    if self.n_kv_heads > 0 and self.n_heads % self.n_kv_heads:
      problems.append(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
    if self.head_dim % 2:
      problems.append(f"head_dim={self.head_dim} must be even for rotary embeddings")
    if self.dtype not in ("float32", "bfloat16"):
      problems.append(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
    if problems:
      raise ValueError("invalid ModelConfig: " + "; ".join(problems))

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig("qwen3", vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, d_ff=128, rope_theta=10_000.0, norm_eps=1e-6, qk_norm=True,
                        qkv_bias=False, tie_embeddings=False, max_seq_len=512),
    # SmolLM2's vocabulary on a tiny body: pairs with the embedded tokenizer in end-to-end tests.
    "tiny_smollm2": ModelConfig("llama", vocab_size=49152, d_model=64, n_layers=2, n_heads=4,
                                n_kv_heads=2, head_dim=16, d_ff=128, rope_theta=100_000.0,
                                norm_eps=1e-5, qk_norm=False, qkv_bias=False,
                                tie_embeddings=True, max_seq_len=8192),
    "smollm2_135m": ModelConfig("llama", vocab_size=49152, d_model=576, n_layers=30, n_heads=9,
                                n_kv_heads=3, head_dim=64, d_ff=1536, rope_theta=100_000.0,
                                norm_eps=1e-5, qk_norm=False, qkv_bias=False, tie_embeddings=True,
                                max_seq_len=8192),
    "qwen3_0_6b": ModelConfig("qwen3", vocab_size=151936, d_model=1024, n_layers=28, n_heads=16,
                              n_kv_heads=8, head_dim=128, d_ff=3072, rope_theta=1_000_000.0,
                              norm_eps=1e-6, qk_norm=True, qkv_bias=False, tie_embeddings=True,
                              max_seq_len=40960),
    "qwen3_1_7b": ModelConfig("qwen3", vocab_size=151936, d_model=2048, n_layers=28, n_heads=16,
                              n_kv_heads=8, head_dim=128, d_ff=6144, rope_theta=1_000_000.0,
                              norm_eps=1e-6, qk_norm=True, qkv_bias=False, tie_embeddings=True,
                              max_seq_len=40960),
    "qwen3_4b": ModelConfig("qwen3", vocab_size=151936, d_model=2560, n_layers=36, n_heads=32,
                            n_kv_heads=8, head_dim=128, d_ff=9728, rope_theta=1_000_000.0,
                            norm_eps=1e-6, qk_norm=True, qkv_bias=False, tie_embeddings=True,
                            max_seq_len=40960),
    "qwen3_8b": ModelConfig("qwen3", vocab_size=151936, d_model=4096, n_layers=36, n_heads=32,
                            n_kv_heads=8, head_dim=128, d_ff=12288, rope_theta=1_000_000.0,
                            norm_eps=1e-6, qk_norm=True, qkv_bias=False, tie_embeddings=False,
                            max_seq_len=40960),
}


class ParamSpec(NamedTuple):
  shape: tuple[int, ...]
  axes: tuple[str, ...]  # logical axis names, one per dim
  init: str | float  # "ones", "zeros", or the std of a normal init


def param_table(cfg: ModelConfig) -> dict[str, ParamSpec]:
  """Every parameter of the model, keyed by its '/'-joined path in the params pytree."""
  L, D, H, K, Dh, F, V = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                          cfg.d_ff, cfg.vocab_size)
  d, hd, f = D ** -0.5, (H * Dh) ** -0.5, F ** -0.5  # fan-in scaled init stds
  t = {
      "embed": ParamSpec((V, D), ("vocab", "embed"), 0.02),
      "layers/attn_norm": ParamSpec((L, D), ("layers", "embed"), "ones"),
      "layers/wq": ParamSpec((L, D, H, Dh), ("layers", "embed", "heads", "head_dim"), d),
      "layers/wk": ParamSpec((L, D, K, Dh), ("layers", "embed", "kv_heads", "head_dim"), d),
      "layers/wv": ParamSpec((L, D, K, Dh), ("layers", "embed", "kv_heads", "head_dim"), d),
      "layers/wo": ParamSpec((L, H, Dh, D), ("layers", "heads", "head_dim", "embed"), hd),
      "layers/mlp_norm": ParamSpec((L, D), ("layers", "embed"), "ones"),
      "layers/w_gate": ParamSpec((L, D, F), ("layers", "embed", "mlp"), d),
      "layers/w_up": ParamSpec((L, D, F), ("layers", "embed", "mlp"), d),
      "layers/w_down": ParamSpec((L, F, D), ("layers", "mlp", "embed"), f),
      "final_norm": ParamSpec((D,), ("embed",), "ones"),
  }
  if cfg.qkv_bias:
    t["layers/bq"] = ParamSpec((L, H, Dh), ("layers", "heads", "head_dim"), "zeros")
    t["layers/bk"] = ParamSpec((L, K, Dh), ("layers", "kv_heads", "head_dim"), "zeros")
    t["layers/bv"] = ParamSpec((L, K, Dh), ("layers", "kv_heads", "head_dim"), "zeros")
  if cfg.qk_norm:
    t["layers/q_norm"] = ParamSpec((L, Dh), ("layers", "head_dim"), "ones")
    t["layers/k_norm"] = ParamSpec((L, Dh), ("layers", "head_dim"), "ones")
  if not cfg.tie_embeddings:
    t["lm_head"] = ParamSpec((D, V), ("embed", "vocab"), d)
  return t


def nest(flat: dict[str, Any]) -> Params:
  """{'a/b': x} -> {'a': {'b': x}}."""
  out: Params = {}
  for path, value in flat.items():
    *parents, leaf = path.split("/")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return out


def flatten(tree: Params, prefix: str = "") -> dict[str, Any]:
  """{'a': {'b': x}} -> {'a/b': x}."""
  out = {}
  for k, v in tree.items():
    path = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, path + "/"))
    else:
      out[path] = v
  return out


def logical_axes(cfg: ModelConfig) -> Params:
  """The params pytree with each leaf replaced by its tuple of logical axis names."""
  return nest({k: s.axes for k, s in param_table(cfg).items()})


def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
  """Random float32 parameters (scaled normal), for tests and from-scratch training."""
  table = param_table(cfg)
  keys = jax.random.split(key, len(table))
  flat = {}
  for k, (path, spec) in zip(keys, sorted(table.items())):
    if spec.init == "ones":
      flat[path] = jnp.ones(spec.shape, jnp.float32)
    elif spec.init == "zeros":
      flat[path] = jnp.zeros(spec.shape, jnp.float32)
    else:
      flat[path] = spec.init * jax.random.normal(k, spec.shape, jnp.float32)
  return nest(flat)


def count_params(tree: Params) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


# ---------------------------------------------------------------------------------------------
# Building blocks


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


def qkv(p, x_BTD, cos, sin, cfg: ModelConfig):
  """Normalises one layer's input (`attn_norm`) and projects it to rotated queries, keys and
  values."""
  q, k, v = norm_dense(x_BTD, p["attn_norm"], (p["wq"], p["wk"], p["wv"]), cfg.norm_eps,
                       cfg.dtype)
  if cfg.qkv_bias:
    q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
  if cfg.qk_norm:
    q = rms_norm(q, p["q_norm"], cfg.norm_eps)
    k = rms_norm(k, p["k_norm"], cfg.norm_eps)
  return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


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


def mlp(p, x_BTD, cfg: ModelConfig):
  """The feed-forward block on the residual stream x, its norm (`mlp_norm`) included."""
  gate, up = norm_dense(x_BTD, p["mlp_norm"], (p["w_gate"], p["w_up"]), cfg.norm_eps, cfg.dtype)
  return swiglu_down(gate, up, p["w_down"], cfg.dtype)


def cast(tree, cfg: ModelConfig):
  """Parameters in the compute dtype (norm weights included: rms_norm upcasts internally)."""
  dt = jnp.dtype(cfg.dtype)
  return jax.tree.map(lambda a: a.astype(dt), tree)


# ---------------------------------------------------------------------------------------------
# The forward pass

def embed(params: Params, tokens_BT):
  """Token embeddings in the embedding table's dtype."""
  return jnp.take(params["embed"], tokens_BT, axis=0)


def unembed(params: Params, h_BTD, cfg: ModelConfig):
  """Final norm + output projection in the compute dtype; logits in float32."""
  h = rms_norm(h_BTD, params["final_norm"], cfg.norm_eps).astype(jnp.dtype(cfg.dtype))
  w = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
  return jnp.einsum("btd,dv->btv", h, w.astype(h.dtype), preferred_element_type=jnp.float32)


def default_mask(T: int, valid_BT=None, offset: int = 0):
  """Causal mask [B or 1, T, offset + T] for queries at key positions offset..offset+T-1, with
  padded keys masked out when `valid_BT` is given (then offset must be 0)."""
  causal = jnp.tril(jnp.ones((T, offset + T), bool), k=offset)[None]
  if valid_BT is None:
    return causal
  return causal & valid_BT[:, None, :].astype(bool)


# Attention over a layer's streams: [(q, k, v) of each stream] -> [attention output of each].
AttendFn = Callable[[list], list]


def decoder_layer(p, xs, ropes, attend: AttendFn, cfg: ModelConfig):
  """One pre-norm transformer block over whole (uncached) sequences.

  `xs` holds residual streams [B_i, T_i, D] that share the layer's weights and `ropes` their
  (cos, sin) tables; `attend` relates their queries, keys and values (one causal stream in the
  plain forward pass; a shared prompt and its continuations in `prefix`).
  """
  attns = attend([qkv(p, x, cos, sin, cfg) for x, (cos, sin) in zip(xs, ropes)])
  xs = [x + dense(a, p["wo"], 2, cfg.dtype) for x, a in zip(xs, attns)]
  return tuple(x + mlp(p, x, cfg) for x in xs)


def layer_stack(params: Params, xs, ropes, attend: AttendFn, cfg: ModelConfig,
                remat: bool = False):
  """Every decoder layer (a scan over the stacked weights) applied to the streams `xs`."""
  def body(xs, p):
    return decoder_layer(p, xs, ropes, attend, cfg), None

  if remat:
    body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
  return jax.lax.scan(body, tuple(xs), params["layers"])[0]


def hidden_states(params: Params, tokens_BT, cfg: ModelConfig, positions_BT=None, mask_BTS=None,
                  remat: bool = False):
  """Final-layer hidden states [B, T, D] (before the final norm) in float32.

  Activations, norms and attention stay in float32 and the weights stay as given: each `dense`
  casts its two operands to the compute dtype (`cfg.dtype`) and accumulates in float32, so in
  bfloat16 only the products run in bfloat16 and the backward pass keeps float32 residuals.
  """
  B, T = tokens_BT.shape
  if positions_BT is None:
    positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  if mask_BTS is None:
    mask_BTS = default_mask(T)
  rope = rope_tables(positions_BT, cfg.head_dim, cfg.rope_theta)
  attend = lambda qkvs: [attention_lib.attention(*qkvs[0], mask_BTS, causal=True)]
  x = embed(params, tokens_BT).astype(jnp.float32)
  return layer_stack(params, (x,), (rope,), attend, cfg, remat)[0]


def forward(params: Params, tokens_BT, cfg: ModelConfig, positions_BT=None, mask_BTS=None,
            remat: bool = False):
  """Logits [B, T, V] in float32 for a batch of (possibly padded) sequences.

  positions_BT defaults to 0..T-1 per row; mask_BTS (True = may attend) defaults to causal, and a
  given mask must be causal too (attention skips the keys after each block of queries). For
  left-padded rows pass positions counting from the first real token and `default_mask(T, valid)`.
  """
  h = hidden_states(params, tokens_BT, cfg, positions_BT, mask_BTS, remat)
  return unembed(params, h, cfg)
