"""Memory planner: what a training run holds on each device, from shapes alone.

  python -m spade_jax.plan --model SPEC|random:PRESET [--config=configs/spade.py:PRESET]
      [--config.KEY=VALUE ...] [--devices N] [--device_memory_gb G] [--json]

For the configured mesh (its -1 filled from --devices) and sharding rules it reports total and
active parameters (active: k / E of the expert weights) and the bytes per device of the float32
master parameters, AdamW's two moments, the gradients (twice over while micro-batches
accumulate), the activations one micro-batch keeps for its backward pass with and without
`optim.remat` (measured: autodiff's residuals of the learner's loss, traced with jax.eval_shape at
one device's rows; nothing runs and nothing is allocated), the log-prob chunk's logits, and the
sampler's KV cache and compute-dtype weights at the configured batch and context. The learner and
the sampler take turns, so the peak is the resident state plus the larger of the two. With
--device_memory_gb it says whether the peak fits (less `--headroom` for XLA's own buffers) and
searches the meshes and micro-batches that do, best first: the largest micro-batch, then the
largest expert axis (a decode step then reads its experts where they live instead of gathering
them over FSDP every step), then the least tensor parallelism, then the lowest peak. When
nothing fits, `limited_by` names the largest term.

The config defaults to configs/spade.py's preset named like a random:PRESET model (e.g.
qwen3_30b_a3b), else its `local` preset. A mixture-of-experts block with expert parallelism
gathers the tokens of the expert shards that split the batch (`moe`), so its buffers hold that
many times one device's tokens: the planner scales the expert block's residuals accordingly.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax import cli
from spade_jax import config as config_lib
from spade_jax import kv_cache, loading, moe, sharding
from spade_jax import learner as learner_lib
from spade_jax import model as model_lib

GB = 1e9


def param_counts(cfg: model_lib.ModelConfig) -> tuple[int, int]:
  """(total, active) parameters; active counts k / E of the expert weights."""
  table = model_lib.param_table(cfg)
  total = sum(math.prod(s.shape) for s in table.values())
  active = sum(math.prod(s.shape) * moe.active_fraction(p, cfg) for p, s in table.items())
  return total, int(round(active))


def saved_bytes(f, *args) -> int:
  """Bytes autodiff keeps from f's forward pass for its backward pass (its residuals, the inputs
  themselves not counted), from a jax.eval_shape trace: nothing runs."""
  out = []

  def probe(*args):
    _, pull = jax.vjp(f, *args)
    inputs = {id(x) for x in jax.tree.leaves(args)}
    seen = {id(r): r for r in jax.tree.leaves(pull) if id(r) not in inputs}
    out.append(sum(math.prod(r.shape) * jnp.dtype(r.dtype).itemsize for r in seen.values()))
    return jnp.zeros(())

  jax.eval_shape(probe, *args)
  return out[0]


def _batch(rows: int, T: int) -> dict:
  """A learner batch of `rows` rows of T tokens, every position scored (the most logits)."""
  mask = np.ones((rows, T), np.float32)
  mask[:, 0] = 0
  return {"tokens_BT": np.zeros((rows, T), np.int32), "loss_mask_BT": mask,
          "advantages_B": np.ones(rows, np.float32), "temperature_B": np.ones(rows, np.float32),
          "logp_behaviour_BT": np.zeros((rows, T), np.float32),
          "score_index_BM": np.broadcast_to(np.arange(T, dtype=np.int32), (rows, T))}


def activation_bytes(cfg: model_lib.ModelConfig, T: int, remat: bool, chunk: int) -> dict:
  """Residuals of one row of T tokens through the learner's loss (linear in the rows), and of one
  sparse layer's expert block for that row's tokens."""
  lcfg = learner_lib.LearnerConfig(remat=remat, chunk=chunk, entropy=False)
  abstract = jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.key(0)))
  batch = _batch(1, T)
  dispatch = moe.Dispatch("ragged_dot")  # the accelerators' grouped matmul
  loss = lambda p: learner_lib.loss_fn(p, batch, jnp.float32(1), cfg, lcfg, dispatch)[0]
  out = {"row": saved_bytes(loss, abstract), "expert_block": 0}
  if cfg.n_experts:
    E, D, F, k = cfg.n_experts, cfg.d_model, cfg.d_ff_expert, cfg.experts_per_token
    w = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((E, D, F), (E, D, F), (E, F, D))]
    h = jax.ShapeDtypeStruct((T, D), jnp.float32)
    e = jnp.zeros((T, k), jnp.int32)
    ffn = lambda h, *w: moe.ffn(h, e, jnp.ones((T, k)), *w, "ragged_dot", cfg.dtype)
    out["expert_block"] = saved_bytes(ffn, h, *w)
  return out


def _mesh_sizes(shape: dict, devices: int) -> dict:
  sizes = {a: int(shape.get(a, 1)) for a in sharding.mesh_axes(shape)}
  known = math.prod(v for v in sizes.values() if v != -1)
  if -1 in sizes.values():
    if devices % known:
      raise ValueError(f"mesh {shape} cannot be filled from {devices} devices")
    sizes[next(a for a, v in sizes.items() if v == -1)] = devices // known
  if math.prod(sizes.values()) != devices:
    raise ValueError(f"mesh {sizes} needs {math.prod(sizes.values())} devices, not {devices}")
  return sizes


def _shard_elems(shape, axes, rules, mesh, what) -> int:
  spec = sharding.spec_for(axes, rules, shape, mesh, what)  # divisibility errors propagate
  split = [math.prod(mesh.shape[a] for a in ((p,) if isinstance(p, str) else p or ()))
           for p in spec]
  return math.prod(n // s for n, s in zip(shape, list(split) + [1] * (len(shape) - len(split))))


@dataclasses.dataclass(frozen=True)
class Setting:
  """What a plan depends on besides the model."""
  mesh: dict
  rules: dict
  global_batch: int
  micro_batch: int  # 0 = the whole batch
  remat: bool
  context: int
  sampler_batch: int
  chunk: int = 256


def plan(cfg: model_lib.ModelConfig, s: Setting, act: dict | None = None) -> dict:
  """Per-device bytes of everything (see the module docstring); `act` caches
  `activation_bytes` of both remat settings."""
  mesh = types.SimpleNamespace(shape=s.mesh)  # spec_for reads only the axis sizes
  table = model_lib.param_table(cfg)
  p_elems = sum(_shard_elems(t.shape, t.axes, s.rules, mesh, path) for path, t in table.items())
  shards = sharding.batch_shards(mesh, s.rules)
  micro = s.micro_batch or s.global_batch
  if s.global_batch % micro or micro % shards:
    raise ValueError(f"micro-batch {micro} must divide the batch {s.global_batch} and split "
                     f"over the {shards} batch shards")
  rows = micro // shards
  act = act or {r: activation_bytes(cfg, s.context, r, s.chunk) for r in (False, True)}
  gather = math.prod(s.mesh[a] for a in s.rules.get("experts", ())
                     if a in s.mesh and a in s.rules["batch"])
  Ls, L = len(cfg.sparse_layers), cfg.n_layers

  def activations(remat):  # remat also keeps one layer's full residuals while it recomputes it
    a = act[remat]["row"] + (act[False]["row"] / L if remat else 0)
    a += (gather - 1) * act[False]["expert_block"] * (1 if remat else Ls)
    return int(rows * a)

  itemsize = jnp.dtype(cfg.dtype).itemsize
  kv_split = math.prod(s.mesh.get(a, 1) for a in s.rules["kv_heads"])
  capacity = kv_cache.bucket(s.context)
  kv = (2 * L * -(-s.sampler_batch // shards) * capacity * cfg.n_kv_heads // kv_split
        * cfg.head_dim * itemsize)
  out = {
      "params_bytes": 4 * p_elems, "optimizer_bytes": 8 * p_elems,
      "grads_bytes": 4 * p_elems * (2 if micro < s.global_batch else 1),
      "activations_bytes": activations(False), "activations_remat_bytes": activations(True),
      "logits_chunk_bytes": 2 * 4 * rows * min(s.chunk, s.context) * cfg.vocab_size,
      "sampler_kv_cache_bytes": kv, "sampler_weights_bytes": itemsize * p_elems,
  }
  learner = (out["grads_bytes"] + out["logits_chunk_bytes"] +
             out["activations_remat_bytes" if s.remat else "activations_bytes"])
  sampler = out["sampler_kv_cache_bytes"] + out["sampler_weights_bytes"]
  out["peak_bytes"] = out["params_bytes"] + out["optimizer_bytes"] + max(learner, sampler)
  out.update(rows_per_device=rows, batch_shards=shards, micro_batch=micro)
  return out


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def search(cfg, s: Setting, devices: int, limit: float, act: dict) -> list[dict]:
  """Every mesh over `devices` (the rules as configured) and micro-batch whose peak fits
  `limit` bytes, best first."""
  found = []
  axes = sharding.mesh_axes(s.mesh) if cfg.n_experts == 0 else sharding.MESH_AXES
  for sizes in itertools.product(_divisors(devices), repeat=len(axes)):
    if math.prod(sizes) != devices:
      continue
    mesh = dict(zip(axes, sizes))
    for micro in _divisors(s.global_batch):
      try:
        p = plan(cfg, dataclasses.replace(s, mesh=mesh, micro_batch=micro), act)
      except ValueError:
        continue
      if p["peak_bytes"] <= limit:
        found.append(dict(mesh=mesh, micro_batch=micro, peak_gb=round(p["peak_bytes"] / GB, 2),
                          rows_per_device=p["rows_per_device"]))
  return sorted(found, key=lambda f: (-f["micro_batch"], -f["mesh"].get("expert", 1),
                                      f["mesh"].get("tensor", 1), f["peak_gb"]))


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m spade_jax.plan", description=__doc__,
                              epilog=cli.ALIAS_NOTE, allow_abbrev=False,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  config_lib.add_help(p, "configs/spade.py:<the model's preset, or local>", "FILE[:PRESET]")
  p.add_argument("--model", required=True, metavar="SPEC",
                 help="a model SPEC (HF directory, .gguf, checkpoint) or random:PRESET")
  p.add_argument("--devices", type=int, metavar="N",
                 help="devices the mesh covers (default: the mesh's own size, else this host's)")
  p.add_argument("--device_memory_gb", type=float, metavar="G",
                 help="memory of one device in GB (1e9 bytes): 95 for v5p, 141 for H200")
  p.add_argument("--headroom", type=float, default=0.1, metavar="F",
                 help="fraction of G left for XLA's own buffers (default: %(default)s)")
  p.add_argument("--context", type=int, metavar="T",
                 help="tokens per training row and sampler context (default: agent_context)")
  p.add_argument("--sampler_batch", type=int, metavar="B",
                 help="rows the sampler holds at once (default: global_batch)")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  return p


def main(argv=None) -> None:
  argv = cli.underscored(sys.argv[1:] if argv is None else argv)
  spec, assignments, rest = config_lib.split_argv(argv, "")
  a = parser().parse_args(rest)
  if not spec:
    preset = a.model.split(":", 1)[1] if a.model.startswith("random:") else ""
    presets = config_lib.load_module(config_lib.shipped("spade.py")).PRESETS
    spec = f"{config_lib.shipped('spade.py')}:{preset if preset in presets else 'local'}"
  c = config_lib.build(spec, assignments)
  cfg = loading.read_config(a.model, c.dtype)
  shape = c.mesh.to_dict()
  devices = a.devices or (math.prod(shape.values()) if -1 not in shape.values()
                          else jax.device_count())
  s = Setting(_mesh_sizes(shape, devices), {k: tuple(v) for k, v in c.rules.to_dict().items()},
              c.global_batch, c.optim.micro_batch, c.optim.remat, a.context or c.agent_context,
              a.sampler_batch or c.global_batch)
  act = {r: activation_bytes(cfg, s.context, r, s.chunk) for r in (False, True)}
  total, active = param_counts(cfg)
  out = dict(model=a.model, config=spec, devices=devices, mesh=s.mesh, dtype=cfg.dtype,
             total_params=total, active_params=active, context=s.context,
             global_batch=s.global_batch, remat=s.remat, sampler_batch=s.sampler_batch)
  try:
    out.update(plan(cfg, s, act))
  except ValueError as e:
    out["error"] = str(e)
  if a.device_memory_gb:
    limit = a.device_memory_gb * GB * (1 - a.headroom)
    out["device_memory_gb"] = a.device_memory_gb
    out["fits"] = "peak_bytes" in out and out["peak_bytes"] <= limit
    out["fitting"] = search(cfg, s, devices, limit, act)[:5]
    if not out["fitting"] and "peak_bytes" in out:
      terms = {k: v for k, v in out.items() if k.endswith("_bytes") and k != "peak_bytes"
               and (k != "activations_bytes" or not s.remat)
               and (k != "activations_remat_bytes" or s.remat)}
      out["limited_by"] = max(terms, key=terms.get)
  if a.json:
    print(json.dumps(out))
    return
  for k, v in out.items():
    shown = f"{v / GB:.2f} GB" if k.endswith("_bytes") else f"{v / 1e9:.3f} B" if k.endswith(
        "_params") else v
    print(f"{k:24s} {shown}")


if __name__ == "__main__":
  main()
