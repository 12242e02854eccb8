"""The self-play loop end to end with a tiny random model and a replayed designer: programs are
admitted or rejected, hinted, played, remembered, paid at t + k and trained; a killed run
resumes exactly."""

import json
import os
import re

import numpy as np
import pytest

import jax

from spade_jax import checkpoint as ckpt_lib
from spade_jax import config as config_lib
from spade_jax import tokenizer as tok_lib
from spade_jax import train
from spade_jax.sandbox import starters
from spade_jax.selfplay import batch as batch_lib
from spade_jax.selfplay import loop, prompts, records, rlve, seeds

SEED = 0
AGENT_T, DESIGNER_T = 0.7, 0.9  # neither 1.0 nor 0.6, so a swapped or default one shows
OVERRIDES = [
    "model=random:tiny_smollm2", "tokenizer=smollm2-135m", "total_steps=3", "k=2",
    "envs_per_regen=2", "plays_per_env=2", "hinted_plays=2", "attempts_per_slot=2",
    "global_batch=8", "env.max_turns=2", "agent.max_new_tokens=8", "designer.max_new_tokens=24",
    "hint.max_new_tokens=8", "corpus.max_words=40", "agent_context=4096", "optim.lr=1e-3",
    "optim.remat=false", "env.step_timeout_s=60.0", "mesh.data=1", f"seed={SEED}",
    f"agent.temperature={AGENT_T}", f"designer.temperature={DESIGNER_T}", "starter_fill=false",
    "warm_start.config=",  # the loop from the tiny model itself (the warm start: test_sft.py)
]


def flaky_program(bad_seed: int) -> str:
  """A starter whose reset fails for one seed: the reset seed of pool slot 0 at step 0."""
  code = starters.code("target_number.py")
  return code.replace("    def reset(self, seed=None):\n", "    def reset(self, seed=None):\n"
                      f"        if seed == {bad_seed}:\n"
                      "            raise RuntimeError('broken for this seed')\n", 1)


def programs_dir(path) -> str:
  """Sorted: a_ (admitted at step 0, never starts at step 0), b_ (good), c_ (does not compile).
  Step 0 replays a_, b_ into slots 0, 1; step 2 replays b_, c_ and then b_ again for slot 1."""
  os.makedirs(path, exist_ok=True)
  files = {"a_flaky.py": flaky_program(seeds.derive(SEED, 0, seeds.RESET, 0)),
           "b_good.py": starters.code("knapsack.py"),
           "c_broken.py": "class BrokenEnv(:\n    pass\n"}
  for name, text in files.items():
    with open(os.path.join(path, name), "w") as f:
      f.write(text)
  return str(path)


def _config(programs: str, **extra):
  c = config_lib.load("configs/spade.py:local")
  config_lib.override(c, OVERRIDES + [f"designer.programs={programs}"] +
                      [f"{k}={v}" for k, v in extra.items()])
  train.validate(c)
  return c


def _tokenizer():
  from spade_jax import gguf_io
  return tok_lib.load_tokenizer(gguf_io.embedded_gguf_path("smollm2-135m"))


def _mesh_rules(c):
  from spade_jax import sharding
  return sharding.make_mesh(c.mesh.to_dict()), c.rules.to_dict()


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "device_waits_on_host_frac"}
          for r in rows]


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
  return programs_dir(tmp_path_factory.mktemp("programs"))


@pytest.fixture(scope="module")
def full_run_logged(tmp_path_factory, programs):
  """The run, with what reached the learner and what the agent was shown recorded."""
  workdir = str(tmp_path_factory.mktemp("full"))
  lines, packed, first_turns, later_turns = [], [], [], []
  pack, first, user = batch_lib.pack, prompts.agent_first_turn, tok_lib.user_turn_tokens
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(batch_lib, "pack", lambda s, *a, **k: packed.append(list(s)) or pack(s, *a, **k))
    mp.setattr(prompts, "agent_first_turn",
               lambda obs, hint=None: first_turns.append(hint) or first(obs, hint))
    mp.setattr(tok_lib, "user_turn_tokens",
               lambda tok, obs, a: later_turns.append(obs) or user(tok, obs, a))
    host = loop.run(_config(programs), workdir, log=lines.append)
  return workdir, host, lines, {"packed": packed, "first": first_turns, "later": later_turns}


@pytest.fixture(scope="module")
def full_run(full_run_logged):
  return full_run_logged[:2]


