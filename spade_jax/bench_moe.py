"""MoE block benchmark: `python -m spade_jax.bench moe --tokens 512 --experts 128 --k 8 ...`.

Times one mixture-of-experts block forward and backward (routing, the experts, gradients of the
input, the routing weights and every expert weight) through each grouped matmul of
`--impls` and the dense reference (every expert on every token) at the same shapes, in one run,
alternating one step of each so that machine load hits all alike. Prints one JSON line: the
median step time of each, and `speedup_vs_dense` (the dense reference's median over each one's).
The defaults are one Qwen3-30B-A3B layer's expert shapes (128 experts of width 768, top 8, model
dim 2048).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from spade_jax import cli, moe


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m spade_jax.bench moe", description=__doc__,
                              epilog=cli.ALIAS_NOTE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tokens", type=int, default=256, help="tokens in the block (default: 256)")
  p.add_argument("--experts", type=int, default=128, help="E (default: 128)")
  p.add_argument("--k", type=int, default=8, help="experts per token (default: 8)")
  p.add_argument("--d_model", type=int, default=2048, help="D (default: 2048)")
  p.add_argument("--d_ff", type=int, default=768, help="expert width F (default: 768)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="the products' operand dtype (default: %(default)s)")
  p.add_argument("--impls", default="ragged_dot,tiles",
                 help="comma-separated grouped matmuls to time against dense")
  p.add_argument("--steps", type=int, default=3, help="timed steps of each (after a compile step)")
  return p


def main(argv=None) -> None:
  a = parser().parse_args(cli.underscored(sys.argv[1:] if argv is None else argv))
  impls = [i for i in a.impls.split(",") if i] + ["dense"]
  bad = [i for i in impls if i not in moe.IMPLS or i == "auto"]
  if bad:
    raise SystemExit(f"unknown --impls {bad}; choose from {moe.IMPLS[1:]}")
  N, E, k, D, F = a.tokens, a.experts, a.k, a.d_model, a.d_ff
  keys = jax.random.split(jax.random.key(0), 6)
  h = jax.random.normal(keys[0], (N, D))
  router = jax.random.normal(keys[1], (D, E)) * D ** -0.5
  w = [jax.random.normal(kk, s) * s[1] ** -0.5 for kk, s in zip(keys[2:5], ((E, D, F), (E, D, F),
                                                                          (E, F, D)))]
  dy = jax.random.normal(keys[5], (N, D))

  def step(impl):
    def loss(h, router, *w):
      r = moe.route(h, router, k, True)
      return jnp.sum(moe.ffn(h, r.experts, r.weights, *w, impl, a.dtype) * dy)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))

  steps = {i: step(i) for i in impls}
  values = {i: float(jax.block_until_ready(f(h, router, *w))[0]) for i, f in steps.items()}
  times = {i: [] for i in impls}
  for _ in range(a.steps):
    for i, f in steps.items():
      t = time.perf_counter()
      jax.block_until_ready(f(h, router, *w))
      times[i].append(time.perf_counter() - t)
  med = {i: statistics.median(t) for i, t in times.items()}
  out = dict(bench="moe", tokens=N, experts=E, k=k, d_model=D, d_ff=F, dtype=a.dtype,
             device=jax.devices()[0].device_kind, steps=a.steps,
             step_ms={i: round(1000 * t, 2) for i, t in med.items()},
             speedup_vs_dense={i: round(med["dense"] / t, 2) for i, t in med.items()
                               if i != "dense"},
             max_rel_diff_vs_dense=float(max(abs(v - values["dense"]) / abs(values["dense"])
                                             for v in values.values())))
  print(json.dumps(out))
