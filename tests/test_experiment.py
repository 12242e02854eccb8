"""The comparison runner: its run table, the commands it gives each run, resume, and the report
(with a stand-in for the processes, so nothing is trained here)."""

import json
import os

import pytest

from spade_jax import config as config_lib
from spade_jax import experiment


def _config(**extra):
  c = config_lib.load("configs/experiments.py:local")
  config_lib.override(c, [f"{k}={v}" for k, v in extra.items()])
  return c


def test_the_run_table_parses_and_names_its_mistakes():
  runs = experiment.parse_runs(_config().runs)
  assert [(r["name"], r["kind"], r["from"]) for r in runs] == [
      ("base", "eval_only", None), ("warm", "sft", None), ("grpo", "train", "warm"),
      ("spade", "train", "warm")]
  assert runs[2]["overrides"] == ["method=fixed_grpo"]
  for table, msg in (("a: from=b x=1", "no earlier line"), ("a: x=1\na: y=2", "twice"),
                     ("just words", "not `name"), ("a: notkv", "KEY=VALUE"), ("", "empty")):
    with pytest.raises(ValueError, match=msg):
      experiment.parse_runs(table)


def test_every_run_gets_the_shared_budget_seed_and_its_start(tmp_path):
  c = _config(overrides="total_steps=7 global_batch=8", seed=3)
  runs = {r["name"]: r for r in experiment.parse_runs(c.runs)}
  model_of = {"base": "smollm2-135m", "warm": str(tmp_path / "runs/warm/checkpoints")}
  cmd = experiment.run_command(runs["grpo"], c, str(tmp_path), model_of)
  assert cmd[1:3] == ["-m", "spade_jax.train"]
  assert f"--config.model={model_of['warm']}" in cmd and "--config.seed=3" in cmd
  assert cmd[-3:] == ["--config.total_steps=7", "--config.global_batch=8",
                      "--config.method=fixed_grpo"]
  # The run's start is its `from=`: the train preset's own warm start is switched off.
  assert "--config.warm_start.config=" in cmd
  sft = experiment.run_command(runs["warm"], c, str(tmp_path), model_of)
  assert sft[2] == "spade_jax.sft" and "--config.model=smollm2-135m" in sft
  assert experiment.run_command(runs["base"], c, str(tmp_path), model_of) is None


def _fake_processes(monkeypatch, calls):
  """Each command "runs": a training run leaves metrics, an evaluation leaves its summary."""

  def fake(cmd, log_path):
    calls.append(cmd[2])
    if cmd[2] == "spade_jax.eval.run":
      out = next(a.split("=", 1)[1] for a in cmd if a.startswith("--out="))
      os.makedirs(out, exist_ok=True)
      score = 0.25 if "smollm2" not in next(a for a in cmd if a.startswith("--model=")) else 0.0
      json.dump({"wall_s": 1.0, "benchmarks": {"envs:heldout": {
          "status": "ok", "score": score, "n": 16, "ci95": [max(0, score - 0.2), score + 0.2]}}},
          open(os.path.join(out, "summary.json"), "w"))
    else:
      out = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
      os.makedirs(out, exist_ok=True)
      if cmd[2] == "spade_jax.sft":  # a made warm start says how long it took
        json.dump({"time_s": 123.0}, open(os.path.join(out, "warm_start.json"), "w"))
      with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for t in range(3):
          f.write(json.dumps({"step": t, "agent_return_mean": 0.1 * t, "loss": 0.5}) + "\n")

  monkeypatch.setattr(experiment, "_sh", fake)


def test_it_resumes_without_rerunning_finished_runs_and_reports(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path / "cache"))
  _fake_processes(monkeypatch, calls)
  c = _config()
  experiment.run_all(c, str(tmp_path))
  assert calls.count("spade_jax.train") == 2 and calls.count("spade_jax.sft") == 1
  assert calls.count("spade_jax.eval.run") == 4
  calls.clear()
  results = experiment.run_all(c, str(tmp_path))  # the same command again
  assert calls == ["spade_jax.eval.run"] * 4  # no training again; evaluations resume themselves
  assert results["runs"]["spade"]["model"].endswith(os.path.join("runs", "spade", "checkpoints"))
  assert results["runs"]["base"]["model"] == "smollm2-135m"
  # The warm start is the cached one a self-play job with the same SFT config takes.
  from spade_jax import sft
  sc = sft.config(c.sft_config, ["model=smollm2-135m", "seed=0"])
  assert results["runs"]["warm"]["model"] == str(tmp_path / "cache" / "warm_starts" /
                                                 sft.digest(sc) / "checkpoints")
  ws = config_lib.load("configs/spade.py:local").warm_start
  assert sft.for_selfplay(ws, "smollm2-135m")[1] == os.path.dirname(
      results["runs"]["warm"]["model"])
  assert results["runs"]["warm"]["wall_s"] == 123.0
  md = open(tmp_path / "results.md").read()
  assert "| spade | warm |" in md and "0.250 [0.050, 0.450] (n=16)" in md
  for png in ("curve_agent_return_mean.png", "curve_loss.png", "heldout.png"):
    assert (tmp_path / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plots/{png}" in md
  assert json.load(open(tmp_path / "results.json"))["runs"]["grpo"]["from"] == "warm"
