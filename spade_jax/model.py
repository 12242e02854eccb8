"""One decoder for the Llama, Qwen2 and Qwen3 dense families and Qwen3-MoE, as pure functions over
a pytree.

The parameters are a plain nested dict of arrays. Every leaf is declared once in `param_table`,
which gives its shape, its logical axis names (used by `sharding.py` to place it on the mesh) and
how to initialise it; `init_params`, `logical_axes` and the checkpoint converters all read that one
table. Transformer layers are stacked on a leading "layers" axis and run with `lax.scan`, so compile
time stays flat in depth.

Shape letters: B batch, T query time, S key time, D model, H query heads, K kv heads,
G = H // K query heads per kv head, Dh head dim, F ffn, V vocab, L layers, E experts.

Mixture-of-experts models (family "qwen3_moe") keep attention and norms in the "layers" stack and
their feed-forward weights in two more stacks, "moe" (the sparse layers: router and experts) and
"mlp" (the dense layers among them, if any); `layer_runs` says which layers form a run of one
kind. The expert block itself, its dispatch and expert parallelism live in `moe`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from spade_jax import attention as attention_lib
from spade_jax import moe as moe_lib
from spade_jax.blocks import (apply_rope, dense, matmul, norm_dense, rms_norm,  # noqa: F401
                              rope_tables, swiglu, swiglu_down, transposed)

Params = dict[str, Any]

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")


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
  # Mixture of experts (qwen3_moe; transformers' Qwen3MoeConfig field in brackets): E experts
  # [num_experts] of width d_ff_expert [moe_intermediate_size], experts_per_token of them per
  # token [num_experts_per_tok], their weights renormalised when norm_topk_prob; layer i is sparse
  # when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers (those use d_ff).
  n_experts: int = 0
  experts_per_token: int = 0
  d_ff_expert: int = 0
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()

  def __post_init__(self):
    # A config read back from JSON (checkpoint metadata) has a list here; keep it hashable.
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
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
    if (self.family == "qwen3_moe") != (self.n_experts > 0):
      problems.append(f"family {self.family!r} with n_experts={self.n_experts}: experts come "
                      "with qwen3_moe and qwen3_moe with experts")
    if self.n_experts and not (0 < self.experts_per_token <= self.n_experts
                               and self.d_ff_expert > 0 and self.decoder_sparse_step > 0):
      problems.append(f"need 0 < experts_per_token={self.experts_per_token} <= n_experts="
                      f"{self.n_experts}, d_ff_expert={self.d_ff_expert} > 0 and "
                      f"decoder_sparse_step={self.decoder_sparse_step} > 0")
    if any(not 0 <= i < self.n_layers for i in self.mlp_only_layers):
      problems.append(f"mlp_only_layers {self.mlp_only_layers} outside 0..{self.n_layers - 1}")
    if problems:
      raise ValueError("invalid ModelConfig: " + "; ".join(problems))

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  @property
  def sparse_layers(self) -> tuple[int, ...]:
    """The layers whose feed-forward block is the mixture of experts (transformers' rule)."""
    return tuple(i for i in range(self.n_layers) if self.n_experts and i not in
                 self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0)

  @property
  def dense_layers(self) -> tuple[int, ...]:
    return tuple(i for i in range(self.n_layers) if i not in self.sparse_layers)


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
    # A dense layer between two sparse ones, and odd sizes, for tests and CPU benchmarks.
    "tiny_moe": ModelConfig("qwen3_moe", vocab_size=256, d_model=64, n_layers=3, n_heads=4,
                            n_kv_heads=2, head_dim=16, d_ff=96, rope_theta=10_000.0,
                            norm_eps=1e-6, qk_norm=True, qkv_bias=False, tie_embeddings=False,
                            max_seq_len=512, n_experts=6, experts_per_token=2, d_ff_expert=40,
                            norm_topk_prob=True, mlp_only_layers=(1,)),
    # Qwen/Qwen3-30B-A3B's config.json (the Instruct-2507 release has rope_theta 1e7).
    "qwen3_30b_a3b": ModelConfig("qwen3_moe", vocab_size=151936, d_model=2048, n_layers=48,
                                 n_heads=32, n_kv_heads=4, head_dim=128, d_ff=6144,
                                 rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True,
                                 qkv_bias=False, tie_embeddings=False, max_seq_len=40960,
                                 n_experts=128, experts_per_token=8, d_ff_expert=768,
                                 norm_topk_prob=True),
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
      "final_norm": ParamSpec((D,), ("embed",), "ones"),
  }
  # A dense model keeps its MLPs in the layer stack; a MoE model stacks dense and sparse
  # layers' feed-forward weights apart ("mlp", "moe"), each over its own layers.
  Ld, Ls, E, Fe = len(cfg.dense_layers), len(cfg.sparse_layers), cfg.n_experts, cfg.d_ff_expert
  mlp = "mlp" if cfg.n_experts else "layers"
  if Ld:
    t[f"{mlp}/w_gate"] = ParamSpec((Ld, D, F), ("layers", "embed", "mlp"), d)
    t[f"{mlp}/w_up"] = ParamSpec((Ld, D, F), ("layers", "embed", "mlp"), d)
    t[f"{mlp}/w_down"] = ParamSpec((Ld, F, D), ("layers", "mlp", "embed"), f)
  if Ls:
    t["moe/router"] = ParamSpec((Ls, D, E), ("layers", "embed", "experts"), d)
    t["moe/w_gate"] = ParamSpec((Ls, E, D, Fe), ("layers", "experts", "embed", "mlp"), d)
    t["moe/w_up"] = ParamSpec((Ls, E, D, Fe), ("layers", "experts", "embed", "mlp"), d)
    t["moe/w_down"] = ParamSpec((Ls, E, Fe, D), ("layers", "experts", "mlp", "embed"), Fe ** -0.5)
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
# Building blocks (the products with hand-written backward passes are in `blocks`)


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


