"""eval/envs.py: environment suites as benchmarks — rows and losses with a tiny random model, a
program that does not compile, the oracle's solution() play, rescore, reset seeds, bad dirs."""

import json
import os
import shutil

import pytest

from spade_jax import gguf_io, sampling
from spade_jax import tokenizer as tok_lib
from spade_jax.eval import benchmarks, envs, run, samples
from spade_jax.sandbox import starters
from spade_jax.sandbox.contract import Reply, Status
from spade_jax.selfplay import episodes, prompts
from tests.test_selfplay_episodes import ScriptedPool, ScriptedSampler

TWO = ("next_term.py", "target_number.py")
BROKEN = "class BrokenEnv(:\n    pass\n"
NO_SOLUTION = '''
class CountEnv:
    def reset(self, seed=None):
        self.n = 0
        return "Say \\\\boxed{go} three times.", {}

    def step(self, action):
        self.n += "go" in action
        done = self.n >= 3
        return "ok", 1.0 if done else 0.0, done, False, {}
'''
FAST = {"max_turns": 3, "max_new_tokens": 8}  # a few short turns: the test is the plumbing


def _records(out, name):
  return list(samples.read(os.path.join(out, "samples", f"{name}.jsonl")))


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
  """Two starters, one program that does not compile, and a package file that is skipped."""
  d = tmp_path_factory.mktemp("suite")
  for n in TWO:
    shutil.copy(starters.path(n), d / n)
  (d / "broken.py").write_text(BROKEN)
  (d / "__init__.py").write_text("")
  return str(d)


@pytest.fixture(scope="module")
def tiny(suite, tmp_path_factory):
  """The tiny random model on the suite twice: once through the CLI's evaluate, once in-process
  through envs.evaluate with a loaded model (the experiment runner's way)."""
  from spade_jax import loading

  cli_out = str(tmp_path_factory.mktemp("cli"))
  summary = run.evaluate("random:tiny_smollm2", benchmarks.select(f"envs:{suite}"), "smoke",
                         cli_out, overrides=FAST, tokenizer="smollm2-135m")
  api_out = str(tmp_path_factory.mktemp("api"))
  loaded = loading.load_model("random:tiny_smollm2", tokenizer=False)
  row = envs.evaluate(loaded, "smollm2-135m", suite, "smoke", out=api_out, overrides=FAST)
  return {"cli": (cli_out, summary), "api": (api_out, row), "name": envs.name_of(suite)}


def test_rows_are_ok_and_a_program_that_does_not_compile_is_a_loss(tiny):
  out, summary = tiny["cli"]
  name = tiny["name"]
  row = summary["benchmarks"][name]
  assert row["status"] == "ok" and row["n"] == 6 and row["problems"] == 3, row
  assert set(row["failed_to_start"]) == {"broken.py"}
  recs = _records(out, name)
  assert len(recs) == 6 and {r["id"] for r in recs} == {"broken.py", *TWO}
  for r in recs:
    c = r["completion"]
    assert c["seed"] == envs.reset_seed(0, r["id"], r["sample"])
    assert r["score"] == float(c["won"]) and r["correct"] == c["won"]
    if r["id"] == "broken.py":
      assert r["score"] == 0.0 and c["end"] == "start_failed" and not c["turns"]
      assert "SyntaxError" in c["error"] and "SyntaxError" in r["error"]
    else:
      assert c["error"] is None and 1 <= len(c["turns"]) <= FAST["max_turns"]
      assert r["messages"][0]["content"].startswith(prompts.AGENT_INSTRUCTION)
      for t in c["turns"]:
        assert isinstance(t["assistant"], str) and isinstance(t["observation"], str)
        assert t["action"] is not None
  md = open(os.path.join(out, "summary.md")).read()
  assert f"| {name} |" in md and "broken.py" in md


def test_reset_seeds_and_episodes_are_the_same_in_two_runs(tiny):
  (cli_out, _), (api_out, row) = tiny["cli"], tiny["api"]
  assert row["name"] == tiny["name"] and row["status"] == "ok" and row["n"] == 6
  key = lambda r: (r["id"], r["sample"])  # noqa: E731
  a = sorted(_records(cli_out, tiny["name"]), key=key)
  b = sorted(_records(api_out, tiny["name"]), key=key)
  assert [key(r) for r in a] == [key(r) for r in b]
  assert [r["completion"]["seed"] for r in a] == [r["completion"]["seed"] for r in b]
  assert [r["completion"] for r in a] == [r["completion"] for r in b]
  assert len({r["completion"]["seed"] for r in a}) == 6  # every episode its own instance


