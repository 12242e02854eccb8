"""Delayed designer rewards: which plays count where, who is paid when, and with what."""

import types

import numpy as np
import pytest

from spade_jax.selfplay import batch, ledger

RCFG = types.SimpleNamespace(variant="blend", regret_weight=0.4, anchor_weight=0.6,
                             regret_scale=0.15, band_low=0.4, band_high=0.6, ramp=0.25,
                             lp_fast=0.85, lp_slow=0.98)


def _window():
  w = ledger.new_window(start=8)
  ledger.add_env(w, "a", "Optimization", hinted=[1.0, 1.0, 0.0, 1.0])
  ledger.add_env(w, "b", "Optimization", hinted=None)  # hint generation failed
  ledger.add_env(w, "c", "Logical_Deduction", hinted=[0.0, 0.0])
  for s in ("a", "b", "c"):
    ledger.add_designer_sample(w, {"env_id": s, "skill": w["envs"][s]["skill"], "tokens": [1, 2],
                                   "mask": [0, 1], "logp": [0.0, -0.7], "temperature": 1.0})
  ledger.record_unhinted(w, 8, {"a": [0.0, 1.0], "b": [1.0, 1.0], "c": [0.0, 0.0],
                                "old-env": [1.0]})
  ledger.record_unhinted(w, 9, {"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [0.0, 1.0]})
  return w


def test_regret_uses_offset_zero_and_win_rate_uses_the_whole_window():
  w = _window()
  assert "old-env" not in w["envs"]  # environments of other windows are not recorded
  a = ledger.env_stats(w["envs"]["a"])
  assert a["regret"] == pytest.approx(0.75 - 0.5)  # hinted mean - offset-0 unhinted mean
  assert a["win_rate"] == pytest.approx(0.75)  # all four unhinted plays of steps 8 and 9
  assert a["win_rate_0"] == pytest.approx(0.5)
  assert ledger.env_stats(w["envs"]["b"])["regret"] == 0.0  # failed hint: regret 0


def test_blend_rewards_and_paid_advantages():
  w = _window()
  reward_of, stats, _ = ledger.rewards(w, RCFG, {})
  # a: regret 0.25 -> term 1; win 0.75 -> anchor 1 - 0.15/0.25 = 0.4 -> 0.4 + 0.24 = 0.64
  assert reward_of["a"] == pytest.approx(0.4 * 1.0 + 0.6 * 0.4)
  # b: regret 0, win 1.0 -> anchor 0 -> 0
  assert reward_of["b"] == pytest.approx(0.0)
  # c: regret 0 - 0 = 0, win 0.25 -> anchor 1 - 0.15/0.25 = 0.4 -> 0.24
  assert reward_of["c"] == pytest.approx(0.6 * 0.4)
  paid = ledger.paid_samples(w, reward_of, n_agent=12, k=2, scale_cap=50.0)
  scale = min(12 / 3 * 2, 50.0)
  adv = {s["env_id"]: s["advantage"] for s in paid}
  assert adv["a"] == pytest.approx((0.64 - 0.32) * scale)  # centred within Optimization
  assert adv["b"] == pytest.approx((0.0 - 0.32) * scale)
  assert adv["c"] == pytest.approx(0.0)  # alone in its skill
  # The behaviour log-probs from generation time travel unchanged to the batch.
  assert all(s["logp"] == [0.0, -0.7] for s in paid)


def test_variants():
  w = _window()
  solve = ledger.rewards(w, types.SimpleNamespace(**{**vars(RCFG), "variant": "solve_rate"}),
                         {})[0]
  assert solve == pytest.approx({"a": 0.4, "b": 0.0, "c": 0.4})
  reg = ledger.rewards(w, types.SimpleNamespace(**{**vars(RCFG), "variant": "regret"}), {})[0]
  assert reg["a"] == pytest.approx(0.0)  # 0.75 hinted vs 0.75 all unhinted
  assert reg["c"] == pytest.approx(0.0)  # floored
  lp_cfg = types.SimpleNamespace(**{**vars(RCFG), "variant": "learning_potential"})
  first, _, lp = ledger.rewards(w, lp_cfg, {})
  assert first == pytest.approx({"a": 0.0, "b": 0.0, "c": 0.0})  # first sighting
  second, _, _ = ledger.rewards(w, lp_cfg, {"Optimization": [0.0, 0.0]})
  assert second["a"] == pytest.approx(abs(0.15 * 0.875 - 0.02 * 0.875))
  with pytest.raises(ValueError, match="unknown designer reward variant"):
    ledger.rewards(w, types.SimpleNamespace(**{**vars(RCFG), "variant": "vibes"}), {})


def test_window_without_offset_zero_plays_is_an_error():
  w = ledger.new_window(0)
  ledger.add_env(w, "a", "Optimization", [1.0])
  ledger.record_unhinted(w, 1, {"a": [1.0]})
  with pytest.raises(ValueError, match="offset 0"):
    ledger.rewards(w, RCFG, {})


def test_designer_samples_first_trimmed_to_global_batch_and_packed():
  designer = [{"tokens": [5, 6, 7], "mask": [0, 1, 1], "logp": [0, -1, -2], "temperature": 1.0,
               "advantage": 2.0}]
  agent = [{"tokens": [1, 2], "mask": [0, 1], "logp": [0, -0.5], "temperature": 0.6,
            "advantage": a} for a in (1.0, -1.0, 0.5)]
  samples, n_designer = batch.assemble(designer, agent, global_batch=3)
  assert n_designer == 1 and [s["advantage"] for s in samples] == [2.0, 1.0, -1.0]
  b = batch.pack(samples, rows=4, multiple=8)
  assert b["tokens_BT"].shape == (4, 8)
  np.testing.assert_array_equal(b["loss_mask_BT"][:, :3], [[0, 1, 1], [0, 1, 0], [0, 1, 0],
                                                           [0, 0, 0]])
  np.testing.assert_allclose(b["logp_behaviour_BT"][0, :3], [0, -1, -2])
  np.testing.assert_allclose(b["temperature_B"], [1.0, 0.6, 0.6, 1.0])
  assert [batch.length_bucket(n) for n in (1, 64, 65, 96, 97, 200, 700)] == [
      64, 64, 96, 96, 128, 256, 768]
  with pytest.raises(ValueError, match="lengths differ"):
    batch.pack([dict(designer[0], mask=[0, 1])], rows=1)
