"""The self-play loop end to end with a tiny random model, and exact resume after a kill."""

import json
import os
import re

import numpy as np
import pytest

import jax

from spade_jax import checkpoint as ckpt_lib
from spade_jax import config as config_lib
from spade_jax import train
from spade_jax.selfplay import loop

OVERRIDES = [
    "model=random:tiny_smollm2", "tokenizer=smollm2-135m", "total_steps=3", "k=2",
    "envs_per_regen=2", "plays_per_env=2", "hinted_plays=2", "attempts_per_slot=2",
    "global_batch=8", "env.max_turns=2", "agent.max_new_tokens=8", "designer.max_new_tokens=24",
    "hint.max_new_tokens=8", "corpus.max_words=40", "agent_context=4096", "optim.lr=1e-3",
    "optim.remat=false", "env.step_timeout_s=60.0", "mesh.data=1",
]


def _config(**extra):
  c = config_lib.load("configs/spade.py:local")
  config_lib.override(c, OVERRIDES + [f"{k}={v}" for k, v in extra.items()])
  train.validate(c)
  return c


def _mesh_rules(c):
  from spade_jax import sharding
  return sharding.make_mesh(c.mesh.to_dict()), c.rules.to_dict()


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "device_waits_on_host_frac"}
          for r in rows]


@pytest.fixture(scope="module")
def full_run_logged(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("full"))
  lines = []
  host = loop.run(_config(), workdir, log=lines.append)
  return workdir, host, lines


@pytest.fixture(scope="module")
def full_run(full_run_logged):
  return full_run_logged[:2]


def test_two_windows_reject_garbage_train_on_starters_and_write_outputs(full_run):
  workdir, host = full_run
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert [r["regen"] for r in rows] == [True, False, True]
  for r in (rows[0], rows[2]):  # two regeneration windows
    assert r["designer_attempts"] >= 2
    # A random model writes no valid program: every attempt is rejected, with a reason.
    assert r["designer_admitted"] == 0 and sum(r["designer_rejections"].values()) == r[
        "designer_attempts"]
    assert r["starter_envs"] == 2  # the agent is kept busy on starter environments
  for r in rows:
    assert r["episodes"] == 4 and r["agent_trained"] == 4 and r["episode_errors"] == {}
    assert np.isfinite(r["loss"]) and r["skipped"] == 0.0
    assert r["tokens_trained"] > 0
  cards = sorted(os.listdir(os.path.join(workdir, "pool")))
  assert any(c.endswith(".py") for c in cards) and any(c.endswith(".json") for c in cards)
  card = json.load(open(os.path.join(workdir, "pool", [c for c in cards if c.endswith(".json")][0])))
  assert {"skill", "hint", "doc_id", "step", "source"} <= set(card)
  assert os.path.exists(os.path.join(workdir, "memory.json"))
  assert os.listdir(os.path.join(workdir, "tensorboard"))
  assert host["step"] == 3 and host["window"] is None  # the last window was flushed


def test_run_leaves_pictures_a_report_that_shows_them_and_progress(full_run_logged):
  workdir, _, lines = full_run_logged
  pngs = sorted(os.listdir(os.path.join(workdir, "plots")))
  # No designer program is admitted, so no window pays a designer reward to plot.
  assert pngs == ["agent.png", "designer_admission.png", "learner.png", "time.png"]
  for n in pngs:
    with open(os.path.join(workdir, "plots", n), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  report = open(os.path.join(workdir, "report.md")).read()  # written by the loop itself
  assert sorted(re.findall(r"\]\(plots/([^)]+)\)", report)) == pngs
  assert [x.split("  ")[0] for x in lines if x.startswith("step ")] == ["step 1/3", "step 2/3",
                                                                         "step 3/3"]
  assert sum(x.startswith("  unhinted plays: done (4/4 episodes") for x in lines) == 3
  assert sum(x.startswith("compiling learner step") for x in lines) == 1
  assert not [x for x in lines if x.startswith("plots:")]  # no picture failed


def test_killed_run_resumes_exactly(full_run, tmp_path):
  workdir_full, _ = full_run
  workdir = str(tmp_path / "resumed")
  c = _config()

  class Killed(Exception):
    pass

  def kill_after_step_2(msg):
    if msg.startswith("step 2/"):
      raise Killed()

  with pytest.raises(Killed):
    loop.run(c, workdir, log=kill_after_step_2)
  assert len(_rows(workdir)) == 2
  loop.run(_config(), workdir, log=lambda *_: None)  # the same command again
  assert _rows(workdir) == _rows(workdir_full)
  mesh, rules = _mesh_rules(c)
  _, p_full, _ = ckpt_lib.load_params(os.path.join(workdir_full, "checkpoints"), mesh, rules)
  _, p_res, _ = ckpt_lib.load_params(os.path.join(workdir, "checkpoints"), mesh, rules)
  for a, b in zip(jax.tree.leaves(p_full), jax.tree.leaves(p_res)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_config_validation_names_every_problem():
  c = config_lib.load("configs/spade.py:local")
  config_lib.override(c, ["k=0", "reward.variant=vibes", "agent.top_p=0"])
  with pytest.raises(ValueError) as e:
    train.validate(c)
  msg = str(e.value)
  assert "k must be positive" in msg and "reward.variant 'vibes'" in msg and "agent:" in msg
  c = config_lib.load("configs/spade.py:qwen3_4b")
  with pytest.raises(ValueError, match="model is empty"):
    train.validate(c)


def test_reference_policy_only_when_kl_is_on():
  """beta = 0 keeps no reference copy and runs no reference pass; beta > 0 scores the batch
  under the frozen initial policy (equal to the learner's own scoring at step 0)."""
  from spade_jax import learner as learner_lib
  from spade_jax import loading

  c = _config()
  mesh, rules = _mesh_rules(c)
  m = loading.load_model("random:tiny", mesh, rules, tokenizer=False)
  lrn = learner_lib.make_learner(m.cfg, loop.learner_config(c), mesh, rules)
  assert loop._reference_scorer(c, lrn, m.params) is None
  config_lib.override(c, ["rl.kl_beta=0.005"])
  lrn = learner_lib.make_learner(m.cfg, loop.learner_config(c), mesh, rules)
  ref = loop._reference_scorer(c, lrn, m.params)
  batch = {"tokens_BT": np.arange(16, dtype=np.int32).reshape(2, 8) % 200,
           "temperature_B": np.array([0.6, 1.0], np.float32)}
  got = ref(batch)
  want = learner_lib.score(m.params, batch, m.cfg, 256)[0]
  assert got.shape == (2, 8)
  np.testing.assert_allclose(got, np.asarray(want), atol=1e-6)
