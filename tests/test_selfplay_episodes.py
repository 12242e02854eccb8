"""Agent episodes against a scripted sandbox and sampler: how an episode ends and what it is
worth, without a model or worker processes."""

import numpy as np
import pytest

from spade_jax import gguf_io, sampling
from spade_jax import tokenizer as tok_lib
from spade_jax.sandbox.contract import Reply, Status
from spade_jax.selfplay import episodes


class ScriptedPool:
  """Every episode replies to its n-th step with script[n] (reward, terminated, truncated)."""

  def __init__(self, script, start_status=Status.OK):
    self.script, self.start_status = script, start_status
    self.turn, self.sent, self.ended, self._next = {}, [], set(), 0

  def start_many(self, starts):
    for key in starts:
      self._next += 1
      self.turn[self._next] = 0
      yield Reply(key, self._next, self.start_status, observation="Pick a number.")

  def submit_steps(self, actions):
    self.sent.append(dict(actions))

  def wait(self, ids):
    out = []
    for e in ids:
      reward, term, trunc = self.script[min(self.turn[e], len(self.script) - 1)]
      self.turn[e] += 1
      out.append(Reply(e, e, Status.OK, observation="Again.", reward=reward, terminated=term,
                       truncated=trunc))
    return out

  def end_many(self, ids):
    self.ended |= set(ids)


class ScriptedSampler:
  """Each turn writes the same tokens (an action in a box) with log-prob -0.5 each."""

  def __init__(self, tokens):
    self.tokens = tokens

  class _Out:
    experts = prefill_experts = None  # a dense policy routes nothing

    def __init__(self, rows, tokens):
      self.rows, self.tokens = rows, tokens
      self.logprobs = np.full((rows, len(tokens)), -0.5, np.float32)

    def token_lists(self):
      return [list(self.tokens) for _ in range(self.rows)]

  def start(self, params, prompts, settings, seed, num_samples):
    rows = len(prompts) * num_samples
    return rows, self._Out(rows, self.tokens)

  def extend(self, params, conv, new_tokens, settings, seed):
    return conv, self._Out(conv, self.tokens)


@pytest.fixture(scope="module")
def tok():
  return tok_lib.load_tokenizer(gguf_io.embedded_gguf_path("smollm2-135m"))


def _play(tok, script, max_turns=5, plays=2, start_status=Status.OK):
  pool = ScriptedPool(script, start_status)
  sampler = ScriptedSampler(tok_lib.encode(tok, "I pick \\boxed{3}"))
  groups = [episodes.Group("env", "code", seed=1)]
  eps, _ = episodes.play(pool, sampler, None, tok, groups, plays,
                         sampling.Settings(max_new_tokens=8), episodes.Limits(
                             max_turns, 4096), seed=0)
  return eps, pool


def test_a_truncated_episode_is_worth_zero_whatever_its_last_reward(tok):
  eps, pool = _play(tok, [(0.0, False, False), (0.5, False, True)])
  assert [(e.end, e.ret, e.won, e.turns) for e in eps] == [("truncated", 0.0, False, 2)] * 2
  assert pool.sent[0] and all(a == "\\boxed{3}" for a in pool.sent[0].values())


def test_the_agent_turn_limit_ends_an_episode_at_zero(tok):
  eps, pool = _play(tok, [(0.9, False, False)], max_turns=1)
  assert [(e.end, e.ret, e.won) for e in eps] == [("max_turns", 0.0, False)] * 2
  assert len(pool.ended) == 2  # the loop ends what the environment did not


def test_a_win_is_the_terminal_reward_and_partial_credit_counts(tok):
  eps, _ = _play(tok, [(0.0, False, False), (1.0, True, False)])
  assert [(e.end, e.ret, e.won) for e in eps] == [("terminated", 1.0, True)] * 2
  eps, _ = _play(tok, [(0.4, True, False)])
  # Terminated at its goal with a positive reward is a win (the return keeps the partial 0.4).
  assert [(e.end, e.ret, e.won) for e in eps] == [("terminated", 0.4, True)] * 2
  eps, _ = _play(tok, [(0.0, True, False)])  # terminated at 0: not a win
  assert [(e.end, e.ret, e.won) for e in eps] == [("terminated", 0.0, False)] * 2


