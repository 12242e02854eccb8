"""The loop's phases and presets without a model: what enters the window, what the designer is
shown, when the last window is paid, and the paper presets' settings."""

import dataclasses

import numpy as np
import pytest

from spade_jax import config as config_lib
from spade_jax import train
from spade_jax.sandbox.contract import Status
from spade_jax.selfplay import designer, episodes, ledger, loop, memory, records, rlve, seeds
from spade_jax.selfplay.state import HostState, from_json, to_json


def _cfg(preset="local", *overrides):
  c = config_lib.load(f"configs/spade.py:{preset}")
  config_lib.override(c, list(overrides))
  return c


def _card(env_id, source=records.DESIGNER, hint="try small moves"):
  return records.Card(env_id, "Optimization", "class XEnv: pass", source, 0, hint=hint)


def _sample(env_id):
  return records.Sample((1, 2), (0, 1), (0.0, -0.5), 0.6, records.DESIGNER, env_id,
                        "Optimization")


class FakePlays:
  """Stands in for loop.Plays: hinted plays of env 'late' fail to start, others return 1."""

  def __init__(self):
    from spade_jax.selfplay import progress
    self.progress = progress.quiet()

  def __call__(self, pool, params, groups, n, seed, name):
    eps = []
    for g, grp in enumerate(groups):
      for _ in range(n):
        failed = grp.env_id == "late"
        eps.append(episodes.Episode(g, ret=0.0 if failed else 1.0,
                                    end="start_failed" if failed else "terminated"))
    return eps, episodes.Timing()


def test_hinted_plays_that_failed_to_start_are_left_out_of_regret():
  c = _cfg("local", "hinted_plays=3")
  regen = designer.Regeneration(
      [designer.Admitted(_card(e), _sample(e)) for e in ("ok", "late")], [], 0)
  host, stats, _ = loop.open_window(c, 0, HostState(), regen, None, None, FakePlays())
  assert host.window.envs["ok"].hinted == (1.0, 1.0, 1.0)
  # Counted as return 0 before, they made the hint look harmful; now the hint counts as failed.
  assert host.window.envs["late"].hinted is None
  assert stats["hinted_start_failed"] == 3 and stats["designer_hinted"] == 2
  assert [cd.env_id for cd in host.pool[:2]] == ["ok", "late"]


class RecordingPlays(FakePlays):
  def __init__(self):
    super().__init__()
    self.seeds = {}

  def __call__(self, pool, params, groups, n, seed, name):
    self.seeds[name] = (seed, [g.seed for g in groups], n)
    return super().__call__(pool, params, groups, n, seed, name)


def test_each_kind_of_play_draws_from_its_own_seed_phase():
  c = _cfg("local", "seed=5", "hinted_plays=3", "plays_per_env=2")
  regen = designer.Regeneration([designer.Admitted(_card("ok"), _sample("ok"))], [], 0)
  plays = RecordingPlays()
  host, _, _ = loop.open_window(c, 4, HostState(), regen, None, None, plays)
  loop.play_pool(c, 4, host, None, None, plays, loop.memory_config(c))[0]
  hinted, unhinted = plays.seeds["hinted plays"], plays.seeds["unhinted plays"]
  assert hinted[0] == seeds.derive(5, 4, seeds.HINTED_PLAYS) and hinted[2] == 3
  assert unhinted[0] == seeds.derive(5, 4, seeds.PLAYS) and unhinted[2] == 2
  # A hinted play resets its environment as the unhinted plays of the same step do.
  assert hinted[1] == unhinted[1][:1] == [seeds.derive(5, 4, seeds.RESET, 0)]


def test_pay_window_scales_by_the_agent_samples_of_a_step():
  c = _cfg("local")  # 2 environments x 4 plays, k = 2: scale min(8 / 2 * 2, 50) = 8
  envs = {"a": ("Optimization", [1.0]), "b": ("Optimization", [1.0])}
  w = ledger.new_window(0, envs, [_sample("a"), _sample("b")])
  w = ledger.record_unhinted(w, 0, {"a": [0.0, 1.0], "b": [0.0, 0.0]})
  _, paid, stats = loop.pay_window(c, HostState(window=w), loop.reward_config(c))
  adv = {s.env_id: s.advantage for s in paid}
  assert stats["designer_paid"] == 2 and adv["a"] == pytest.approx(-adv["b"])
  r = ledger.close(w, loop.reward_config(c), {}, 8, 2).stats
  assert adv["a"] == pytest.approx((r["a"]["reward"] - r["b"]["reward"]) / 2 * 8.0)


