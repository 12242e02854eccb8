"""The warm start: the SFT loss is the hand-computed cross-entropy of the masked tokens and
nothing else, micro-batches add up to the batch, solution transcripts train exactly the replies
and win when replayed, designer examples are the real designer prompt, the held-out suite is
never a source, and a one-step run leaves a checkpoint that loads as a model SPEC."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import actions as actions_lib
from spade_jax import learner as learner_lib
from spade_jax import loading, sft, sft_data, sft_loop, sharding
from spade_jax import model as model_lib
from spade_jax import tokenizer as tok_lib
from spade_jax.sandbox import starters
from spade_jax.sandbox.contract import extract_code
from spade_jax.sandbox.pool import Pool
from spade_jax.selfplay import progress as progress_lib
from spade_jax.selfplay import prompts

CFG = model_lib.PRESETS["tiny"]
SFT = learner_lib.LearnerConfig(lr=1e-3, objective="sft")
B, T = 4, 12


@pytest.fixture(scope="module")
def tok():
  from spade_jax import gguf_io
  return tok_lib.load_tokenizer(gguf_io.embedded_gguf_path("smollm2-135m"))


@pytest.fixture(scope="module")
def pool():
  with Pool(workers=2) as p:
    yield p


def make_batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = (rng.random((B, T)) > 0.5).astype(np.float32)
  mask[:, 0] = 0.0
  mask[:, 1] = 1.0
  mask[2] = 0.0  # an empty row (batch padding)
  mask[:, -3:] = 0.0  # trailing positions no trained token reads: an observation, padding
  return {"tokens_BT": rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32),
          "loss_mask_BT": mask, "temperature_B": np.ones((B,), np.float32)}


def hand_loss(params, batch):
  logits = np.asarray(model_lib.forward(params, jnp.asarray(batch["tokens_BT"]), CFG), np.float64)
  logits -= logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  tokens, mask = batch["tokens_BT"], batch["loss_mask_BT"]
  per_sample = []
  for b in range(B):
    nll = [-logp[b, t - 1, tokens[b, t]] for t in range(1, T) if mask[b, t]]
    if nll:
      per_sample.append(np.mean(nll))
  return np.mean(per_sample)


def sft_loss_of(params, batch, cfg=SFT):
  n = jnp.float32(np.sum(batch["loss_mask_BT"].sum(1) > 0))
  b = {k: jnp.asarray(v) for k, v in batch.items()}
  return jax.jit(lambda p: learner_lib.loss_fn(p, b, n, CFG, cfg)[0])(params)


def test_sft_loss_is_the_hand_computed_cross_entropy():
  params = model_lib.init_params(CFG, jax.random.key(1))
  batch = make_batch()
  np.testing.assert_allclose(sft_loss_of(params, batch), hand_loss(params, batch), rtol=1e-5)


def test_masked_positions_do_not_contribute():
  # d loss / d logp: exactly 0 where the mask is 0, -1 / (row tokens * samples) where it is 1.
  mask = jnp.asarray(make_batch()["loss_mask_BT"])
  logp = jnp.asarray(np.random.default_rng(1).normal(size=(B, T)), jnp.float32)
  g = jax.grad(lambda lp: learner_lib.sft_loss(lp, mask, 3.0)[0])(logp)
  n_tok = np.asarray(mask).sum(1, keepdims=True)
  want = np.where(np.asarray(mask) > 0, -1.0 / np.maximum(n_tok, 1) / 3.0, 0.0)
  np.testing.assert_allclose(g, want, rtol=1e-6)
  garbage = jnp.where(mask > 0, logp, jnp.nan)  # masked log-probs may hold anything
  assert learner_lib.sft_loss(garbage, mask, 3.0)[0] == learner_lib.sft_loss(logp, mask, 3.0)[0]
  # Through the model: targets changed only where the mask is 0 (and nothing trained reads
  # them) leave the loss and its gradient exactly as they were.
  params = model_lib.init_params(CFG, jax.random.key(2))
  batch = make_batch(3)
  other = dict(batch, tokens_BT=batch["tokens_BT"].copy())
  other["tokens_BT"][:, -3:] = (other["tokens_BT"][:, -3:] + 7) % CFG.vocab_size
  other["tokens_BT"][2] = (other["tokens_BT"][2] + 11) % CFG.vocab_size  # the empty row
  grad = lambda b: jax.jit(jax.grad(lambda p: learner_lib.loss_fn(  # noqa: E731
      p, {k: jnp.asarray(v) for k, v in b.items()}, jnp.float32(3), CFG, SFT)[0]))(params)
  for a, b in zip(jax.tree.leaves(grad(batch)), jax.tree.leaves(grad(other))):
    np.testing.assert_array_equal(a, b)
  # ... while a trained target does change it.
  moved = dict(batch, tokens_BT=batch["tokens_BT"].copy())
  moved["tokens_BT"][0, 1] = (moved["tokens_BT"][0, 1] + 1) % CFG.vocab_size
  assert sft_loss_of(params, moved) != sft_loss_of(params, batch)


def test_sft_config_refuses_what_it_does_not_take():
  for bad in (dict(kl_beta=0.1), dict(minibatches=2), dict(objective="dpo")):
    with pytest.raises(ValueError, match="objective"):
      learner_lib.LearnerConfig(**{"objective": "sft", **bad})


def test_micro_batches_add_up_to_the_full_batch():
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  params = sharding.init_sharded(CFG, jax.random.key(4), mesh, sharding.DEFAULT_RULES)
  batch = make_batch(5)
  out = []
  for micro in (0, 2):
    lrn = learner_lib.make_learner(CFG, learner_lib.LearnerConfig(
        lr=1e-3, objective="sft", micro_batch=micro), mesh)
    state, m = lrn.train_step(lrn.init_state(jax.tree.map(jnp.copy, params)), batch)
    out.append((jax.tree.map(np.asarray, state.opt_state[1][0].mu), m))
  (mu_full, m_full), (mu_micro, m_micro) = out
  np.testing.assert_allclose(m_micro["loss"], m_full["loss"], rtol=1e-6)
  np.testing.assert_allclose(m_full["loss"], hand_loss(params, batch), rtol=1e-5)
  for k in ("nll_token_mean", "tokens", "samples", "grad_norm"):
    np.testing.assert_allclose(m_micro[k], m_full[k], rtol=1e-5, err_msg=k)
  scale = max(np.abs(x).max() for x in jax.tree.leaves(mu_full))
  for a, b in zip(jax.tree.leaves(mu_full), jax.tree.leaves(mu_micro)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)


def _runs(mask):
  """(start, end) of each run of 1s."""
  m = np.r_[0, np.asarray(mask), 0]
  d = np.diff(m)
  return list(zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1)))


def test_solution_transcript_trains_exactly_the_replies_and_wins(tok, pool):
  src = sft_data.Source("starter:target_number", "Mathematical_Reasoning",
                        starters.code("target_number.py"))
  (play,) = sft_data.play_solutions(pool, [src], 1, 25, "I will try {action}.", seed=3)
  assert play.won and len(play.replies) >= 3
  t = sft_data.agent_transcript(tok, play.observations, play.replies)
  runs = _runs(t.mask)
  assert len(runs) == len(play.replies)
  first = tok_lib.start(tok, prompts.agent_first_turn(play.observations[0]))
  assert t.tokens[:len(first)] == first.tokens and runs[0][0] == len(first)
  end = tok.convert_ids_to_tokens(t.tokens[runs[0][1] - 1])
  for i, ((a, b), reply) in enumerate(zip(runs, play.replies)):
    assert tok.decode(list(t.tokens[a:b])) == reply + end  # the reply through its stop token
    assert reply.startswith("I will try ") and actions_lib.last_boxed(reply)
    if i:  # the observation before it, as a user turn
      assert play.observations[i] in tok.decode(list(t.tokens[runs[i - 1][1]:a]))
  assert runs[-1][1] == len(t)  # nothing after the last reply: the episode ended there
  # The actions the agent's episode would send, read back out of the trained tokens, win.
  acts = [actions_lib.boxed_action(tok.decode(list(t.tokens[a:b]))) for a, b in runs]
  replies = pool.play(src.code, play.seed, acts)
  assert replies[-1].terminated and replies[-1].reward >= 1.0 and len(replies) == len(acts) + 1


def test_solution_plays_keep_only_wins_within_the_turn_limit(pool):
  src = sft_data.Source("starter:maze_walk", "Spatial_Reasoning", starters.code("maze_walk.py"))
  plays = sft_data.play_solutions(pool, [src], 4, 2, "{action}", seed=0)
  assert {p.end for p in plays} == {"too_many_turns"}  # every maze takes more than 2 moves
  broken = sft_data.Source("x", "", "class BrokenEnv(:\n  pass\n")
  assert sft_data.play_solutions(pool, [broken], 1, 5, "{action}", 0)[0].end == "start_failed"


def test_designer_example_is_the_real_designer_prompt_answered_with_the_program(tok):
  src = sft_data.Source("starter:knapsack", "Optimization", starters.code("knapsack.py"))
  doc = "A knapsack problem asks which items of given weights and values to pack."
  for memory in ("empty", "starter"):
    t = sft_data.designer_transcript(tok, src, doc, memory, 3)
    shots = sft_data.few_shot(src.skill, src.code) if memory == "starter" else []
    assert (memory == "starter") == bool(shots) and src.code not in shots
    messages = prompts.designer(src.skill, doc, prompts.memory_block([], [], shots), 3)
    prompt = tok_lib.start(tok, messages)
    assert t.tokens[:len(prompt)] == prompt.tokens and not any(t.mask[:len(prompt)])
    assert all(t.mask[len(prompt):])
    reply = tok.decode(list(t.tokens[len(prompt):]), skip_special_tokens=True)
    assert reply == prompts.designer_reply(src.code)
    assert extract_code(reply).strip() == src.code.strip()


def test_designer_order_takes_every_program_before_a_second_level():
  srcs = ([sft_data.Source(f"family:f{i}@{lv}", "Optimization", f"# f{i} {lv}")
           for i in range(3) for lv in (1, 2)] + [sft_data.Source("starter:s", "", "# s")])
  order = sft_data.designer_order(srcs, "mixed", seed=1)
  assert len(order) == 6  # the program without a skill gives agent examples only
  assert {sft_data.base_name(s) for s, _ in order[:3]} == {"family:f0", "family:f1", "family:f2"}
  assert [m for _, m in order[:2]] == ["empty", "starter"]


def test_heldout_suite_is_never_a_source(tmp_path):
  held = tmp_path / "heldout"
  held.mkdir()
  program = starters.code("switchboard.py").replace("Causal", "Causal ")
  (held / "secret.py").write_text(program)
  assert sft_data.check_dirs([str(held)], str(held))
  assert sft_data.check_dirs([str(tmp_path)], str(held))  # a directory above it
  with pytest.raises(sft_data.DataError, match="held-out"):
    sft_data.sources(False, False, (), [str(held)], heldout_dir=str(held))
  copy = tmp_path / "mine"
  copy.mkdir()
  (copy / "renamed.py").write_text(program)  # the same program elsewhere
  with pytest.raises(sft_data.DataError, match="copies of held-out"):
    sft_data.sources(False, False, (), [str(copy)], heldout_dir=str(held))
  # The real suite: refused by the config check, and disjoint from the default sources.
  with pytest.raises(ValueError, match="held-out"):
    sft.config("configs/sft.py:local", [f"data.dirs=('{sft_data.HELDOUT_DIR}',)"])
  if os.path.isdir(sft_data.HELDOUT_DIR):
    held_real = sft_data.heldout_digests()
    assert held_real
    default = sft_data.sources(True, True, (1, 2, 3), log=lambda m: None)
    assert not held_real & {sft_data._digest(s.code) for s in default}


def test_cli_help_print_config_and_one_line_errors(capsys):
  with pytest.raises(SystemExit) as e:
    sft.main(["--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "local" in out and "qwen3_4b" in out
  sft.main(["--print_config", "--config.batch=4"])
  assert "batch: 4" in capsys.readouterr().out
  with pytest.raises(SystemExit) as e:
    sft.main(["--workdir=/tmp/never", "--config.data.designer_share=1.5"])
  assert "designer_share" in str(e.value.code) and "Traceback" not in str(e.value.code)
  with pytest.raises(SystemExit) as e:
    sft.main(["--workdir=/tmp/never", "--config.no_such_key=1"])
  assert "unknown key" in str(e.value.code)


def test_one_step_run_writes_a_checkpoint_that_is_a_model_spec(tmp_path):
  c = sft.config("configs/sft.py:local", [
      "model=random:tiny_smollm2", "tokenizer=smollm2-135m", "dtype=float32", "batch=16",
      "data.families=false", "data.seeds_per_env=1", "data.max_turns=25", "data.max_len=4096",
      "data.designer_share=0.1", "data.designer_max_len=4096", "length_multiple=64",
      "corpus.max_words=20"])
  workdir = str(tmp_path / "w")
  lines = []
  done = sft_loop.run(c, workdir, progress_lib.Progress(log=lines.append))
  assert done["steps"] == 1 and done["data"]["designer_examples"] == 1
  assert done["data"]["agent_examples"] == len(starters.STARTERS)
  assert any("sft step 1/1" in x and "eta" in x for x in lines)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (row,) = [json.loads(x) for x in f]
  assert np.isfinite(row["loss"]) and row["rows"] == done["data"]["agent_examples"] + 1
  m = loading.load_model(done["spec"])
  assert m.tokenizer is not None and m.cfg.vocab_size == 49152
  ref = loading.load_model("random:tiny_smollm2")  # the same seed: the step moved the weights
  assert not np.allclose(m.params["embed"], ref.params["embed"])
  # A finished run is taken as it is; a lost marker resumes from the last checkpoint (no step
  # left, nothing trained twice).
  assert sft.ensure(c, workdir) == done["spec"]
  os.remove(os.path.join(workdir, sft.DONE))
  again = sft_loop.run(c, workdir, progress_lib.quiet())
  assert again["steps"] == 1 and again["spec"] == done["spec"]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    assert len(f.readlines()) == 1
  other = sft.config("configs/sft.py:local", ["model=random:tiny_smollm2",
                                              "tokenizer=smollm2-135m", "batch=4"])
  with pytest.raises(ValueError, match="another config"):
    sft.ensure(other, workdir)
  shutil.rmtree(workdir)


def test_selfplay_warm_start_is_made_once_then_taken_from_the_cache(tmp_path, monkeypatch):
  from spade_jax import config as config_lib
  from spade_jax import train

  monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path / "cache"))
  small = ("dtype=float32", "data.families=false", "data.seeds_per_env=1",
           "data.designer_share=0", "max_steps=1", "length_multiple=64")
  c = config_lib.build("configs/spade.py:local", [
      "model=random:tiny_smollm2", "tokenizer=smollm2-135m",
      f"warm_start.overrides={small!r}"])
  train.validate(c)
  lines = []
  spec = sft.warm_start(c, str(tmp_path / "run"), progress_lib.Progress(log=lines.append))
  sc, where = sft.for_selfplay(c.warm_start, c.model, c.tokenizer)
  assert where == str(tmp_path / "cache" / "warm_starts" / sft.digest(sc))
  assert spec == os.path.join(where, "checkpoints") and sc.model == "random:tiny_smollm2"
  assert any(x.startswith("warm start: configs/sft.py:local from random:tiny_smollm2")
             for x in lines)
  assert any("sft step 1/1" in x for x in lines) and any("made in" in x for x in lines)
  assert loading.load_model(spec).tokenizer is not None
  again = []
  run = str(tmp_path / "run")
  assert sft.warm_start(c, run, progress_lib.Progress(log=again.append)) == spec
  assert len(again) == 1 and "cached" in again[0] and not any("sft step" in x for x in again)
  from spade_jax.selfplay import outputs
  (line,) = [x for x in outputs.report(run, "").splitlines() if x.startswith("- warm start")]
  assert "1 SFT steps" in line and "(cached)" in line and spec in line
  # Another model (or SFT override) is another warm start; no warm start is the model itself.
  other = config_lib.build("configs/spade.py:local", [
      "model=random:tiny_smollm2", "tokenizer=smollm2-135m",
      f"warm_start.overrides={small + ('optim.lr=1e-4',)!r}"])
  assert sft.for_selfplay(other.warm_start, other.model, other.tokenizer)[1] != where
  off = config_lib.build("configs/spade.py:local", ["warm_start.config="])
  assert sft.warm_start(off, str(tmp_path / "off"), progress_lib.quiet()) == "smollm2-135m"


def test_selfplay_config_names_a_bad_warm_start():
  from spade_jax import config as config_lib
  from spade_jax import train

  cases = [(["warm_start.overrides=('max_steps=-1',)"],
            r"warm_start \(configs/sft.py:local\): max_steps must be >= 0"),
           (["warm_start.overrides=('no_such=1',)"], "warm_start .*no_such"),
           (["warm_start.config=configs/sft.py:nope"], "warm_start .*nope"),
           (["warm_start.config=", "warm_start.dir=/tmp/x"], "warm_start.config is empty")]
  for overrides, match in cases:
    with pytest.raises(ValueError, match=match):
      train.validate(config_lib.build("configs/spade.py:local", overrides))
