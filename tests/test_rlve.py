"""RLVE's difficulty controller: the window moves exactly as specified on a hand-computed
sequence, draws stay in the window and follow the seed, and the state survives JSON."""

import json

import numpy as np
import pytest

from spade_jax.selfplay import rlve

W, L = True, False


def _play(state, name, steps):
  """Record (level, won, expected window after it) in order and check each window."""
  for level, won, want in steps:
    state = rlve.record(state, name, level, won)
    assert rlve.windows(state)[name] == want, (level, won, want, rlve.windows(state)[name])
  return state


def test_window_moves_as_specified():
  # tau_num 4, tau_acc 0.75, d_delta 3: h rises once 4+ plays at h have accuracy >= 0.75.
  s = rlve.new_state(["b", "a"], tau_acc=0.75, tau_num=4, d_delta=3)
  assert rlve.windows(s) == {"a": (1, 1), "b": (1, 1)}
  s = _play(s, "a", [
      (1, W, (1, 1)), (1, W, (1, 1)), (1, L, (1, 1)),  # 2/3: too few plays
      (1, W, (1, 2)),                                   # 3/4 = 0.75 over 4: promoted
      (1, W, (1, 2)),                                   # below h: counted, moves nothing
      (2, L, (1, 2)), (2, W, (1, 2)), (2, W, (1, 2)),
      (2, L, (1, 2)),                                   # 2/4 = 0.5: enough plays, too few wins
      (2, W, (1, 2)), (2, W, (1, 2)),                   # 3/5, 4/6
      (2, W, (1, 2)),                                   # 5/7 = 0.714
      (2, W, (1, 3)),                                   # 6/8 = 0.75: promoted
      (3, W, (1, 3)), (3, W, (1, 3)), (3, W, (1, 3)),
      (3, W, (2, 4)),                                   # [1, 4] spans 4 > 3: low rises
      (4, W, (2, 4)), (4, L, (2, 4)), (4, W, (2, 4)), (4, W, (3, 5)),
  ])
  assert rlve.windows(s)["b"] == (1, 1)  # another environment's results are its own
  assert rlve.accuracy(s, "a", 1) == (4 / 5, 5)
  assert rlve.accuracy(s, "a", 2) == (6 / 8, 8)
  assert rlve.accuracy(s, "a", 5) == (0.0, 0)  # the new h starts from zero
  assert rlve.level_stats(s) == {"rlve_level_mean": 3.0, "rlve_level_max": 5.0}
  # Three straight wins are not enough plays; the fourth is.
  s = _play(s, "b", [(1, W, (1, 1)), (1, W, (1, 1)), (1, W, (1, 1)), (1, W, (1, 2))])
  assert rlve.level_stats(s) == {"rlve_level_mean": 3.5, "rlve_level_max": 5.0}


def test_old_results_at_a_former_high_do_not_promote_again():
  s = rlve.new_state(["a"], tau_acc=0.5, tau_num=2, d_delta=4)
  s = rlve.record_many(s, [("a", 1, W), ("a", 1, W)])
  assert rlve.windows(s)["a"] == (1, 2)
  s = rlve.record_many(s, [("a", 1, W)] * 10)  # stale level-1 results (drawn before the rise)
  assert rlve.windows(s)["a"] == (1, 2)


def test_paper_thresholds_and_float_accuracy():
  s = rlve.new_state(["a"])
  assert (s.tau_acc, s.tau_num, s.d_delta) == (0.9, 128, 4)
  s = rlve.record_many(s, [("a", 1, W)] * 115 + [("a", 1, L)] * 13)  # 115/128 = 0.898
  assert rlve.windows(s)["a"] == (1, 1)
  s = rlve.record_many(s, [("a", 1, W)] * 2)  # 117/130 = 0.9 exactly
  assert rlve.windows(s)["a"] == (1, 2)


def test_bad_records_fail_loudly():
  s = rlve.new_state(["a"])
  with pytest.raises(ValueError, match="above its window"):
    rlve.record(s, "a", 2, True)
  with pytest.raises(KeyError, match="unknown environment"):
    rlve.record(s, "zz", 1, True)
  with pytest.raises(ValueError):
    rlve.new_state(["a", "a"])
  with pytest.raises(ValueError):
    rlve.new_state(["a"], tau_acc=1.5)


def test_state_is_immutable():
  s = rlve.new_state(["a"], tau_num=1, tau_acc=0.5)
  t = rlve.record(s, "a", 1, True)
  assert rlve.windows(s)["a"] == (1, 1) and rlve.windows(t)["a"] == (1, 2)
  with pytest.raises(AttributeError):
    s.tau_num = 3


def test_draw_stays_in_the_window_and_follows_the_seed():
  s = rlve.new_state(["a", "b"], tau_acc=0.5, tau_num=1, d_delta=3)
  for h in range(1, 5):  # a: four promotions to h = 5; d_delta 3 keeps [3, 5]
    s = rlve.record(s, "a", h, True)
  assert rlve.windows(s) == {"a": (3, 5), "b": (1, 1)}
  levels = [rlve.draw(s, "a", np.random.default_rng(7)) for _ in range(3)]
  assert len(set(levels)) == 1  # same seed, same level
  rng = np.random.default_rng(0)
  drawn = [rlve.draw(s, "a", rng) for _ in range(300)]
  assert set(drawn) == {3, 4, 5}
  assert all(isinstance(x, int) for x in drawn)
  rng1, rng2 = np.random.default_rng(1), np.random.default_rng(1)
  assert [rlve.draw(s, "a", rng1) for _ in range(20)] == [rlve.draw(s, "a", rng2) for _ in range(20)]
  assert {rlve.draw(s, "b", rng) for _ in range(20)} == {1}


def test_json_round_trip():
  s = rlve.new_state(["x", "y"], tau_acc=0.75, tau_num=4, d_delta=2)
  s = rlve.record_many(s, [("x", 1, W), ("x", 1, W), ("x", 1, W), ("x", 1, L), ("x", 2, L), ("y", 1, W)])
  back = rlve.from_json(json.loads(json.dumps(rlve.to_json(s))))
  assert back == s
  assert rlve.to_json(back) == rlve.to_json(s)
  bad = rlve.to_json(s)
  bad["windows"]["x"]["low"] = 0
  with pytest.raises(ValueError):
    rlve.from_json(bad)