def test_paper_presets_fill_no_starters_and_local_does():
  c = _cfg("qwen3_4b", "starter_fill=false")
  regen = designer.Regeneration([designer.Admitted(_card("ok"), _sample("ok"))], [], 0)
  host, _, _ = loop.open_window(c, 0, HostState(), regen, None, None, FakePlays())
  assert [cd.source for cd in host.pool] == [records.DESIGNER]
  host, _, _ = loop.open_window(_cfg("local"), 0, HostState(), regen, None, None, FakePlays())
  assert [cd.source for cd in host.pool] == [records.DESIGNER, records.STARTER]
  assert not _cfg("qwen3_4b").starter_fill and not _cfg("qwen3_8b").starter_fill
  assert _cfg("local").starter_fill


def _window_with(offsets):
  w = ledger.new_window(4, {"a": ("Optimization", [1.0])}, [_sample("a")])
  for o in offsets:
    w = ledger.record_unhinted(w, 4 + o, {"a": [0.0, 1.0]})
  return w


def test_the_last_window_is_paid_only_when_complete():
  c = _cfg("local")  # k = 2
  rcfg = loop.reward_config(c)
  host, paid, stats = loop.pay_final_window(c, HostState(window=_window_with([0, 1])), rcfg)
  assert len(paid) == 1 and stats["designer_paid"] == 1 and host.window is None
  host, paid, stats = loop.pay_final_window(c, HostState(window=_window_with([0])), rcfg)
  assert paid == [] and stats == {"designer_unpaid": 1} and host.window is None


def test_host_state_round_trips_and_holds_nothing_derivable():
  h = HostState(3, (_card("a"),), (memory.Record("Optimization", "c", 0.5, 0.1, 0, "a"),),
                _window_with([0]), {"Optimization": (0.5, 0.4)}, {"pos": 7})
  assert from_json(to_json(h)) == h
  assert {f.name for f in dataclasses.fields(HostState)} == {
      "step", "pool", "memory", "window", "skill_emas", "corpus", "rlve"}  # no regen index
  with_rlve = dataclasses.replace(h, rlve=rlve.record(rlve.new_state(["a", "b"], 0.5, 1), "a",
                                                      1, True))
  assert from_json(to_json(with_rlve)) == with_rlve
  with pytest.raises(ValueError, match="lacks"):
    from_json({"step": 1})


def _prompt(c, mem=()):
  msgs = designer._messages("Optimization", None, list(mem), loop.memory_config(c), c,
                            np.random.default_rng(0))
  return msgs[0]["content"]


def test_what_the_designer_is_shown_from_memory():
  starter_marker = "An example of a well-formed environment"
  assert starter_marker in _prompt(_cfg("local"))  # cold start: the format, from a starter
  assert starter_marker not in _prompt(_cfg("local", "memory.cold_start_example=none"))
  past = [memory.Record("Optimization", "class PastEnv: pass", 0.5, 0.3, 0, "p")]
  assert "class PastEnv" in _prompt(_cfg("local"), past)
  no_memory = _prompt(_cfg("local", "memory.enabled=false"), past)
  assert "class PastEnv" not in no_memory and starter_marker not in no_memory
  assert "class " not in no_memory.split("Rules for the program")[0]


def test_the_memory_band_and_its_edges():
  assert loop.memory_config(_cfg("qwen3_4b")).band == (0.15, 0.85)
  cfg = memory.MemoryConfig()
  recs = [memory.Record("A", str(w), w, 1.0, i) for i, w in enumerate((0.14, 0.15, 0.85, 0.86))]
  pos, _ = memory.examples(recs, "A", dataclasses.replace(cfg, n_positive=4),
                           np.random.default_rng(0))
  assert sorted(r.win_rate for r in pos) == [0.15, 0.85]


def test_paper_presets_sample_as_the_recipe_and_need_a_corpus():
  c = _cfg("qwen3_4b", "model=/data/Qwen3-4B")
  assert (c.designer.temperature, c.designer.top_p, c.designer.top_k,
          c.designer.max_new_tokens) == (0.6, 0.95, 20, 16384)
  assert (c.agent.temperature, c.agent.top_p, c.agent.top_k, c.agent.max_new_tokens) == (
      0.6, 0.95, 20, 8192)
  assert (c.agent_context, c.hint.temperature, c.hint.max_new_tokens) == (32768, 0.3, 4096)
  assert _cfg("qwen3_8b").designer.max_new_tokens == 20000
  with pytest.raises(ValueError, match="corpus.path=DOCS.jsonl"):
    train.validate(c)
  config_lib.override(c, ["corpus.builtin=true"])
  train.validate(c)  # an explicit choice
  config_lib.override(c, ["corpus.path=configs/spade.py"])
  with pytest.raises(ValueError, match="choose one"):
    train.validate(c)


