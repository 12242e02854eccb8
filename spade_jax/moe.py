"""Mixture-of-experts feed-forward blocks as transformers' Qwen3MoeForCausalLM computes them
(docs/method.md §8b): routing, dropless dispatch to the experts, expert parallelism, and the
layout of mixed layer stacks.

Routing: router logits in float32 at the highest matmul precision (a default float32 product on
TPU rounds its operands to bfloat16, enough to flip a near-tie between two experts), a softmax
over all E experts, the top k, renormalised to sum to one when `norm_topk_prob`. Replayed
routing (the sampler's experts, given to the learner so that its log-probs and the sampler's
come from the same experts) keeps the experts it is given and takes only their weights from the
current router, so the router still gets gradients.

Dispatch is dropless: every (token, expert) assignment is computed, none is dropped. The
assignments are sorted by expert and run through a grouped matmul, one of `IMPLS`:
  ragged_dot  `jax.lax.ragged_dot`, XLA's grouped matmul on TPU and GPU (on CPU XLA lowers it
              to a masked product over every expert, slower than `dense`: `bench moe`);
  megablox    the Pallas TPU grouped-matmul kernel (jax.experimental.pallas.ops.tpu.megablox);
  tiles       each expert's rows padded to tiles of `tm` rows and one batched product of every
              tile with its expert's weights: work in proportion to the assignments, at most one
              partial tile per expert (the default on CPU);
  dense       every expert on every token, combined with the routing weights: the reference;
  auto        tiles on CPU, ragged_dot on accelerators.

Expert parallelism (`Dispatch.mesh`): the expert dim of the weights is split over the mesh axes
of the "experts" rule. Tokens reach their experts by replication and reduction, not all-to-all:
inside a `shard_map`, each device all-gathers the tokens of the expert axes that also split the
batch, computes its own experts' share of every gathered token, and a reduce-scatter (psum over
the axes that do not split the batch, and over the "mlp" axes of a tensor-split expert width)
returns each token's sum to its home shard. With k = 8 experts per token and at most 8 expert
shards, nearly every token has an expert on every shard, so the gather moves about the bytes an
all-to-all would, with static shapes and no capacity factor (an all-to-all must size its buffers
for the worst case, or drop tokens). The "embed" dim of the weights (FSDP) is all-gathered
inside, as XLA does for the dense layers.

Shape letters: N tokens (B * T), E experts (El on one shard), k experts per token, M sorted
assignment rows, D model, F expert width, Ls sparse layers.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

IMPLS = ("auto", "ragged_dot", "megablox", "tiles", "dense")


class Dispatch(NamedTuple):
  """How the expert products run: static and hashable (a jit static argument)."""
  impl: str = "auto"
  mesh: Any = None  # a jax.sharding.Mesh of more than one device, or None: no shard_map
  rules: tuple = ()  # the sharding rules as sorted (logical name, mesh axes) pairs


def make_dispatch(mesh, rules, impl: str = "auto") -> Dispatch:
  if impl not in IMPLS:
    raise ValueError(f"moe impl {impl!r} is not one of {IMPLS}")
  mesh = mesh if mesh is not None and mesh.devices.size > 1 else None
  return Dispatch(impl, mesh, tuple(sorted((k, tuple(v)) for k, v in dict(rules).items())))


def resolve_impl(impl: str) -> str:
  if impl != "auto":
    return impl
  return "tiles" if jax.default_backend() == "cpu" else "ragged_dot"


class Routing(NamedTuple):
  """What a MoE layer stack is given besides the weights: the dispatch, and per stream the routing
  to replay ([Ls, B_i, T_i, k] int, -1 = route afresh) and the tokens its router statistics count
  ([B_i, T_i] bool, None = all)."""
  dispatch: Dispatch | None = None
  replay: tuple | None = None
  counted: tuple | None = None


class Route(NamedTuple):
  experts: jax.Array  # int32 [..., k]
  weights: jax.Array  # float32 [..., k]
  probs: jax.Array  # float32 [..., E]: the softmax over all experts


class RouterStats(NamedTuple):
  """Per sparse layer (stacked [Ls, ...] by the layer scan): what the load-balancing loss needs."""
  counts_E: jax.Array  # float32: assignments to each expert
  probs_E: jax.Array  # float32: router probabilities summed over tokens
  tokens: jax.Array  # float32 []: tokens counted


# ---------------------------------------------------------------------------------------------
# Layer runs: which stacked weights each layer reads


class Run(NamedTuple):
  """Layers first..end-1, all of one kind ("mlp" or "moe"), whose feed-forward weights are rows
  offset.. of that kind's stack ("layers" itself for a dense model)."""
  kind: str
  first: int
  end: int
  offset: int


