"""Delayed designer rewards: which plays count where, who is paid when, and with what; and how
a full batch leaves samples out."""

import dataclasses

import numpy as np
import pytest

from spade_jax import rl
from spade_jax.selfplay import batch, ledger, records

RCFG = rl.RewardConfig()


def _sample(env_id, skill, role=records.DESIGNER, advantage=0.0, group=0, temperature=1.0):
  return records.Sample((1, 2), (0, 1), (0.0, -0.7), temperature, role, env_id, skill,
                        advantage, group)


def _window():
  envs = {"a": ("Optimization", [1.0, 1.0, 0.0, 1.0]),
          "b": ("Optimization", None),  # hint generation failed
          "c": ("Logical_Deduction", [0.0, 0.0])}
  w = ledger.new_window(8, envs, [_sample(e, s) for e, (s, _) in envs.items()])
  w = ledger.record_unhinted(w, 8, {"a": [0.0, 1.0], "b": [1.0, 1.0], "c": [0.0, 0.0],
                                    "old-env": [1.0]})
  return ledger.record_unhinted(w, 9, {"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [0.0, 1.0]})


def _close(w, emas=None, **cfg):
  return ledger.close(w, dataclasses.replace(RCFG, **cfg), emas or {}, n_agent=12, k=2)


def test_regret_uses_offset_zero_and_win_rate_uses_the_whole_window():
  w = _window()
  assert "old-env" not in w.envs  # environments of other windows are not recorded
  a = ledger.env_stats(w.envs["a"])
  assert a["regret"] == pytest.approx(0.75 - 0.5)  # hinted mean - offset-0 unhinted mean
  assert a["win_rate"] == pytest.approx(0.75)  # all four unhinted plays of steps 8 and 9
  assert a["win_rate_0"] == pytest.approx(0.5)
  assert ledger.env_stats(w.envs["b"])["regret"] == 0.0  # failed hint: regret 0
  assert ledger.complete(w, k=2) and not ledger.complete(w, k=3)


def test_blend_rewards_and_paid_advantages():
  p = _close(_window())
  reward = {e: s["reward"] for e, s in p.stats.items()}
  # a: regret 0.25 -> term 1; win 0.75 -> anchor 1 - 0.15/0.25 = 0.4 -> 0.4 + 0.24 = 0.64
  assert reward["a"] == pytest.approx(0.4 * 1.0 + 0.6 * 0.4)
  assert reward["b"] == pytest.approx(0.0)  # regret 0, win 1.0 -> anchor 0
  assert reward["c"] == pytest.approx(0.6 * 0.4)  # regret 0, win 0.25 -> anchor 0.4
  scale = min(12 / 3 * 2, 50.0)
  adv = {s.env_id: s.advantage for s in p.samples}
  assert adv["a"] == pytest.approx((0.64 - 0.32) * scale)  # centred within Optimization
  assert adv["b"] == pytest.approx((0.0 - 0.32) * scale)
  assert adv["c"] == pytest.approx(0.0)  # alone in its skill
  # The behaviour log-probs and temperature from generation time travel unchanged.
  assert all(s.logp == (0.0, -0.7) and s.temperature == 1.0 for s in p.samples)


def test_variants():
  w = _window()
  solve = {e: s["reward"] for e, s in _close(w, variant="solve_rate").stats.items()}
  assert solve == pytest.approx({"a": 0.4, "b": 0.0, "c": 0.4})
  reg = {e: s["reward"] for e, s in _close(w, variant="regret").stats.items()}
  assert reg["a"] == pytest.approx(0.0)  # 0.75 hinted vs 0.75 all unhinted
  assert reg["c"] == pytest.approx(0.0)  # floored
  with pytest.raises(ValueError, match="unknown designer reward variant"):
    _close(w, variant="vibes")


def test_regret_variant_pays_zero_when_the_hint_failed():
  # b's hint failed; its offset-0 mean (1.0) is above its window mean (0.75 after a bad step):
  # the old code paid max(0, 1.0 - 0.75) = 0.25 from the unhinted plays alone.
  envs = {"b": ("Optimization", None), "d": ("Optimization", [1.0])}
  w = ledger.new_window(0, envs, [_sample("b", "Optimization"), _sample("d", "Optimization")])
  w = ledger.record_unhinted(w, 0, {"b": [1.0, 1.0], "d": [0.0, 0.0]})
  w = ledger.record_unhinted(w, 1, {"b": [0.0, 1.0], "d": [0.0, 0.0]})
  reg = {e: s["reward"] for e, s in _close(w, variant="regret").stats.items()}
  assert reg == pytest.approx({"b": 0.0, "d": 1.0})


def test_learning_potential_gives_environments_of_one_skill_different_advantages():
  envs = {e: ("Optimization", [1.0]) for e in "xyz"}
  w = ledger.new_window(0, envs, [_sample(e, "Optimization") for e in "xyz"])
  w = ledger.record_unhinted(w, 0, {"x": [1.0, 1.0], "y": [0.0, 1.0], "z": [0.0, 0.0]})
  # The skill's slow average so far is 0.2; its window mean is 0.5.
  p = _close(w, {"Optimization": (0.3, 0.2)}, variant="learning_potential")
  raw = {e: s["reward"] for e, s in p.stats.items()}
  assert raw == pytest.approx({"x": 0.8, "y": 0.3, "z": 0.2})  # |win rate - 0.2|
  adv = [s.advantage for s in p.samples]
  assert len(set(np.round(adv, 6))) == 3 and all(a != 0 for a in adv)
  assert sum(adv) == pytest.approx(0.0, abs=1e-6)  # centred per skill
  # mu <- (1 - g) mu + g r, g weighing the new window's rate (0.98 fast, 0.85 slow).
  fast, slow = p.skill_emas["Optimization"]
  assert fast == pytest.approx(0.02 * 0.3 + 0.98 * 0.5)
  assert slow == pytest.approx(0.15 * 0.2 + 0.85 * 0.5)
  # A skill seen for the first time starts at its window rate: |win - 0.5|, not constant.
  first = _close(w, variant="learning_potential")
  assert {e: s["reward"] for e, s in first.stats.items()} == pytest.approx(
      {"x": 0.5, "y": 0.0, "z": 0.5})


def test_an_environment_never_played_at_offset_zero_is_not_paid_and_the_rest_are():
  envs = {"a": ("Optimization", [1.0]), "broken": ("Optimization", [1.0])}
  w = ledger.new_window(0, envs, [_sample("a", "Optimization"),
                                  _sample("broken", "Optimization")])
  w = ledger.record_unhinted(w, 0, {"a": [0.0, 1.0]})  # broken's plays failed to start
  w = ledger.record_unhinted(w, 1, {"a": [1.0, 1.0], "broken": [1.0, 1.0]})
  p = _close(w)
  assert p.unmeasured == ["broken"]
  assert [s.env_id for s in p.samples] == ["a"] and set(p.stats) == {"a"}
  # The scale counts the paid samples only: two measured environments of one skill beside an
  # unmeasured one get (r - mean) * min(12 / 2 * 2, 50).
  envs["b"] = ("Optimization", [0.0])
  w = ledger.new_window(0, envs, [_sample(e, "Optimization") for e in envs])
  w = ledger.record_unhinted(w, 0, {"a": [0.0, 1.0], "b": [1.0, 1.0]})
  w = ledger.record_unhinted(w, 1, {"a": [1.0, 1.0], "b": [1.0, 1.0], "broken": [1.0]})
  p = _close(w)
  r = {e: s["reward"] for e, s in p.stats.items()}
  mean = (r["a"] + r["b"]) / 2
  assert {s.env_id: s.advantage for s in p.samples} == pytest.approx(
      {"a": (r["a"] - mean) * 12.0, "b": (r["b"] - mean) * 12.0})
  assert r["a"] != r["b"]


def test_window_round_trips_through_json():
  w = _window()
  assert ledger.from_json(ledger.to_json(w)) == w
  assert ledger.from_json(None) is None


def _agent(groups, size=2):
  return [_sample(f"e{g}", "Optimization", records.AGENT, float(g), g, 0.6)
          for g in range(groups) for _ in range(size)]


def test_designer_first_then_whole_agent_groups_chosen_fairly():
  designer = [_sample("d", "Optimization", advantage=2.0)]
  samples, left_out = batch.assemble(designer, _agent(5), global_batch=7, seed=0)
  assert samples[0].role == records.DESIGNER and left_out == 4
  groups = [s.group for s in samples[1:]]
  assert len(groups) == 6 and all(groups.count(g) == 2 for g in set(groups))  # whole groups
  assert groups == sorted(groups)  # in their original order
  # Which groups are left out depends on the seed, so no environment always loses its plays.
  left = {tuple(sorted(set(range(5)) - {s.group for s in batch.assemble(
      designer, _agent(5), 7, seed)[0][1:]})) for seed in range(20)}
  assert len(left) > 3
  everything, none_left = batch.assemble(designer, _agent(3), global_batch=7, seed=0)
  assert none_left == 0 and len(everything) == 7
  for seed in range(10):  # groups of 3 in 7 free rows: two whole groups, one row stays empty
    samples, left_out = batch.assemble(designer, _agent(5, size=3), global_batch=8, seed=seed)
    groups = [s.group for s in samples[1:]]
    assert len(samples) == 7 and left_out == 9
    assert all(groups.count(g) == 3 for g in set(groups))


def test_pack():
  designer = records.Sample((5, 6, 7), (0, 1, 1), (0, -1, -2), 1.0, records.DESIGNER, "d",
                            advantage=2.0)
  agent = [records.Sample((1, 2), (0, 1), (0, -0.5), 0.6, records.AGENT, "a", advantage=a)
           for a in (1.0, -1.0)]
  b = batch.pack([designer] + agent, rows=4, multiple=8)
  assert b["tokens_BT"].shape == (4, 8)
  np.testing.assert_array_equal(b["loss_mask_BT"][:, :3], [[0, 1, 1], [0, 1, 0], [0, 1, 0],
                                                           [0, 0, 0]])
  np.testing.assert_allclose(b["logp_behaviour_BT"][0, :3], [0, -1, -2])
  np.testing.assert_allclose(b["temperature_B"], [1.0, 0.6, 0.6, 1.0])
  np.testing.assert_allclose(b["advantages_B"], [2.0, 1.0, -1.0, 0.0])
  assert [batch.length_bucket(n) for n in (1, 64, 65, 96, 97, 200, 700)] == [
      64, 64, 96, 96, 128, 256, 768]
  with pytest.raises(ValueError, match="lengths differ"):
    records.Sample((1, 2), (0, 1), (0.0,), 1.0, records.AGENT, "a")
  with pytest.raises(ValueError, match="samples for a batch"):
    batch.pack(agent, rows=1)