def test_rescore_reproduces_the_score_without_model_or_directory(tiny, tmp_path):
  out, summary = tiny["cli"]
  src = tmp_path / "copy"
  shutil.copytree(out, src)  # the suite's directory plays no part in re-scoring
  re = run.rescore(str(src), str(tmp_path / "re"))
  row = re["benchmarks"][tiny["name"]]
  assert row["score"] == summary["benchmarks"][tiny["name"]]["score"]
  assert row["n"] == 6 and row["changed_verdicts"] == 0
  assert _records(str(tmp_path / "re"), tiny["name"])[0]["messages"] == \
      _records(out, tiny["name"])[0]["messages"]


def test_oracle_wins_every_starter_and_loses_the_broken_program(suite, tmp_path):
  row = envs.evaluate("oracle", None, starters.DIR, "smoke")
  assert row["name"] == "envs:starters" and row["status"] == "ok"
  assert row["score"] == 1.0 and row["n"] == 2 * len(starters.STARTERS)
  row = envs.evaluate("oracle", None, suite, "smoke", out=str(tmp_path))
  assert row["n"] == 6 and row["score"] == pytest.approx(4 / 6)
  won = {r["id"]: r["completion"]["won"] for r in _records(str(tmp_path), row["name"])}
  assert won == {"broken.py": False, **{n: True for n in TWO}}


def test_oracle_names_environments_without_a_solution(tmp_path):
  d = tmp_path / "mixed"
  d.mkdir()
  shutil.copy(starters.path(TWO[0]), d / TWO[0])
  (d / "count.py").write_text(NO_SOLUTION)
  row = envs.evaluate("oracle", None, str(d), "smoke")
  assert row["status"] == "ok" and row["score"] == 1.0 and row["n"] == 2
  assert list(row["unscored"]) == ["count.py"] and "solution()" in row["unscored"]["count.py"]
  os.remove(d / TWO[0])
  row = envs.evaluate("oracle", None, str(d), "smoke")
  assert row["status"] == "unavailable" and "count.py" in row["reason"]
  assert envs.evaluate("empty", None, str(d), "smoke")["score"] == 0.0


def test_empty_wins_nothing_and_a_shared_pool_stays_open():
  from spade_jax.sandbox.pool import Pool

  with Pool(workers=1) as pool:
    row = envs.evaluate("empty", None, starters.DIR, "smoke", overrides={"max_turns": 4},
                        pool=pool)
    assert row["status"] == "ok" and row["score"] == 0.0
    assert row["n"] == 2 * len(starters.STARTERS)
    assert envs.evaluate("oracle", None, starters.DIR, "smoke", pool=pool)["score"] == 1.0


def test_a_missing_or_empty_directory_is_a_clear_error(tmp_path, capsys):
  missing = str(tmp_path / "nope")
  with pytest.raises(ValueError, match=f"envs:{missing}: no such directory"):
    benchmarks.select(f"humaneval,envs:{missing}")
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "__init__.py").write_text("")
  with pytest.raises(ValueError, match="no environment programs"):
    envs.evaluate("oracle", None, str(tmp_path / "empty"))
  out = tmp_path / "out"
  assert run.main(["--model", "oracle", "--benchmarks", f"envs:{missing}", "--out", str(out)]) == 2
  assert "no such directory" in capsys.readouterr().err and not out.exists()


def test_several_suites_in_one_selection(suite, tmp_path):
  other = tmp_path / "other"
  other.mkdir()
  shutil.copy(starters.path(TWO[0]), other / TWO[0])
  picked = benchmarks.select(f"envs:{suite},envs:{other},humaneval")
  assert [b.name for b in picked] == [envs.name_of(suite), "envs:other", "humaneval"]
  twin = tmp_path / "x" / "other"
  twin.mkdir(parents=True)
  shutil.copy(starters.path(TWO[0]), twin / TWO[0])
  with pytest.raises(ValueError, match="also named envs:other"):
    benchmarks.select(f"envs:{other},envs:{twin}")
  out = run.evaluate("oracle", picked[1:2], "smoke", str(tmp_path / "o"))
  assert json.load(open(tmp_path / "o" / "summary.json"))["benchmarks"]["envs:other"]["score"] \
      == out["benchmarks"]["envs:other"]["score"] == 1.0


@pytest.mark.parametrize("reward,terminated,truncated", [
    (1.0, True, False), (0.4, True, False), (1.0, False, True), (0.0, True, False)])
def test_the_check_players_win_rule_is_the_episode_loops(reward, terminated, truncated):
  tok = tok_lib.load_tokenizer(gguf_io.embedded_gguf_path("smollm2-135m"))
  pool = ScriptedPool([(reward, terminated, truncated)])
  sampler = ScriptedSampler(tok_lib.encode(tok, "\\boxed{3}"))
  (e,), _ = episodes.play(pool, sampler, None, tok, [episodes.Group("env", "code", 1)], 1,
                          sampling.Settings(max_new_tokens=8), episodes.Limits(5, 4096), 0)
  reply = Reply(1, 1, Status.OK, reward=reward, terminated=terminated, truncated=truncated)
  assert e.won == envs.won(reply)