def mlp(p, x_BTD, cfg: ModelConfig):
  """The feed-forward block on the residual stream x, its norm (`mlp_norm`) included."""
  gate, up = norm_dense(x_BTD, p["mlp_norm"], (p["w_gate"], p["w_up"]), cfg.norm_eps, cfg.dtype)
  return swiglu_down(gate, up, p["w_down"], cfg.dtype)


def cast(tree, cfg: ModelConfig):
  """Parameters in the compute dtype (norm weights included: rms_norm upcasts internally); a
  router stays float32, since rounding its logits would change which experts a token gets."""
  dt = jnp.dtype(cfg.dtype)
  keep = lambda path: any(getattr(k, "key", None) == "router" for k in path)
  return jax.tree_util.tree_map_with_path(lambda p, a: a if keep(p) else a.astype(dt), tree)


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
                remat: bool = False, routing: moe_lib.Routing | None = None):
  """Every decoder layer (a scan over the stacked weights) applied to the streams `xs`.

  A mixture-of-experts model runs one scan per `moe.layer_runs` run and returns (streams,
  `moe.RouterStats` stacked over its sparse layers); `routing` gives the expert dispatch, routing
  to replay and the tokens the statistics count (`moe.Routing`). The expert block is left to
  autodiff.
  """
  if cfg.n_experts:
    return _moe_layer_stack(params, xs, ropes, attend, cfg, remat, routing or moe_lib.Routing())

  def body(xs, p):
    return decoder_layer(p, xs, ropes, attend, cfg), None

  if remat:
    body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
  return jax.lax.scan(body, tuple(xs), params["layers"])[0]


def _moe_layer_stack(params, xs, ropes, attend, cfg, remat, routing: moe_lib.Routing):
  stats = []
  for run in moe_lib.layer_runs(cfg):
    n, sparse = run.end - run.first, run.kind == "moe"
    replays = routing.replay or (None,) * len(xs)
    rep = tuple(None if r is None or not sparse else r[run.offset:run.offset + n]
                for r in replays)

    def body(xs, layer, sparse=sparse):
      p, rep_l = layer
      attns = attend([qkv(p, x, cos, sin, cfg) for x, (cos, sin) in zip(xs, ropes)])
      xs = [x + dense(a, p["wo"], 2, cfg.dtype) for x, a in zip(xs, attns)]
      if not sparse:
        return tuple(x + mlp(p, x, cfg) for x in xs), None
      outs = [moe_lib.block(p["moe"], rms_norm(x, p["mlp_norm"], cfg.norm_eps), cfg,
                            routing.dispatch, r) for x, r in zip(xs, rep_l)]
      return (tuple(x + y for x, (y, _) in zip(xs, outs)),
              moe_lib.stats([r for _, r in outs], cfg.n_experts, routing.counted))

    if remat:
      body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
    xs, s = jax.lax.scan(body, tuple(xs), (moe_lib.run_params(params, cfg, run), rep))
    if sparse:
      stats.append(s)
  return xs, jax.tree.map(lambda *a: jnp.concatenate(a), *stats)


def hidden_states(params: Params, tokens_BT, cfg: ModelConfig, positions_BT=None, mask_BTS=None,
                  remat: bool = False, routing: moe_lib.Routing | None = None):
  """Final-layer hidden states [B, T, D] (before the final norm) in float32; given `routing` (a
  MoE model only), (hidden states, `moe.RouterStats`).

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
  if cfg.n_experts:
    (h,), stats = layer_stack(params, (x,), (rope,), attend, cfg, remat, routing)
    return h if routing is None else (h, stats)
  return layer_stack(params, (x,), (rope,), attend, cfg, remat)[0]


def forward(params: Params, tokens_BT, cfg: ModelConfig, positions_BT=None, mask_BTS=None,
            remat: bool = False, dispatch: moe_lib.Dispatch | None = None):
  """Logits [B, T, V] in float32 for a batch of (possibly padded) sequences.

  positions_BT defaults to 0..T-1 per row; mask_BTS (True = may attend) defaults to causal, and a
  given mask must be causal too (attention skips the keys after each block of queries). For
  left-padded rows pass positions counting from the first real token and `default_mask(T, valid)`.
  `dispatch` says how a MoE model runs its experts (`moe.Dispatch`; default: one device).
  """
  if cfg.n_experts:
    h, _ = hidden_states(params, tokens_BT, cfg, positions_BT, mask_BTS, remat,
                         moe_lib.Routing(dispatch))
    return unembed(params, h, cfg)
  h = hidden_states(params, tokens_BT, cfg, positions_BT, mask_BTS, remat)
  return unembed(params, h, cfg)