def test_config_validation_names_every_problem(tmp_path):
  c = _cfg("local", "k=0", "reward.variant=vibes", "agent.top_p=0",
           "memory.cold_start_example=all", f"designer.programs={tmp_path}")
  with pytest.raises(ValueError) as e:
    train.validate(c)
  msg = str(e.value)
  for part in ("k must be positive", "reward.variant 'vibes'", "agent:",
               "memory.cold_start_example 'all'", "no .py files"):
    assert part in msg
  with pytest.raises(ValueError, match="model is empty"):
    train.validate(_cfg("qwen3_4b"))


@pytest.mark.parametrize("status, reward, terminated, want", [
    (Status.OK, 1.0, True, 1.0), (Status.OK, 0.7, True, 0.7), (Status.OK, 5.0, True, 1.0),
    (Status.OK, 0.7, False, 0.0),  # not terminated: shaped rewards are ignored
    (Status.OK, 1.0, False, 0.0), (Status.CRASHED, 1.0, True, -1.0),
    (Status.TIMEOUT, 0.0, False, -1.0)])
def test_return_is_outcome_only(status, reward, terminated, want):
  assert episodes.outcome(status, reward, terminated) == want


def test_the_learner_gets_each_config_field_under_its_own_name():
  c = _cfg("local", "rl.eps_low=0.11", "rl.eps_high=0.33", "rl.tis_cap=1.7", "rl.kl_beta=0.01",
           "optim.lr=3e-6", "optim.b1=0.8", "optim.b2=0.9", "optim.weight_decay=0.05")
  lc = loop.learner_config(c)
  assert (lc.eps_low, lc.eps_high, lc.tis_cap, lc.kl_beta) == (0.11, 0.33, 1.7, 0.01)
  assert (lc.lr, lc.b1, lc.b2, lc.weight_decay) == (3e-6, 0.8, 0.9, 0.05)
  r = loop.reward_config(_cfg("local", "reward.lp_fast=0.9", "reward.lp_slow=0.7",
                              "reward.band_low=0.3", "reward.band_high=0.7"))
  assert (r.lp_fast, r.lp_slow, r.band_low, r.band_high) == (0.9, 0.7, 0.3, 0.7)


def test_an_observation_no_tokenizer_takes_ends_its_episode_not_the_run():
  assert episodes._encodable("plain text, ünïcode, 漢字")
  assert not episodes._encodable("lone \ud800 surrogate")


def test_a_fixed_pool_is_sampled_per_step_without_replacement():
  from spade_jax.selfplay import baselines
  cards = [_card(f"e{i}", records.FIXED) for i in range(6)]
  draws = [tuple(cd.env_id for cd in baselines.sample_pool(cards, 3, seed)) for seed in range(12)]
  assert all(len(set(d)) == 3 and list(d) == sorted(d) for d in draws)  # distinct, pool order
  assert len(set(draws)) > 4 and draws[0] == tuple(
      cd.env_id for cd in baselines.sample_pool(cards, 3, 0))  # seeded
  assert baselines.sample_pool(cards[:2], 3, 0) == cards[:2]
  from spade_jax.sandbox import starters
  assert [n for n, _ in baselines.pool_programs("")] == sorted(starters.STARTERS)


def test_rlve_instances_are_rendered_at_levels_from_each_window():
  from spade_jax.sandbox import families
  from spade_jax.selfplay import baselines
  state = rlve.new_state(families.NAMES, tau_acc=0.5, tau_num=1, d_delta=2)
  for _ in range(3):  # prime_factors promoted three times; d_delta = 2 keeps two levels
    state = rlve.record(state, "prime_factors", rlve.windows(state)["prime_factors"][1], True)
  assert rlve.windows(state)["prime_factors"] == (3, 4)
  cards = baselines.rlve_cards(state, 14, step=3, seed=7)
  assert [cd.env_id for cd in cards] == [cd.env_id for cd in baselines.rlve_cards(state, 14, 3, 7)]
  names = [baselines.family_of(cd) for cd in cards]
  assert set(names[:12]) == set(families.NAMES) and len(names) == 14  # every family, cycled
  for cd, name in zip(cards, names):
    lo, hi = rlve.windows(state)[name]
    assert lo <= cd.level <= hi and cd.source == records.FAMILY and cd.step == 3
    assert f"LEVEL = {cd.level}" in cd.code and cd.skill == families.skill(name)