def test_the_transcript_masks_exactly_the_sampled_tokens(tok):
  eps, _ = _play(tok, [(0.0, False, False), (1.0, True, False)])
  t = eps[0].transcript
  action = tok_lib.encode(tok, "I pick \\boxed{3}")
  assert sum(t.mask) == 2 * len(action) and len(t.tokens) == len(t.mask) == len(t.logp)
  assert all((lp == -0.5) == bool(m) for lp, m in zip(t.logp, t.mask))
  assert t.mask[0] == 0 and t.tokens[-len(action):] == tuple(action)


def test_a_first_observation_with_no_room_for_a_turn_ends_its_plays_not_the_batch(tok):
  pool = ScriptedPool([(1.0, True, False)])
  pool.start_many = lambda starts: iter(
      [Reply(k, i + 1, Status.OK, observation=("word " * 3000 if k[0] == 0 else "Go."))
       for i, k in enumerate(starts)])
  pool.turn = {i: 0 for i in range(1, 5)}
  sampler = ScriptedSampler(tok_lib.encode(tok, "\\boxed{3}"))
  groups = [episodes.Group("long", "code", 1), episodes.Group("short", "code", 2)]
  eps, _ = episodes.play(pool, sampler, None, tok, groups, 2, sampling.Settings(max_new_tokens=8),
                         episodes.Limits(5, 1024), seed=0)
  assert [(e.group, e.end, e.ret) for e in eps] == [(0, "context", 0.0)] * 2 + [
      (1, "terminated", 1.0)] * 2
  assert {1, 2} <= pool.ended  # the long instance's sandbox episodes were ended


def test_an_instance_that_fails_to_start_is_dropped_whole(tok):
  eps, _ = _play(tok, [(1.0, True, False)], start_status=Status.ENV_ERROR)
  assert [(e.end, e.status) for e in eps] == [("start_failed", "ENV_ERROR")] * 2


def test_a_moe_policy_carries_its_routing_from_the_sampler_to_the_learner(tok):
  """Episodes of a MoE policy record the experts of every fed token; the packed batch replays
  them, and the learner then scores the sampled tokens closer to the sampler than without."""
  import dataclasses

  import jax

  from spade_jax import learner as learner_lib
  from spade_jax import loading, model, rl, sharding
  from spade_jax.selfplay import batch, records

  cfg = dataclasses.replace(model.PRESETS["tiny_moe"], vocab_size=len(tok))
  mesh = sharding.make_mesh({"data": -1}, jax.devices()[:1])
  params = sharding.init_sharded(cfg, jax.random.key(0), mesh, sharding.DEFAULT_RULES)
  loaded = loading.Loaded(cfg, params, tok, "random")
  sampler = sampling.Sampler.for_model(loaded, mesh, routing=True)
  pool = ScriptedPool([(0.0, False, False), (1.0, True, False)])
  eps, _ = episodes.play(pool, sampler, params, tok, [episodes.Group("env", "code", 1)], 2,
                         sampling.Settings(max_new_tokens=6, temperature=1.0),
                         episodes.Limits(5, 4096), seed=0)
  Lk = (len(cfg.sparse_layers), cfg.experts_per_token)
  samples = []
  for e, adv in zip(eps, (1.0, -1.0)):
    experts = rl.routing_replay(e.routing, len(e.transcript))
    assert experts.shape == (len(e.transcript), *Lk)
    assert (experts[:-1] >= 0).all() and (experts[-1] == -1).all()  # the last token is not fed
    t = e.transcript
    samples.append(records.Sample(t.tokens, t.mask, t.logp, 1.0, records.AGENT, "env",
                                  advantage=adv, experts=experts))
  assert records.sample_from_json(records.to_json(samples[0])).experts.tobytes() == (
      samples[0].experts.tobytes())
  b = batch.pack(samples, rows=2, experts_Lk=Lk)
  assert b["experts_BTLk"].shape == (2, b["tokens_BT"].shape[1], *Lk)
  gaps = {}
  for replay in (False, True):
    lrn = learner_lib.make_learner(cfg, learner_lib.LearnerConfig(routing_replay=replay), mesh)
    state = lrn.init_state(jax.tree.map(lambda a: a.copy(), params))  # the step donates it
    fed = dict(b) if replay else {k: v for k, v in b.items() if k != "experts_BTLk"}
    _, m = lrn.train_step(state, fed)
    gaps[replay] = float(m["abs_logp_diff_mean"])
  assert gaps[True] <= gaps[False] + 1e-6 and gaps[True] < 1e-3
