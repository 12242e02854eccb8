"""Mesh construction, rule resolution and sharded == single-device forward on 8 fake devices."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from spade_jax import model, sharding

CFG = model.PRESETS["tiny"]


def test_eight_fake_devices():
  assert len(jax.devices()) == 8


def test_make_mesh_fills_minus_one_and_rejects_bad_sizes():
  assert dict(sharding.make_mesh({"data": -1, "tensor": 2}).shape) == {
      "data": 4, "fsdp": 1, "tensor": 2}
  with pytest.raises(ValueError, match="needs 16 devices"):
    sharding.make_mesh({"data": 4, "fsdp": 2, "tensor": 2})
  with pytest.raises(ValueError, match="unknown mesh axes"):
    sharding.make_mesh({"model": 2})
  assert sharding.make_mesh({"data": 1}).devices.size == 1  # explicit sizes: a subset
  with pytest.raises(ValueError, match="cannot be filled"):
    sharding.make_mesh({"data": -1, "tensor": 3})


def test_sharded_forward_equals_single_device():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  params = sharding.init_sharded(CFG, jax.random.key(1), mesh, sharding.DEFAULT_RULES)
  # Leaves really are split across devices, along the axes the rules say.
  assert params["layers"]["wq"].sharding.spec == P(None, "fsdp", "tensor", None)
  assert params["embed"].sharding.spec == P("tensor", "fsdp")
  assert params["layers"]["w_down"].sharding.spec == P(None, "tensor", "fsdp")
  shard = params["layers"]["wq"].addressable_shards[0].data
  assert shard.shape == (CFG.n_layers, CFG.d_model // 2, CFG.n_heads // 2, CFG.head_dim)

  single = jax.tree.map(lambda a: jax.device_put(a, jax.devices()[0]), params)
  tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (8, 12)).astype(np.int32)
  batch = jax.device_put(tokens, sharding.batch_sharding(mesh, sharding.DEFAULT_RULES))
  fwd = jax.jit(lambda p, x: model.forward(p, x, CFG))
  out_sharded = fwd(params, batch)
  out_single = fwd(single, jnp.asarray(tokens))
  assert len(out_sharded.sharding.device_set) == 8
  np.testing.assert_allclose(np.asarray(out_sharded), np.asarray(out_single), atol=1e-5)


def test_unmatched_logical_axis_is_an_error():
  mesh = sharding.make_mesh({"data": -1})
  rules = {k: v for k, v in sharding.DEFAULT_RULES.items() if k != "mlp"}
  with pytest.raises(KeyError, match="'mlp' has no sharding rule"):
    sharding.param_shardings(CFG, mesh, rules)


def test_indivisible_dim_is_an_error_not_replication():
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 8})
  with pytest.raises(ValueError, match="not divisible"):
    sharding.param_shardings(CFG, mesh, sharding.DEFAULT_RULES)  # 2 kv heads over 8


def test_mesh_axis_used_twice_is_an_error():
  mesh = sharding.make_mesh({"data": -1})
  rules = dict(sharding.DEFAULT_RULES, mlp=("fsdp",))
  with pytest.raises(ValueError, match="used by two dims"):
    sharding.param_shardings(CFG, mesh, rules)


def test_qwen3_8b_size_without_allocation():
  cfg = model.PRESETS["qwen3_8b"]
  abstract = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))
  n = model.count_params(abstract)
  assert abs(n - 8.19e9) / 8.19e9 < 0.005, n
  # Shardings for a real pod layout resolve from shapes alone.
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  shardings = sharding.param_shardings(cfg, mesh, sharding.DEFAULT_RULES)
  assert shardings["lm_head"].spec == P("fsdp", "tensor")