def test_the_designer_path_admits_hints_remembers_pays_and_trains(full_run_logged):
  workdir, host, lines, seen = full_run_logged
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert [r["regen"] for r in rows] == [True, False, True]
  r0, r1, r2 = rows
  assert (r0["designer_attempts"], r0["designer_admitted"]) == (2, 2)  # a_ and b_
  assert r2["designer_admitted"] == 2 and r2["designer_rejections"]  # c_ rejected, with why
  assert sum(r2["designer_rejections"].values()) == r2["designer_attempts"] - 2
  assert r0["designer_hinted"] >= 1 and r0["hinted_start_failed"] == 2  # a_'s hinted plays
  # a_'s plays fail to start at step 0: the group is dropped, the run goes on.
  assert r0["envs_start_failed"] == 1 and r0["episodes"] == 2
  assert r1["envs_start_failed"] == 0 and r1["episodes"] == 4  # other seeds work
  # The window of step 0 is paid at step 2 (= 0 + k), not before; a_ was never measured.
  assert "designer_paid" not in r0 and "designer_paid" not in r1
  assert (r2["designer_paid"], r2["designer_unmeasured"]) == (1, 1)
  assert r2["designer_trained"] == 1 and r2["designer_unpaid"] == 2  # last window: unfinished
  assert {"designer_reward_mean", "designer_regret_mean", "designer_anchor_mean"} <= set(r2)
  for r in rows:
    assert np.isfinite(r["loss"]) and r["skipped"] == 0.0 and r["tokens_trained"] > 0
    assert r["starter_envs"] == 0 and r["starter_trained"] == 0
  # What reached the learner: agent samples at the agent's temperature, the paid designer
  # sample (first in the batch) at the designer's, with the behaviour log-probs of its replay.
  step2 = seen["packed"][2]
  assert step2[0].role == records.DESIGNER and step2[0].temperature == DESIGNER_T
  assert step2[0].env_id.startswith("s00000-01-")  # b_ of step 0, slot 1
  assert any(x != 0.0 for x in step2[0].logp) and step2[0].advantage == 0.0  # alone in skill
  # Trained: exactly the reply (the program as the designer writes it, through its stop token).
  reply = tok_lib.reply_tokens(_tokenizer(), [{"role": "user", "content": "x"}],
                               prompts.designer_reply(starters.code("knapsack.py")))
  mask = step2[0].mask
  assert mask.count(1) == len(reply) and mask[-len(reply):] == (1,) * len(reply)
  assert tuple(step2[0].tokens[-len(reply):]) == tuple(reply)
  assert all(lp == 0.0 for lp, m in zip(step2[0].logp, mask) if not m)
  assert all(s.temperature == AGENT_T for b in seen["packed"] for s in b
             if s.role == records.AGENT)
  # The hint goes into the first observation of a hinted play only.
  assert any(h for h in seen["first"]) and not any("HINT:" in o for o in seen["later"])
  # Memory: one record for b_ at step 0 (a_ had no plays at offset 0), one per new env at 2.
  mem = json.load(open(os.path.join(workdir, "memory.json")))
  assert [m["step"] for m in mem][:1] == [0] and all(
      {"win_rate", "regret"} <= set(m) for m in mem)
  assert all(isinstance(m["win_rate"], float) for m in mem)
  card = json.load(open(os.path.join(workdir, "pool", mem[0]["env_id"] + ".json")))
  assert card["source"] == "designer" and card["win_rate"] == mem[0]["win_rate"]
  assert host.step == 3 and host.window is None
  assert any(x.startswith("corpus: built-in") and "documents" in x for x in lines)
  assert any(x.startswith("designer: replaying 3 programs") for x in lines)


