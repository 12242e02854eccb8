"""Checkpoints: resume in a fresh process == uninterrupted, host state, keep-last-N, restore onto
another mesh, a checkpoint as a model SPEC."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from spade_jax import checkpoint, loading, sharding
from spade_jax import learner as learner_lib
from spade_jax import model as model_lib

CFG = model_lib.PRESETS["tiny"]
LCFG = learner_lib.LearnerConfig(lr=1e-3)
B, T = 4, 10


def batch_for(step: int):
  """The batch of rollout step `step`: a pure function of the step, as a resumed loop needs."""
  rng = np.random.default_rng(1000 + step)
  mask = (rng.random((B, T)) > 0.3).astype(np.float32)
  mask[:, 0], mask[:, 1] = 0.0, 1.0
  return {
      "tokens_BT": rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32),
      "loss_mask_BT": mask,
      "advantages_B": rng.normal(size=B).astype(np.float32),
      "logp_behaviour_BT": (-5.5 + 0.1 * rng.normal(size=(B, T))).astype(np.float32),
      "temperature_B": np.full(B, 0.8, np.float32),
  }


def new_learner(mesh=None):
  mesh = mesh or sharding.make_mesh({"data": 1}, jax.devices()[:1])
  return learner_lib.make_learner(CFG, LCFG, mesh)


@pytest.fixture(scope="module")
def lrn():
  return new_learner()


def fresh_state(lrn):
  return lrn.init_state(sharding.init_sharded(CFG, jax.random.key(0), lrn.mesh,
                                              sharding.DEFAULT_RULES))


def train(lrn, state, start: int, n: int):
  for i in range(start, start + n):
    state, _ = lrn.train_step(state, batch_for(i))
  return state


def host(tree):
  return jax.tree.map(np.asarray, tree)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, lrn):
  """3 steps, a checkpoint (with host state), then 2 more steps in the same process."""
  root = str(tmp_path_factory.mktemp("ckpt"))
  state = lrn.init_state(fresh_state(lrn).params, seed=7)
  state = train(lrn, state, 0, 3)
  mgr = checkpoint.manager(root, keep=2)
  host_state = {"next_step": 3, "pool": [{"code": "class AEnv: ...", "win_rate": 0.5}]}
  checkpoint.save(mgr, state, CFG, host_state)
  saved = host(state)  # save returned, so the step may donate the state now
  state = train(lrn, state, 3, 2)
  checkpoint.wait(mgr)
  return root, saved, host(state), host_state


def test_resume_in_fresh_process_equals_uninterrupted(trained, tmp_path):
  root, _, final, _ = trained
  out = str(tmp_path / "resumed.npz")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.getcwd())
  env["XLA_FLAGS"] = ""  # one device, as in the run that saved
  subprocess.run([sys.executable, __file__, root, "2", out], check=True, env=env, timeout=300)
  resumed = dict(np.load(out))
  assert int(resumed.pop("step")) == int(final.step) == 5
  flat = model_lib.flatten(final.params)
  assert set(resumed) == set(flat)
  for k in flat:
    np.testing.assert_allclose(resumed[k], flat[k], atol=1e-6, rtol=0, err_msg=k)


def test_restore_state_and_host_state_onto_another_mesh(trained):
  root, saved, _, host_state = trained
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  lrn = new_learner(mesh)
  state, got_host = checkpoint.restore(checkpoint.manager(root), lrn)
  assert got_host == host_state
  assert int(state.step) == 3
  np.testing.assert_array_equal(state.rng, saved.rng)
  assert state.params["embed"].sharding == lrn.state_shardings.params["embed"]
  assert len(state.params["embed"].sharding.device_set) == 8
  for a, b in zip(jax.tree.leaves(host(state)), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(a, b)


def test_keep_last_n_and_latest(tmp_path, lrn):
  state = fresh_state(lrn)
  mgr = checkpoint.manager(str(tmp_path), keep=2)
  for step in (10, 20, 30):
    checkpoint.save(mgr, state, CFG, {"s": step}, step=step)
  checkpoint.wait(mgr)
  assert mgr.all_steps() == [20, 30]
  assert sorted(d for d in os.listdir(tmp_path) if d.isdigit()) == ["20", "30"]
  _, h = checkpoint.restore(mgr, lrn, step=20)
  assert h == {"s": 20}
  with pytest.raises(checkpoint.CheckpointError, match="no checkpoint"):
    checkpoint.restore(checkpoint.manager(str(tmp_path / "empty")), lrn)


def test_checkpoint_is_a_model_spec(trained):
  root, saved, _, _ = trained
  for spec in (root, os.path.join(root, "3")):
    loaded = loading.load_model(spec)
    assert loaded.cfg == CFG and loaded.tokenizer is None
    for a, b in zip(jax.tree.leaves(host(loaded.params)), jax.tree.leaves(saved.params)):
      np.testing.assert_array_equal(a, b)
  meta = json.load(open(os.path.join(root, "3", "meta", "metadata")))
  assert meta["model_config"]["d_model"] == CFG.d_model


def test_checkpoint_spec_brings_its_tokenizer(tmp_path, lrn):
  mgr = checkpoint.manager(str(tmp_path))
  checkpoint.save(mgr, fresh_state(lrn), CFG, tokenizer="smollm2-135m")
  checkpoint.wait(mgr)
  loaded = loading.load_model(str(tmp_path), dtype="bfloat16")
  assert loaded.cfg.dtype == "bfloat16"
  assert loaded.tokenizer is not None and loaded.tokenizer.eos_token_id is not None
  assert loaded.tokenizer_ref == "smollm2-135m"  # what a run continued from it stores again


def test_model_mismatch_is_an_error(trained):
  root, _, _, _ = trained
  other = learner_lib.make_learner(CFG.replace(d_ff=64), LCFG,
                                   sharding.make_mesh({"data": 1}, jax.devices()[:1]))
  with pytest.raises(checkpoint.CheckpointError, match="does not match"):
    checkpoint.restore(checkpoint.manager(root), other)


if __name__ == "__main__":  # the fresh process of the resume test: restore, train, dump params
  root, n_more, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
  lrn = new_learner()
  state, host_state = checkpoint.restore(checkpoint.manager(root), lrn)
  state = train(lrn, state, host_state["next_step"], n_more)
  np.savez(out, step=np.asarray(state.step), **model_lib.flatten(host(state.params)))