def layer_runs(cfg) -> tuple[Run, ...]:
  """Maximal runs of consecutive layers of one kind; a dense model is one "mlp" run."""
  runs, count = [], {"mlp": 0, "moe": 0}
  sparse = set(cfg.sparse_layers)
  for i in range(cfg.n_layers):
    kind = "moe" if i in sparse else "mlp"
    if runs and runs[-1].kind == kind:
      runs[-1] = runs[-1]._replace(end=i + 1)
    else:
      runs.append(Run(kind, i, i + 1, count[kind]))
    count[kind] += 1
  return tuple(runs)


def run_params(params, cfg, run: Run):
  """The stacked weights of one run's layers: attention and norms, then the dense MLP's keys
  (w_gate, w_up, w_down) or the experts under "moe". A whole stack is taken as it is."""
  def rows(tree, a, b):
    n = jax.tree.leaves(tree)[0].shape[0]
    return tree if (a, b) == (0, n) else jax.tree.map(lambda x: x[a:b], tree)

  layers = rows(params["layers"], run.first, run.end)
  if not cfg.n_experts:
    return layers
  ff = rows(params[run.kind], run.offset, run.offset + run.end - run.first)
  return {**layers, **ff} if run.kind == "mlp" else {**layers, "moe": ff}


def layer_params(params, cfg, i: int):
  """Layer i's own weights (unstacked), keyed as in `run_params`."""
  run = next(r for r in layer_runs(cfg) if r.first <= i < r.end)
  return jax.tree.map(lambda a: a[i - run.first], run_params(params, cfg, run))


def active_fraction(path: str, cfg) -> float:
  """The share of a parameter one token uses: k / E of the expert weights, all of the rest."""
  return cfg.experts_per_token / cfg.n_experts if path.startswith("moe/w_") else 1.0


# ---------------------------------------------------------------------------------------------
# Routing