def test_run_leaves_pictures_a_report_that_shows_them_and_progress(full_run_logged):
  workdir, _, lines, _ = full_run_logged
  pngs = sorted(os.listdir(os.path.join(workdir, "plots")))
  assert pngs == ["agent.png", "designer_admission.png", "designer_reward.png", "learner.png",
                  "time.png"]
  for n in pngs:
    with open(os.path.join(workdir, "plots", n), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  report = open(os.path.join(workdir, "report.md")).read()  # written by the loop itself
  assert sorted(re.findall(r"\]\(plots/([^)]+)\)", report)) == pngs
  assert [x.split("  ")[0] for x in lines if x.startswith("step ")] == ["step 1/3", "step 2/3",
                                                                         "step 3/3"]
  assert sum(x.startswith("  unhinted plays: done (") for x in lines) == 3
  assert sum(x.startswith("compiling learner step") for x in lines) == 1
  assert not [x for x in lines if x.startswith("plots:")]  # no picture failed


def test_killed_run_resumes_exactly(full_run, programs, tmp_path):
  workdir_full, _ = full_run
  workdir = str(tmp_path / "resumed")

  class Killed(Exception):
    pass

  def kill_after_step_2(msg):
    if msg.startswith("step 2/"):
      raise Killed()

  with pytest.raises(Killed):
    loop.run(_config(programs), workdir, log=kill_after_step_2)
  assert len(_rows(workdir)) == 2
  loop.run(_config(programs), workdir, log=lambda *_: None)  # the same command again
  assert _rows(workdir) == _rows(workdir_full)  # the window ledger came back: step 2 pays
  cards = lambda w: {n: json.load(open(os.path.join(w, "pool", n)))  # noqa: E731
                     for n in os.listdir(os.path.join(w, "pool")) if n.endswith(".json")}
  assert cards(workdir) == cards(workdir_full)  # the same corpus documents, in order
  c = _config(programs)
  mesh, rules = _mesh_rules(c)
  _, p_full, _ = ckpt_lib.load_params(os.path.join(workdir_full, "checkpoints"), mesh, rules)
  _, p_res, _ = ckpt_lib.load_params(os.path.join(workdir, "checkpoints"), mesh, rules)
  for a, b in zip(jax.tree.leaves(p_full), jax.tree.leaves(p_res)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_reference_policy_only_when_kl_is_on(programs):
  """beta = 0 keeps no reference copy; the scorer gives the learner's own log-probs."""
  from spade_jax import learner as learner_lib
  from spade_jax import loading

  c = _config(programs)
  mesh, rules = _mesh_rules(c)
  m = loading.load_model("random:tiny", mesh, rules, tokenizer=False)
  lrn = learner_lib.make_learner(m.cfg, loop.learner_config(c), mesh, rules)
  scorer = loop.PolicyScorer(lrn)
  batch = {"tokens_BT": np.arange(16, dtype=np.int32).reshape(2, 8) % 200,
           "temperature_B": np.array([0.6, 1.0], np.float32),
           "loss_mask_BT": np.array([[0] * 3 + [1] * 5, [0] * 2 + [1] * 3 + [0] * 3], np.float32)}
  got = scorer.tokens(m.params, batch)
  want = np.asarray(learner_lib.score(m.params, batch, m.cfg, 256)[0]) * batch["loss_mask_BT"]
  assert got.shape == (2, 8) and np.all(got[batch["loss_mask_BT"] == 0] == 0)
  # Jitted and op-by-op float32 differ in reduction order: log-probs of magnitude ~5 (vocab 256)
  # agree to a few ulps (~1e-6), so 1e-5 is tight and deterministic.
  np.testing.assert_allclose(got, np.asarray(want), atol=1e-5)
  # A completion's log-probs from its start are the same positions of the full-row scoring.
  parts = scorer(m.params, [list(batch["tokens_BT"][0]), list(batch["tokens_BT"][1][:5])],
                 [3, 2], 0.6)
  np.testing.assert_allclose(parts[0], got[0, 3:], atol=1e-5)
  assert parts[1].shape == (3,)


def test_fixed_grpo_trains_on_the_admitted_pool_and_names_the_rejected(tmp_path):
  pool_dir = tmp_path / "pool"
  pool_dir.mkdir()
  for name in ("knapsack.py", "maze_walk.py", "code_breaker.py"):
    (pool_dir / name).write_text(starters.code(name))
  (pool_dir / "zz_broken.py").write_text("class BrokenEnv(:\n    pass\n")
  lines = []
  c = config_lib.load("configs/spade.py:local")
  config_lib.override(c, OVERRIDES + ["method=fixed_grpo", f"fixed_pool={pool_dir}",
                                      "total_steps=2"])
  train.validate(c)
  workdir = str(tmp_path / "run")
  host = loop.run(c, workdir, log=lines.append)
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [0, 1]
  for r in rows:
    assert "designer_attempts" not in r and r["designer_trained"] == 0
    assert r["pool_size"] == 2 and r["agent_trained"] == 4 and r["starter_envs"] == 0
  fixed = json.load(open(os.path.join(workdir, "fixed_pool.json")))
  assert len(fixed["admitted"]) == 3
  assert [(x["name"], x["check"]) for x in fixed["rejected"]] == [("zz_broken.py", "compile")]
  assert any(x.startswith("fixed pool: rejected zz_broken.py (compile") for x in lines)
  # The last step's two environments, drawn from the admitted three.
  assert {cd.source for cd in host.pool} == {records.FIXED} and len(host.pool) == 2
  assert {cd.env_id for cd in host.pool} <= set(fixed["admitted"])


def test_fixed_rlve_plays_family_instances_and_counts_them_in_the_controller(tmp_path):
  c = config_lib.load("configs/spade.py:local")
  config_lib.override(c, OVERRIDES + ["method=fixed_rlve", "total_steps=2", "rlve.tau_num=2",
                                      "rlve.families=('prime_factors', 'robot_heading')"])
  train.validate(c)
  workdir = str(tmp_path / "run")
  host = loop.run(c, workdir, log=lambda *_: None)
  rows = _rows(workdir)
  assert [r["rlve_levels_played"] for r in rows] == [[1, 1], [1, 1]]
  assert [r["rlve_level_max"] for r in rows] == [1.0, 1.0]  # a random policy wins nothing
  assert all("designer_attempts" not in r and r["agent_trained"] == 4 for r in rows)
  assert {cd.source for cd in host.pool} == {records.FAMILY}
  # Every play of both steps was counted at its family and level (2 steps x 2 plays, 0 wins).
  assert {n: rlve.accuracy(host.rlve, n, 1) for n in ("prime_factors", "robot_heading")} == {
      "prime_factors": (0.0, 4), "robot_heading": (0.0, 4)}
