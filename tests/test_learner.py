"""The learner's invariants: chunked scoring = full logits, on-policy ratio/IS = 1, micro-batched
= full batch, (2, 2, 2) mesh = one device, bad input -> clear error or a tested skip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import learner as learner_lib
from spade_jax import logprobs, sharding
from spade_jax import model as model_lib

CFG = model_lib.PRESETS["tiny"]
B, T = 8, 12


def one_device_mesh():
  return sharding.make_mesh({"data": 1}, jax.devices()[:1])


def make_batch(seed=0, b=B, t=T):
  rng = np.random.default_rng(seed)
  mask = (rng.random((b, t)) > 0.3).astype(np.float32)
  mask[:, 0] = 0.0
  mask[:, 1] = 1.0
  return {
      "tokens_BT": rng.integers(0, CFG.vocab_size, (b, t)).astype(np.int32),
      "loss_mask_BT": mask,
      "advantages_B": rng.normal(size=b).astype(np.float32),
      "logp_behaviour_BT": (-5.5 + 0.3 * rng.normal(size=(b, t))).astype(np.float32),
      "temperature_B": rng.choice([0.6, 1.0], size=b).astype(np.float32),
  }


# Compiling a train step takes seconds on CPU, so learners (each holding its jitted step) are
# built once per configuration and shared; every test starts from a fresh state.
_LEARNERS = {}
_PARAMS = {}


def fresh(mesh, cfg, seed=0):
  key = (tuple(d.id for d in mesh.devices.flat), mesh.devices.shape, cfg)
  if key not in _LEARNERS:
    _LEARNERS[key] = learner_lib.make_learner(CFG, cfg, mesh)
  lrn = _LEARNERS[key]
  if (key[:2], seed) not in _PARAMS:
    _PARAMS[key[:2], seed] = sharding.init_sharded(CFG, jax.random.key(seed), mesh,
                                                   sharding.DEFAULT_RULES)
  # A copy: train_step donates the state it is given.
  return lrn, lrn.init_state(jax.tree.map(jnp.copy, _PARAMS[key[:2], seed]))


FULL = learner_lib.LearnerConfig()
MICRO = learner_lib.LearnerConfig(micro_batch=4)


def assert_same_step(s_a, s_b, param_atol):
  """Params within `param_atol`; Adam's first moment (0.1 x the clipped gradient) equal up to
  float32 summation order, which checks the gradients themselves, not just the tiny lr-1e-6 step."""
  for a, b in zip(jax.tree.leaves(host(s_a.params)), jax.tree.leaves(host(s_b.params))):
    np.testing.assert_allclose(a, b, atol=param_atol, rtol=0)
  mu_a, mu_b = host(s_a.opt_state[1][0].mu), host(s_b.opt_state[1][0].mu)
  scale = max(np.abs(x).max() for x in jax.tree.leaves(mu_a))
  assert scale > 0
  for a, b in zip(jax.tree.leaves(mu_a), jax.tree.leaves(mu_b)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)


def host(tree):
  return jax.tree.map(np.asarray, tree)


def test_chunked_scoring_matches_full_logits():
  params = model_lib.init_params(CFG, jax.random.key(1))
  batch = {k: jnp.asarray(v) for k, v in make_batch().items()}
  # 12 positions = chunks of 5 + 5 + 2 (padded).
  lp, ent, logits = jax.jit(lambda p, b: (
      *learner_lib.score(p, b, CFG, chunk=5, entropy=True),
      model_lib.forward(p, b["tokens_BT"], CFG)))(params, batch)
  want = logprobs.token_logprobs(logits[:, :-1], batch["tokens_BT"][:, 1:], batch["temperature_B"])
  np.testing.assert_allclose(lp[:, 1:], want, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(lp[:, 0]) == 0.0)
  t = batch["temperature_B"][:, None, None]
  p = jax.nn.softmax(logits[:, :-1] / t)
  want_ent = -jnp.sum(p * jnp.log(p), -1)
  np.testing.assert_allclose(ent[:, 1:], want_ent, rtol=1e-4)


@pytest.mark.parametrize("chunk", [5, 256])
def test_scoring_gradients_match_autodiff_of_full_logits(chunk):
  """The output projection's hand-written backward (logits recomputed from the hidden states),
  over several padded chunks and over one, against autodiff of the full logits."""
  params = model_lib.init_params(CFG, jax.random.key(1))
  batch = {k: jnp.asarray(v) for k, v in make_batch().items()}
  tokens, temp = batch["tokens_BT"], batch["temperature_B"]
  w = jnp.asarray(np.random.default_rng(3).normal(size=(B, T - 1)), jnp.float32)
  ours = lambda p: jnp.sum(learner_lib.score(p, batch, CFG, chunk)[0][:, 1:] * w)
  ref = lambda p: jnp.sum(logprobs.token_logprobs(
      model_lib.forward(p, tokens, CFG)[:, :-1], tokens[:, 1:], temp) * w)
  g, g_ref = (jax.jit(jax.grad(f))(params) for f in (ours, ref))
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):  # up to float32 summation order
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


def test_on_policy_ratio_and_is_weight_are_one():
  mesh = one_device_mesh()
  lrn, state = fresh(mesh, FULL)
  batch = make_batch()
  lp, _ = jax.jit(lambda p, b: learner_lib.score(p, b, CFG, 256))(state.params, batch)
  batch["logp_behaviour_BT"] = np.asarray(lp) * batch["loss_mask_BT"]
  _, m = lrn.train_step(state, batch)
  assert float(m["ratio_mean"]) == 1.0
  np.testing.assert_allclose(m["is_weight_mean"], 1.0, atol=1e-6)
  np.testing.assert_allclose(m["is_weight_max"], 1.0, atol=1e-6)
  assert float(m["abs_logp_diff_mean"]) < 1e-5
  assert float(m["clip_frac_low"]) == 0.0 and float(m["clip_frac_high"]) == 0.0
  assert float(m["skipped"]) == 0.0


def test_one_step_changes_params_and_counts():
  lrn, state = fresh(one_device_mesh(), FULL)
  before = host(state.params)
  state, m = lrn.train_step(state, make_batch())
  assert int(state.step) == 1
  assert np.isfinite(float(m["loss"])) and float(m["grad_norm"]) > 0
  delta = max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(before),
                                                  jax.tree.leaves(host(state.params))))
  assert 5e-7 < delta < 1e-5
  for k in ("clip_frac_low", "clip_frac_high", "is_weight_mean", "is_weight_max",
            "abs_logp_diff_mean", "nonzero_adv_frac", "entropy_mean", "lr", "tokens"):
    assert np.isfinite(float(m[k])), k


def test_micro_batched_equals_full_batch():
  mesh = one_device_mesh()
  batch = make_batch(3)
  lrn, s_full = fresh(mesh, FULL)
  s_full, m_full = lrn.train_step(s_full, batch)
  lrn, s_micro = fresh(mesh, MICRO)
  s_micro, m_micro = lrn.train_step(s_micro, batch)
  assert_same_step(s_full, s_micro, 1e-6)
  for k in m_full:
    np.testing.assert_allclose(m_micro[k], m_full[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_mesh_222_step_equals_single_device():
  batch = make_batch(5)
  lrn1, s1 = fresh(one_device_mesh(), MICRO)
  s1, m1 = lrn1.train_step(s1, batch)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  lrn8, s8 = fresh(mesh, MICRO)
  s8, m8 = lrn8.train_step(s8, batch)
  # Really sharded: the embedding is split over fsdp x tensor, Adam's moments follow it.
  emb = s8.params["embed"]
  assert len(emb.sharding.device_set) == 8
  assert emb.addressable_shards[0].data.shape == (CFG.vocab_size // 2, CFG.d_model // 2)
  mu = s8.opt_state[1][0].mu["embed"]
  assert mu.sharding == emb.sharding
  assert_same_step(s1, s8, 1e-5)
  np.testing.assert_allclose(m1["loss"], m8["loss"], rtol=1e-5)


def test_minibatches_with_kl():
  # One configuration for both (each compile costs seconds): 2 optimizer steps on one batch with
  # logp_old computed once up front, and a k3 KL to a reference policy.
  lrn, state = fresh(one_device_mesh(), learner_lib.LearnerConfig(
      lr=1e-3, minibatches=2, micro_batch=2, kl_beta=0.1))
  batch = make_batch(6)
  with pytest.raises(ValueError, match="logp_ref_BT"):
    lrn.train_step(state, batch)
  batch["logp_ref_BT"] = batch["logp_behaviour_BT"]
  state, m = lrn.train_step(state, batch)
  assert int(state.step) == 2  # two optimizer updates from one batch
  # The second minibatch sees a moved policy, so the mean ratio is no longer exactly 1.
  assert float(m["ratio_mean"]) != 1.0 and abs(float(m["ratio_mean"]) - 1.0) < 0.1
  assert float(m["kl_mean"]) > 0


def test_bad_input_is_a_clear_error():
  lrn, state = fresh(one_device_mesh(), FULL)
  cases = {
      "advantages_B has non-finite": dict(advantages_B=np.full(B, np.nan, np.float32)),
      "advantages_B has non-finite ": dict(advantages_B=np.r_[np.inf, np.zeros(B - 1)]),
      "every loss mask": dict(loss_mask_BT=np.zeros((B, T), np.float32)),
      "shape": dict(advantages_B=np.zeros(B + 1, np.float32)),
      "loss_mask_BT\\[:, 0\\]": dict(loss_mask_BT=np.ones((B, T), np.float32)),
      "logp_behaviour_BT has non-finite": dict(
          logp_behaviour_BT=np.full((B, T), np.nan, np.float32)),
  }
  for match, change in cases.items():
    with pytest.raises(ValueError, match=match.strip()):
      lrn.train_step(state, {**make_batch(), **change})
  with pytest.raises(ValueError, match="unexpected"):
    lrn.train_step(state, {**make_batch(), "rewards_B": np.zeros(B)})


def test_empty_rows_and_masked_garbage_are_skipped():
  lrn, state = fresh(one_device_mesh(), FULL)
  batch = make_batch(7)
  batch["loss_mask_BT"][3] = 0.0  # a padding row
  batch["logp_behaviour_BT"][batch["loss_mask_BT"] == 0] = np.nan  # garbage where masked
  batch["advantages_B"][3] = 1e6
  state, m = lrn.train_step(state, batch)
  assert float(m["skipped"]) == 0.0 and float(m["samples"]) == B - 1
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(host(state.params)))


def test_non_finite_step_is_skipped_not_applied():
  lrn, state = fresh(one_device_mesh(), FULL)
  before = host(state.params)
  batch = make_batch()
  batch["advantages_B"][0] = np.nan  # bypasses the host checks via the raw jitted step
  state, m = lrn.jitted_step(state, {k: jnp.asarray(v) for k, v in batch.items()})
  assert float(m["skipped"]) == 1.0 and int(state.step) == 0
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(host(state.params))):
    np.testing.assert_array_equal(a, b)


def test_score_index_rows_buckets_and_padding():
  mask = np.zeros((3, 16), np.float32)
  mask[0, [2, 5, 9]] = 1.0
  mask[1, 1:12] = 1.0
  idx = learner_lib.score_index(mask)  # granularity 16 // 8 = 2: longest row 11 -> 12 slots
  assert idx.shape == (3, 12) and idx.dtype == np.int32
  assert list(idx[0]) == [2, 5, 9] + [0] * 9
  assert list(idx[1]) == list(range(1, 12)) + [0]
  assert not idx[2].any()
  assert learner_lib.score_index(np.ones((2, 16), np.float32)).shape == (2, 16)


def test_scoring_trained_positions_only_is_exact_there_and_zero_elsewhere():
  params = model_lib.init_params(CFG, jax.random.key(1))
  batch = {k: jnp.asarray(v) for k, v in make_batch().items()}
  idx = learner_lib.score_index(batch["loss_mask_BT"])
  assert idx.shape[1] < T  # rows are compacted
  fn = jax.jit(lambda p, b: learner_lib.score(p, b, CFG, chunk=5, entropy=True))
  lp_all, ent_all = fn(params, batch)
  lp, ent = fn(params, dict(batch, score_index_BM=jnp.asarray(idx)))
  on = np.asarray(batch["loss_mask_BT"]) > 0
  np.testing.assert_allclose(np.asarray(lp)[on], np.asarray(lp_all)[on], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(ent)[on], np.asarray(ent_all)[on], rtol=1e-6, atol=1e-6)
  assert not np.asarray(lp)[~on].any() and not np.asarray(ent)[~on].any()
  # The gradient of the loss is the same whichever way the positions were scored.
  grads = jax.jit(lambda p, b: learner_lib._grads(p, b, CFG, FULL, 0, None)[1])
  g_all = grads(params, dict(batch, score_index_BM=jnp.broadcast_to(jnp.arange(T), (B, T))))
  g_idx = grads(params, dict(batch, score_index_BM=jnp.asarray(idx)))
  for a, b in zip(jax.tree.leaves(g_all), jax.tree.leaves(g_idx)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)


def test_score_index_out_of_range_is_rejected():
  lrn, state = fresh(one_device_mesh(), FULL)
  batch = make_batch()
  batch["score_index_BM"] = np.full((B, 4), T, np.int32)
  with pytest.raises(ValueError, match="score_index_BM"):
    lrn.train_step(state, batch)


def test_bfloat16_compute_step_is_close_to_float32():
  """bfloat16 products (float32 accumulation, activations and master params): the same step's
  loss and gradients (Adam's first moment) as float32, within bfloat16 rounding."""
  mesh = one_device_mesh()
  params = sharding.init_sharded(CFG, jax.random.key(0), mesh, sharding.DEFAULT_RULES)
  batch = make_batch(4)
  out = {}
  for dtype in ("float32", "bfloat16"):
    lrn = learner_lib.make_learner(CFG.replace(dtype=dtype), FULL, mesh)
    state, m = lrn.train_step(lrn.init_state(jax.tree.map(jnp.copy, params)), batch)
    assert float(m["skipped"]) == 0.0
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    out[dtype] = (float(m["loss"]), host(state.opt_state[1][0].mu))
  (loss32, mu32), (loss16, mu16) = out["float32"], out["bfloat16"]
  np.testing.assert_allclose(loss16, loss32, rtol=0.05, atol=1e-3)
  scale = max(np.abs(x).max() for x in jax.tree.leaves(mu32))
  for a, b in zip(jax.tree.leaves(mu16), jax.tree.leaves(mu32)):
    np.testing.assert_allclose(a, b, rtol=0, atol=0.05 * scale)