def route(h_ND, router_DE, k: int, norm_topk: bool, replay_Nk=None) -> Route:
  """The experts and weights of each token (replayed experts where replay_Nk[:, 0] >= 0)."""
  logits = jax.lax.dot(h_ND.astype(jnp.float32), router_DE.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  probs = jax.nn.softmax(logits, axis=-1)
  weights, experts = jax.lax.top_k(probs, k)
  if replay_Nk is not None:
    experts = jnp.where(replay_Nk[:, :1] >= 0, replay_Nk, experts).astype(jnp.int32)
    weights = jnp.take_along_axis(probs, experts, axis=-1)
  if norm_topk:
    weights = weights / weights.sum(-1, keepdims=True)
  return Route(experts.astype(jnp.int32), weights, probs)


def stats(routes, E: int, counted=None) -> RouterStats:
  """The router statistics of one layer's streams, over their counted tokens."""
  counts, probs, tokens = jnp.zeros((E,)), jnp.zeros((E,)), jnp.zeros(())
  for r, m in zip(routes, counted or (None,) * len(routes)):
    m = jnp.ones(r.experts.shape[:-1]) if m is None else m.astype(jnp.float32)
    k = r.experts.shape[-1]
    counts = counts.at[r.experts.reshape(-1)].add(jnp.repeat(m.reshape(-1), k))
    probs = probs + (r.probs * m[..., None]).reshape(-1, E).sum(0)
    tokens = tokens + m.sum()
  return RouterStats(counts, probs, tokens)


def aux_loss(s: RouterStats):
  """transformers' load_balancing_loss_func over the stacked layers: E * sum_e of (assignments
  to e per token) x (mean probability of e), both averaged over layers and tokens together."""
  rows = jnp.maximum(s.tokens.sum(), 1.0)
  E = s.counts_E.shape[-1]
  return E * jnp.sum(s.counts_E.sum(0) / rows * (s.probs_E.sum(0) / rows))


# ---------------------------------------------------------------------------------------------
# Grouped matmuls over rows sorted by expert


def _tile_rows(M: int, E: int) -> int:
  """Rows per tile: about the mean rows per expert (a power of two in 8..128), so the padding
  (under one tile per expert) stays below the work itself."""
  return int(min(128, max(8, 1 << max(0, (M // max(E, 1)).bit_length() - 1))))


# Tiles whose gathered expert weights are materialised together (about 64 MB of them).
TILE_WEIGHT_BYTES = 64 << 20


def _tiles(x_MD, w_EDF, sizes_E, dt):
  M, E = x_MD.shape[0], w_EDF.shape[0]
  tm = _tile_rows(M, E)
  n_tiles = -(-M // tm) + min(E, M)  # each non-empty expert adds at most one partial tile
  ends = jnp.cumsum(sizes_E)
  tiles_E = (sizes_E + tm - 1) // tm
  first_tile_E = jnp.cumsum(tiles_E) - tiles_E
  rows = jnp.arange(M, dtype=jnp.int32)
  e_M = jnp.searchsorted(ends, rows, side="right")  # E for rows past the last group
  live = e_M < E
  e_c = jnp.minimum(e_M, E - 1)
  dest_M = jnp.where(live, first_tile_E[e_c] * tm + rows - (ends - sizes_E)[e_c], n_tiles * tm)
  xp = jnp.zeros((n_tiles * tm, x_MD.shape[1]), dt).at[dest_M].set(x_MD.astype(dt), mode="drop")
  tile_e = jnp.minimum(jnp.searchsorted(jnp.cumsum(tiles_E), jnp.arange(n_tiles), side="right"),
                       E - 1)
  w = w_EDF.astype(dt)
  # A batch of tiles at a time: each gathers its expert's weights, and a batch's gathered
  # weights are bounded (all tiles at once would copy the weights about twice over).
  per_tile = math.prod(w_EDF.shape[1:]) * jnp.dtype(dt).itemsize
  batch = max(1, min(n_tiles, TILE_WEIGHT_BYTES // per_tile))
  tile = lambda a: jnp.dot(a[0], w[a[1]], preferred_element_type=jnp.float32)
  yp = jax.lax.map(tile, (xp.reshape(n_tiles, tm, -1), tile_e), batch_size=batch)
  return jnp.where(live[:, None], yp.reshape(n_tiles * tm, -1)[jnp.where(live, dest_M, 0)], 0.0)


def _megablox(x_MD, w_EDF, sizes_E, dt):
  from jax.experimental.pallas.ops.tpu.megablox import gmm

  M = x_MD.shape[0]
  tm = min(128, 8 * -(-M // 8))
  Mp = -(-M // tm) * tm  # the kernel wants whole row tiles
  x = jnp.pad(x_MD.astype(dt), ((0, Mp - M), (0, 0)))
  k, n = w_EDF.shape[1:]
  y = gmm(x, w_EDF.astype(dt), sizes_E.astype(jnp.int32), jnp.float32,
          (tm, min(k, 512), min(n, 512)), interpret=jax.default_backend() != "tpu")
  return y[:M]


def grouped(x_MD, w_EDF, sizes_E, impl: str, dt):
  """Row block g of x (rows sorted by group, sizes_E of each) times w[g], float32; rows past the
  last group are zero."""
  if impl == "tiles":
    return _tiles(x_MD, w_EDF, sizes_E, dt)
  # Rows past the last group come out (and, in the backward pass, go in) undefined: the kernels
  # do not write them. The selects keep that out of both passes.
  live = jnp.arange(x_MD.shape[0]) < sizes_E.sum()
  x_MD = jnp.where(live[:, None], x_MD, 0.0)
  if impl == "megablox":
    y = _megablox(x_MD, w_EDF, sizes_E, dt)
  elif impl == "ragged_dot":
    y = jax.lax.ragged_dot(x_MD.astype(dt), w_EDF.astype(dt), sizes_E.astype(jnp.int32),
                           preferred_element_type=jnp.float32)
  else:
    raise ValueError(f"no grouped matmul {impl!r}")
  return jnp.where(live[:, None], y, 0.0)


def ffn(h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down, impl: str, dtype):
  """sum_j weights[n, j] * SwiGLU expert experts[n, j] of token n, float32 [N, D]; assignments to
  experts outside 0..E-1 (another shard's) add nothing. Products take `dtype` operands."""
  if impl == "dense":
    return _dense_ffn(h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down, dtype)
  return _sorted_ffn(h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down, impl, dtype)


def _dense_ffn(h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down, dtype):
  N, E, dt = h_ND.shape[0], w_gate.shape[0], jnp.dtype(dtype)
  other = (experts_Nk < 0) | (experts_Nk >= E)  # (a negative index would count from the end)
  comb_NE = jnp.zeros((N, E)).at[jnp.arange(N)[:, None], jnp.where(other, E, experts_Nk)].add(
      weights_Nk, mode="drop")
  h = h_ND.astype(dt)
  g, u = (jnp.einsum("nd,edf->nef", h, w.astype(dt), preferred_element_type=jnp.float32)
          for w in (w_gate, w_up))
  y_NED = jnp.einsum("nef,efd->ned", (jax.nn.silu(g) * u).astype(dt), w_down.astype(dt),
                     preferred_element_type=jnp.float32)
  return jnp.einsum("ne,ned->nd", comb_NE, y_NED)


def _sort(experts_Nk, weights_Nk, E: int):
  """The assignments in expert order: (order [M], token of each sorted row, rows per expert,
  each sorted row's weight, 0 for another shard's experts)."""
  flat = experts_Nk.reshape(-1)
  mine = (flat >= 0) & (flat < E)
  key = jnp.where(mine, flat, E)  # other shards' assignments sort last, in no group
  order = jnp.argsort(key, stable=True)
  sizes = jnp.bincount(key, length=E + 1)[:E]
  w_M = jnp.where(mine, weights_Nk.reshape(-1), 0.0)[order]
  return order, order // experts_Nk.shape[1], sizes, w_M


def _unsort(y_MD, order, N: int):
  """Sorted rows back to their assignments, summed over each token's k: [N, D]."""
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
  return y_MD[inverse].reshape(N, -1, y_MD.shape[-1]).sum(1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _sorted_ffn(h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down, impl, dtype):
  return _sorted_ffn_fwd(h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down, impl, dtype)[0]


def _sorted_ffn_fwd(h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down, impl, dtype):
  order, src, sizes, w_M = _sort(experts_Nk, weights_Nk, w_gate.shape[0])
  x = h_ND[src]
  g, u = (grouped(x, w, sizes, impl, dtype) for w in (w_gate, w_up))
  y = grouped(jax.nn.silu(g) * u, w_down, sizes, impl, dtype) * w_M[:, None]
  return _unsort(y, order, h_ND.shape[0]), (h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down,
                                            g, u)


def _sorted_ffn_bwd(impl, dtype, res, dout_ND):
  """Keeps the block's input, routing and weights and the gate / up products (as the dense MLP
  does); the sorted copies of the tokens, silu(gate) * up and the products' operands in the
  compute dtype are rebuilt here. Left to autodiff, each of them, and masks of their size, is
  stacked over the layers of the scan: several times the layer's other activations."""
  h_ND, experts_Nk, weights_Nk, w_gate, w_up, w_down, g, u = res
  N, k = experts_Nk.shape
  order, src, sizes, w_M = _sort(experts_Nk, weights_Nk, w_gate.shape[0])
  mm = lambda x, w: grouped(x, w, sizes, impl, dtype)
  dy = dout_ND[src]
  a = jax.nn.silu(g) * u
  # y = (a @ w_down) * w: one product's transpose gives both the rows' and the weights' cotangent.
  d_aw, d_down = jax.vjp(mm, a * w_M[:, None], w_down)[1](dy)
  dw_M = jnp.sum(a * d_aw, axis=-1)
  sig = jax.nn.sigmoid(g)
  da = d_aw * w_M[:, None]
  dg, du = da * u * sig * (1 + g * (1 - sig)), da * g * sig
  x = h_ND[src]
  dx_g, d_gate = jax.vjp(mm, x, w_gate)[1](dg)
  dx_u, d_up = jax.vjp(mm, x, w_up)[1](du)
  dweights = jnp.zeros((N * k,), dw_M.dtype).at[order].set(dw_M).reshape(N, k)
  mine = (experts_Nk >= 0) & (experts_Nk < w_gate.shape[0])
  return (_unsort(dx_g + dx_u, order, N).astype(h_ND.dtype), None,
          jnp.where(mine, dweights, 0.0).astype(weights_Nk.dtype), d_gate, d_up, d_down)


_sorted_ffn.defvjp(_sorted_ffn_fwd, _sorted_ffn_bwd)


# ---------------------------------------------------------------------------------------------
# Expert parallelism


def _axes(rules: dict, name: str, mesh) -> tuple[str, ...]:
  if name not in rules:
    raise KeyError(f"moe: logical axis {name!r} has no sharding rule; rules cover "
                   f"{sorted(rules)}")
  return tuple(a for a in rules[name] if a in mesh.shape)  # an absent axis has size 1


def _entry(axes):
  return None if not axes else axes[0] if len(axes) == 1 else axes


def _sharded_ffn(h_BTD, e_BTk, w_BTk, p, dtype, dispatch: Dispatch, impl: str):
  mesh, rules = dispatch.mesh, dict(dispatch.rules)
  batch, experts, embed, width = (_axes(rules, n, mesh) for n in ("batch", "experts", "embed",
                                                                   "mlp"))
  if set(width) & set(batch) or set(embed) & set(experts):
    raise ValueError(f"moe: the expert width axes {width} must not split the batch {batch}, nor "
                     f"the embed axes {embed} the experts {experts}")
  gather = tuple(a for a in experts if a in batch)  # tokens to collect from these shards
  spread = tuple(a for a in experts if a not in batch)  # tokens already on every shard here
  n_shards = math.prod(mesh.shape[a] for a in experts)
  E = p["w_gate"].shape[0]
  if E % n_shards:
    raise ValueError(f"moe: {E} experts do not divide over the {n_shards} shards of {experts}")
  El = E // n_shards

  def local(h, e, w, wg, wu, wd):
    if gather:
      h, e, w = (jax.lax.all_gather(a, gather, axis=0, tiled=True) for a in (h, e, w))
    if embed:
      wg, wu = (jax.lax.all_gather(a, embed, axis=1, tiled=True) for a in (wg, wu))
      wd = jax.lax.all_gather(wd, embed, axis=2, tiled=True)
    e0 = jax.lax.axis_index(experts) * El if experts else 0
    b, T, D = h.shape
    y = ffn(h.reshape(b * T, D), (e - e0).reshape(b * T, -1), w.reshape(b * T, -1), wg, wu, wd,
            impl, dtype).reshape(b, T, D)
    if gather:
      y = jax.lax.psum_scatter(y, gather, scatter_dimension=0, tiled=True)
    if spread + width:
      y = jax.lax.psum(y, spread + width)
    return y

  tok = P(_entry(batch), None, None)
  w_in, w_out = (P(_entry(experts), _entry(a), _entry(b)) for a, b in ((embed, width),
                                                                       (width, embed)))
  return jax.shard_map(local, mesh=mesh, in_specs=(tok, tok, tok, w_in, w_in, w_out),
                       out_specs=tok, check_vma=False)(
      h_BTD, e_BTk, w_BTk, p["w_gate"], p["w_up"], p["w_down"])


def block(p, h_BTD, cfg, dispatch: Dispatch | None = None, replay_BTk=None):
  """The MoE feed-forward block of one layer on its normalised input: (output [B, T, D] in h's
  dtype, the `Route` of every token)."""
  B, T, D = h_BTD.shape
  k = cfg.experts_per_token
  rep = None if replay_BTk is None else replay_BTk.reshape(B * T, k)
  r = route(h_BTD.reshape(B * T, D), p["router"], k, cfg.norm_topk_prob, rep)
  r = Route(r.experts.reshape(B, T, k), r.weights.reshape(B, T, k), r.probs.reshape(B, T, -1))
  dispatch = dispatch or Dispatch()
  impl = resolve_impl(dispatch.impl)
  if dispatch.mesh is not None:
    y = _sharded_ffn(h_BTD, r.experts, r.weights, p, cfg.dtype, dispatch, impl)
  else:
    y = ffn(h_BTD.reshape(B * T, D), r.experts.reshape(B * T, k), r.weights.reshape(B * T, k),
            p["w_gate"], p["w_up"], p["w_down"], impl, cfg.dtype).reshape(B, T, D)
  return y.astype(h_BTD.dtype), r


def expected_experts_read(cfg, tokens: int) -> float:
  """Distinct experts a step over `tokens` tokens reads per sparse layer, under uniform routing:
  E (1 - (1 - k/E)^tokens); k for one token."""
  E, k = cfg.n_experts, cfg.experts_per_token
  return float(E * (1.0 - (1.0 - k / E) ** tokens))

