"""The memory planner: Qwen3-30B-A3B's parameter counts from the CLI, per-device bytes equal to
the shards a real mesh holds, residual counting, and the search for a mesh that fits."""

import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax import kv_cache, plan, sharding
from spade_jax import model as model_lib

CFG = model_lib.PRESETS["tiny_moe"]
EP_RULES = dict(sharding.DEFAULT_RULES, batch=("data", "fsdp", "expert"))


def test_cli_counts_qwen3_30b_a3b():
  r = subprocess.run([sys.executable, "-m", "spade_jax.plan", "--model", "random:qwen3_30b_a3b",
                      "--json"], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  assert abs(out["total_params"] / 30.53e9 - 1) < 0.01, out["total_params"]
  assert abs(out["active_params"] / 3.35e9 - 1) < 0.03, out["active_params"]
  assert out["config"].endswith("spade.py:qwen3_30b_a3b")  # the model's own preset
  # float32 params over the mesh's devices (8 fake ones here): split, but not all ways.
  assert 4 * out["total_params"] / out["devices"] <= out["params_bytes"] < 4 * out["total_params"]


def test_saved_bytes_counts_residuals_not_inputs():
  x = jnp.zeros((8, 16))
  assert plan.saved_bytes(lambda x: jnp.sum(jnp.sin(x)), x) == x.nbytes  # cos(x) is kept
  assert plan.saved_bytes(lambda x, w: jnp.sum(x @ w), x, jnp.zeros((16, 4))) == 0
  sparse = CFG.replace(mlp_only_layers=())  # one run: no per-run slices of the weights
  lean, full = (plan.activation_bytes(sparse, 64, remat, 32)["row"] for remat in (True, False))
  assert 0 < lean < full / 3


def test_per_device_bytes_are_the_shards_a_mesh_holds():
  mesh_shape = {"data": 1, "fsdp": 2, "expert": 2, "tensor": 2}
  mesh = sharding.make_mesh(mesh_shape)
  s = plan.Setting(mesh_shape, EP_RULES, global_batch=8, micro_batch=4, remat=True, context=48,
                   sampler_batch=8)
  p = plan.plan(CFG, s)
  params = sharding.init_sharded(CFG, jax.random.key(0), mesh, EP_RULES)
  shard_bytes = sum(a.addressable_shards[0].data.nbytes for a in jax.tree.leaves(params))
  assert p["params_bytes"] == shard_bytes and p["optimizer_bytes"] == 2 * shard_bytes
  assert p["grads_bytes"] == 2 * shard_bytes  # micro-batches: the sum and the next gradient
  kv = kv_cache.shardings(CFG, mesh, EP_RULES, 8, kv_cache.bucket(48)).k[0]
  local = kv.shard_shape((8, CFG.n_kv_heads, kv_cache.bucket(48), CFG.head_dim))
  assert p["sampler_kv_cache_bytes"] == CFG.n_layers * 2 * 4 * math.prod(local)
  assert p["rows_per_device"] == 1 and p["activations_remat_bytes"] < p["activations_bytes"]


def test_search_lists_only_meshes_that_fit_best_first():
  s = plan.Setting({"data": 8, "fsdp": 1, "expert": 1, "tensor": 1}, EP_RULES, global_batch=16,
                   micro_batch=0, remat=True, context=64, sampler_batch=16)
  act = {r: plan.activation_bytes(CFG, 64, r, 32) for r in (False, True)}
  whole = plan.plan(CFG, s, act)["peak_bytes"]
  found = plan.search(CFG, s, 8, whole * 0.8, act)
  assert found and all(f["peak_gb"] * 1e9 <= whole * 0.8 * 1.001 for f in found)
  assert [f["micro_batch"] for f in found] == sorted((f["micro_batch"] for f in found),
                                                     reverse=True)
  assert all(math.prod(f["mesh"].values()) == 8 for f in found)
  assert plan.search(CFG, s, 8, 1.0, act) == []
  np.testing.assert_equal(plan.param_counts(CFG)[0], model_lib.count_params(
      jax.eval_shape(lambda: model_lib.init_params(CFG, jax.random.key(0)))))
