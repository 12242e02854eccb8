"""Qwen3-MoE in the engines: the routing the sampler records is what the learner would compute,
routing replay keeps the learner on the sampler's experts when a perturbation flips them, shared
prefixes with replay equal the row-by-row pass, the load-balancing loss enters the loss, and a
sampler call and a train step on 8 fake devices with an expert axis equal one device."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from spade_jax import decode, kv_cache, loading, rl, sampling, sharding
from spade_jax import learner as learner_lib
from spade_jax import model as model_lib
from tests.test_learner import assert_same_step

CFG = model_lib.PRESETS["tiny_moe"]
EP_RULES = dict(sharding.DEFAULT_RULES, batch=("data", "fsdp", "expert"))
EP_MESH = {"data": 1, "fsdp": 2, "expert": 2, "tensor": 2}
T, G = 64, 2
TURN = sampling.Settings(8, 1.0, 0, 1.0)  # both turns: one decode program at one capacity
OBS = [7, 8, 9]
REPLAY = learner_lib.LearnerConfig(routing_replay=True, micro_batch=4)


def one_device():
  return sharding.make_mesh({"data": 1}, jax.devices()[:1])


@pytest.fixture(scope="module")
def tiny():
  return loading.load_model("random:tiny_moe", one_device(), seed=3, tokenizer=False)


@pytest.fixture(scope="module")
def replay_learner():
  return learner_lib.make_learner(CFG, REPLAY, one_device())


def _prompts():
  rng = np.random.default_rng(0)
  return [rng.integers(2, CFG.vocab_size, n).tolist() for n in (34, 35, 36, 37)]


def play(sampler, params, seed=0):
  """Two-turn conversations (G samples of each prompt) as a learner batch: the sampled tokens
  trained, the sampler's log-probs and its routing (`rl.routing_replay`) per row."""
  prompts = _prompts()
  conv, o1 = sampler.start(params, prompts, TURN, seed, num_samples=G, capacity=128)
  conv, o2 = sampler.extend(params, conv, [OBS] * len(prompts) * G, TURN, seed + 1, capacity=128)
  N = len(prompts) * G
  batch = {k: np.zeros((N, T), dt) for k, dt in (("tokens_BT", np.int32),
                                                 ("loss_mask_BT", np.float32),
                                                 ("logp_behaviour_BT", np.float32))}
  experts = []
  for i in range(N):
    p, (n1, n2) = prompts[i // G], (o1.lengths[i], o2.lengths[i])
    row = p + o1.token_lists()[i] + OBS + o2.token_lists()[i]
    batch["tokens_BT"][i, :len(row)] = row
    for start, n, out in ((len(p), n1, o1), (len(p) + n1 + len(OBS), n2, o2)):
      batch["loss_mask_BT"][i, start:start + n] = 1.0
      batch["logp_behaviour_BT"][i, start:start + n] = out.logprobs[i, :n]
    experts.append(rl.routing_replay([o1.prefill_experts[i], o1.experts[i, :n1 - 1],
                                      o2.prefill_experts[i], o2.experts[i, :n2 - 1]], T))
    assert (experts[-1][:len(row) - 1] >= 0).all() and (experts[-1][len(row) - 1:] == -1).all()
  batch["advantages_B"] = np.random.default_rng(seed).normal(size=N).astype(np.float32)
  batch["temperature_B"] = np.full(N, 1.0, np.float32)
  batch["experts_BTLk"] = np.stack(experts)
  return batch, o1, o2


@pytest.fixture(scope="module")
def played(tiny):
  return play(sampling.Sampler(tiny.cfg, one_device(), routing=True), tiny.params)


_score_jit = jax.jit(lambda p, b: learner_lib.score(p, b, CFG, 256)[0])


def _score(params, batch, replay: bool):
  return np.asarray(_score_jit(params, {k: v for k, v in batch.items()
                                        if replay or k != "experts_BTLk"}))


@jax.jit
def _prefill_routing(params, tokens_BT):
  cache = kv_cache.empty(CFG, tokens_BT.shape[0], T)
  return decode.prefill_chunk(params, cache, tokens_BT, jnp.ones(tokens_BT.shape, bool), CFG,
                              with_experts=True)[2]


def fresh_routing(params, tokens_BT):
  """The experts every position is routed to, from one uncached prefill, each token's set sorted:
  [B, T, Ls, k]."""
  return np.sort(np.asarray(_prefill_routing(params, tokens_BT)), axis=-1)


def test_recorded_routing_is_the_learners_own(tiny, played):
  batch, _, _ = played
  mask = batch["loss_mask_BT"] > 0
  with_replay, without = _score(tiny.params, batch, True), _score(tiny.params, batch, False)
  np.testing.assert_allclose(with_replay[mask], batch["logp_behaviour_BT"][mask], atol=1e-5)
  np.testing.assert_allclose(without[mask], with_replay[mask], atol=1e-5)
  recorded = batch["experts_BTLk"]
  routed = recorded[..., 0] >= 0
  np.testing.assert_array_equal(np.sort(recorded, -1)[routed],
                                fresh_routing(tiny.params, batch["tokens_BT"])[routed])


def test_routing_replay_keeps_the_ratio_at_one_when_a_perturbation_flips_routing(
    tiny, played, replay_learner):
  """The learner's policy is the sampler's with a small change to the routers only: some
  tokens now pick other experts. Without replay their log-probs jump; with replay the learner
  uses the sampler's experts and moves only by the change in their weights."""
  batch, _, _ = played
  mask = batch["loss_mask_BT"] > 0
  params = jax.tree.map(jnp.copy, tiny.params)
  router = params["moe"]["router"]
  params["moe"]["router"] = router + 0.01 * router.std() * jax.random.normal(
      jax.random.key(9), router.shape)
  flipped = fresh_routing(params, batch["tokens_BT"]) != np.sort(batch["experts_BTLk"], -1)
  flipped = flipped.any(-1) & (batch["experts_BTLk"][..., 0] >= 0)
  assert 0 < flipped.mean() < 0.2, flipped.mean()
  gap_plain = np.abs(_score(params, batch, False) - batch["logp_behaviour_BT"])[mask]
  gap_replay = np.abs(_score(params, batch, True) - batch["logp_behaviour_BT"])[mask]
  assert gap_plain.max() > 0.05 and gap_replay.max() < gap_plain.max() / 10, (
      gap_plain.max(), gap_replay.max())
  # Through the learner step: its mean gap is the replayed one, its IS weights stay near 1.
  _, m = replay_learner.train_step(replay_learner.init_state(params), batch)
  np.testing.assert_allclose(m["abs_logp_diff_mean"], gap_replay.mean(), rtol=1e-3)
  assert float(m["abs_logp_diff_mean"]) < gap_plain.mean() / 3
  np.testing.assert_allclose(m["is_weight_mean"], 1.0, atol=0.01)
  with pytest.raises(ValueError, match="experts_BTLk"):
    replay_learner.train_step(replay_learner.init_state(params),
                              {k: v for k, v in batch.items() if k != "experts_BTLk"})


def test_shared_prefixes_with_replayed_routing_equal_row_by_row(tiny, played):
  batch, _, _ = played
  shared = learner_lib.with_shared_prefixes(batch, dataclasses.replace(REPLAY, micro_batch=0))
  assert shared["prefix_tokens_UP"].shape == (4, 32)  # one prefix per prompt, rows in order
  np.testing.assert_array_equal(shared["tokens_BT"], batch["tokens_BT"])
  np.testing.assert_allclose(_score(tiny.params, shared, True), _score(tiny.params, batch, True),
                             atol=1e-5)


def test_load_balancing_loss_enters_the_loss(tiny, played):
  batch, _, _ = played
  batch = dict(batch, score_index_BM=learner_lib.score_index(batch["loss_mask_BT"]))
  n = jnp.float32(len(batch["tokens_BT"]))

  def loss(coef):
    cfg = dataclasses.replace(REPLAY, router_aux_coef=coef)
    return jax.jit(lambda p, b: learner_lib.loss_fn(p, b, n, CFG, cfg))(tiny.params, batch)

  (plain, _), (with_aux, stats) = loss(0.0), loss(0.5)
  aux = float(stats["router_aux_loss"])
  assert aux > 1.0  # E * sum f_e P_e is about k for an even router, above it when uneven
  np.testing.assert_allclose(float(with_aux) - float(plain), 0.5 * aux, rtol=1e-4)


def test_sampler_and_train_step_with_an_expert_axis_equal_one_device(tiny, played,
                                                                     replay_learner):
  mesh = sharding.make_mesh(EP_MESH)
  sharded = loading.load_model("random:tiny_moe", mesh, EP_RULES, seed=3, tokenizer=False)
  w = sharded.params["moe"]["w_up"]
  assert w.sharding.spec == P(None, "expert", "fsdp", "tensor") and len(w.sharding.device_set) == 8
  assert w.addressable_shards[0].data.shape[1] == CFG.n_experts // 2
  batch8, o1, o2 = play(sampling.Sampler(CFG, mesh, EP_RULES, routing=True), sharded.params)
  batch1, p1, p2 = played
  for a, b in ((o1, p1), (o2, p2)):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    np.testing.assert_array_equal(a.experts, b.experts)
  np.testing.assert_array_equal(batch8["experts_BTLk"], batch1["experts_BTLk"])

  s1, m1 = replay_learner.train_step(replay_learner.init_state(jax.tree.map(jnp.copy,
                                                                            tiny.params)), batch1)
  lrn8 = learner_lib.make_learner(CFG, REPLAY, mesh, EP_RULES)
  s8, m8 = lrn8.train_step(lrn8.init_state(sharded.params), batch8)
  assert s8.opt_state[1][0].mu["moe"]["w_up"].sharding == w.sharding
  assert float(m1["prefix_saving"]) > 0  # the shared-prompt pass ran, on both meshes
  assert_same_step(s1, s8, 1e-5)
  np.testing.assert_allclose(m1["loss"], m8["loss"], rtol=1e-5)
