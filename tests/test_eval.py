"""eval/: oracle = 1.0 and empty = 0.0 on every offline benchmark, user files, bad input, rescore."""

import json
import os

import pytest

from spade_jax.eval import benchmarks, presets, run, samples, stats
from spade_jax.eval.generation import ModelGenerator, Prompt, Sampling

OFFLINE = [b for b in benchmarks.REGISTRY.values() if b.offline]


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
  """The smoke preset on every offline benchmark, with the oracle and the empty generator."""
  out = {}
  for gen in ("oracle", "empty"):
    d = str(tmp_path_factory.mktemp(gen))
    out[gen] = (d, run.evaluate(gen, OFFLINE, "smoke", d))
  return out


@pytest.mark.parametrize("name", [b.name for b in OFFLINE])
def test_oracle_scores_one_and_empty_scores_zero(checks, name):
  oracle = checks["oracle"][1]["benchmarks"][name]
  empty = checks["empty"][1]["benchmarks"][name]
  assert oracle["status"] == "ok", oracle
  assert oracle["score"] == 1.0 and oracle["n"] > 0
  assert empty["status"] == "ok" and empty["score"] == 0.0 and empty["n"] == oracle["n"]


def test_summary_and_samples_on_disk(checks):
  d, summary = checks["oracle"]
  with open(os.path.join(d, "summary.json")) as f:
    on_disk = json.load(f)
  assert on_disk["benchmarks"].keys() == summary["benchmarks"].keys()
  for name, row in on_disk["benchmarks"].items():
    assert {"score", "n", "stderr", "status"} <= set(row)
    recs = list(samples.read(os.path.join(d, "samples", f"{name}.jsonl")))
    assert len(recs) == row["n"]
    assert all({"messages", "completion", "extracted", "correct"} <= set(r) for r in recs)
  assert "| aime24 | 100.0 |" in open(os.path.join(d, "summary.md")).read()


def test_rescore_reproduces_verdicts_without_a_model(checks, tmp_path):
  d, summary = checks["oracle"]
  re = run.rescore(d, str(tmp_path))
  for name, row in re["benchmarks"].items():
    assert row["score"] == summary["benchmarks"][name]["score"]
    assert row["changed_verdicts"] == 0


def test_rescore_of_a_malformed_sample_file_is_a_clear_error(checks, tmp_path):
  src = tmp_path / "src"
  (src / "samples").mkdir(parents=True)
  good = open(os.path.join(checks["oracle"][0], "samples", "aime24.jsonl")).read()
  (src / "samples" / "aime24.jsonl").write_text(good + "{not json\n")
  with pytest.raises(samples.SampleFileError, match=r"aime24.jsonl:3: not JSON"):
    run.rescore(str(src), str(tmp_path / "out"))
  (src / "samples" / "aime24.jsonl").write_text('{"benchmark": "aime24", "id": "x"}\n')
  with pytest.raises(samples.SampleFileError, match="missing fields"):
    run.rescore(str(src), str(tmp_path / "out"))
  assert run.main(["--rescore", str(src), "--out", str(tmp_path / "out")]) == 2


def test_unknown_benchmark_is_an_error_before_anything_runs(tmp_path, capsys):
  with pytest.raises(ValueError, match="unknown benchmark 'aime99'"):
    benchmarks.select("aime24,aime99")
  assert run.main(["--model", "oracle", "--benchmarks", "nope", "--out", str(tmp_path)]) == 2
  assert "unknown benchmark" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "summary.json")


def test_families_and_all():
  assert [b.name for b in benchmarks.select("tool_use")] == [
      "bfcl_mt_base", "bfcl_mt_miss_func", "bfcl_mt_miss_param", "bfcl_mt_long_context"]
  assert len(benchmarks.select("all")) == len(benchmarks.REGISTRY)
  assert set(benchmarks.REGISTRY) == set(presets.get("paper")) == set(presets.get("smoke"))


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_user_files_missing_malformed_and_present(tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  _write(data / "aime25.jsonl", [{"question": "1+1?", "answer": "2"},
                                 {"question": "2+2?", "answer": "4", "id": "p2"}])
  (data / "aime26.jsonl").write_text('{"question": "x"}\n')  # no answer
  _write(data / "gpqa_diamond.jsonl", [
      {"Question": f"Q{i}?", "Correct Answer": "right", "Incorrect Answer 1": "w1",
       "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"} for i in range(3)])
  _write(data / "livecodebench_v6.jsonl", [
      {"question_id": "s1", "question_content": "Print twice the input.",
       "public_test_cases": json.dumps([{"input": "3\n", "output": "6\n", "testtype": "stdin"}]),
       "private_test_cases": json.dumps([{"input": "5\n", "output": "10", "testtype": "stdin"}]),
       "solution": "print(int(input()) * 2)"},
      {"question_id": "f1", "question_content": "Add.", "starter_code": "class Solution:\n",
       "metadata": json.dumps({"func_name": "add"}),
       "public_test_cases": json.dumps([{"input": "1\n2", "output": "3",
                                         "testtype": "functional"}]),
       "private_test_cases": "[]",
       "solution": "class Solution:\n  def add(self, a, b):\n    return a + b"}])
  names = ["aime25", "aime26", "math500", "gpqa_diamond", "livecodebench_v6"]
  picked = [benchmarks.REGISTRY[n] for n in names]
  for gen, want in (("oracle", 1.0), ("empty", 0.0)):
    out = run.evaluate(gen, picked, "smoke", str(tmp_path / gen), data_dir=str(data))
    rows = out["benchmarks"]
    assert rows["aime25"]["status"] == "ok" and rows["aime25"]["score"] == want
    assert rows["gpqa_diamond"]["status"] == "ok" and rows["gpqa_diamond"]["score"] == want
    assert rows["livecodebench_v6"]["status"] == "ok", rows["livecodebench_v6"]
    assert rows["livecodebench_v6"]["score"] == want
    assert rows["aime26"]["status"] == "unavailable"
    assert "aime26.jsonl:1" in rows["aime26"]["reason"]
    assert rows["math500"]["status"] == "unavailable"
    assert "math500.jsonl" in rows["math500"]["reason"]
  # Without --data-dir every user-file benchmark is an "unavailable" row, not a crash.
  out = run.evaluate("oracle", picked, "smoke", str(tmp_path / "none"))
  assert {r["status"] for r in out["benchmarks"].values()} == {"unavailable"}


def test_wrong_code_fails_in_the_sandbox(tmp_path):
  from spade_jax.eval import humaneval
  from spade_jax.eval.protocol import Context, Protocol

  item = humaneval.load(None)[0]
  ctx = Context(Protocol(1, Sampling(), timeout_s=2.0))
  try:
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    hang = "```python\ndef has_close_elements(numbers, threshold):\n    while True: pass\n```"
    escape = ("```python\nimport os\nos.system('touch /tmp/escaped')\n"
              "def has_close_elements(n, t):\n    return False\n```")
    got = humaneval.grade([(item, wrong), (item, hang), (item, escape)], ctx)
  finally:
    ctx.close()
  assert [g["score"] for g in got] == [0.0, 0.0, 0.0]
  assert got[1]["execution"] == "TIMEOUT"


def test_a_failing_benchmark_keeps_finished_results(tmp_path, monkeypatch):
  from spade_jax.eval import math_bench

  def boom(pairs, ctx):
    raise RuntimeError("grader bug")

  broken = math_bench.BENCHMARKS[0].__class__("aime24", "math", math_bench.BENCHMARKS[0].load,
                                              boom)
  out = run.evaluate("oracle", [benchmarks.REGISTRY["humaneval"], broken,
                                benchmarks.REGISTRY["aime25_i"]], "smoke", str(tmp_path))
  rows = out["benchmarks"]
  assert rows["humaneval"]["score"] == 1.0 and rows["aime25_i"]["score"] == 1.0
  assert rows["aime24"]["status"] == "error" and "grader bug" in rows["aime24"]["reason"]
  assert json.load(open(tmp_path / "summary.json"))["benchmarks"]["aime25_i"]["status"] == "ok"


def test_resume_skips_saved_problems(tmp_path):
  bench = [benchmarks.REGISTRY["aime24"]]
  run.evaluate("oracle", bench, "smoke", str(tmp_path))
  first = open(tmp_path / "samples" / "aime24.jsonl").read()
  out = run.evaluate("empty", bench, "smoke", str(tmp_path))  # everything already saved
  assert open(tmp_path / "samples" / "aime24.jsonl").read() == first
  assert out["benchmarks"]["aime24"]["score"] == 1.0


def test_stats_clustered_by_problem():
  s = stats.summarize({"a": [1, 1], "b": [0, 0]})
  assert s["score"] == 0.5 and s["n"] == 4 and s["problems"] == 2
  assert s["stderr"] == pytest.approx(0.5)  # std of per-problem means / sqrt(2)
  lo, hi = s["ci95"]
  assert lo == 0.0 and hi == 1.0
  one = stats.summarize({"a": [1.0]})
  assert one["stderr"] == 0.0 and one["ci95"] == [1.0, 1.0]
  flat = stats.summarize({str(i): [float(i % 4 == 0)] for i in range(400)})
  assert flat["score"] == 0.25
  assert flat["ci95"][0] < 0.25 < flat["ci95"][1] and flat["ci95"][1] - flat["ci95"][0] < 0.1


class _FakeTok:
  def decode(self, ids):
    return " ".join(str(i) for i in ids)


class _FakeSampler:
  eos_ids, stop_ids = (2,), (3,)

  def __init__(self):
    self.calls = []


def test_model_generator_batches_and_skips_overflowing_prompts(monkeypatch):
  g = ModelGenerator.__new__(ModelGenerator)
  g.loaded = type("L", (), {"tokenizer": _FakeTok(), "params": None,
                            "cfg": type("C", (), {"max_seq_len": 10})})()
  g.sampler, g.max_rows = _FakeSampler(), 4
  g.overflows = g.truncated = g.tokens_out = g._calls = 0
  g.device_s = 0.0
  monkeypatch.setattr(g, "_encode", lambda p: [1] * len(p.messages[0]["content"]))
  seen = []

  def fake_sample(token_lists, sampling, max_new, seed):
    seen.append((len(token_lists), max_new))
    return [[([7, 10 + len(t), 3], "stop")] * sampling.n for t in token_lists]

  monkeypatch.setattr(g, "_sample", fake_sample)
  prompts = [Prompt(({"role": "user", "content": "x" * k},)) for k in (3, 12, 5)]
  out = g.generate(prompts, Sampling(n=2, max_new_tokens=8))
  assert out[0] == ["7 13"] * 2 and out[2] == ["7 15"] * 2  # stop token stripped
  assert out[1] == ["", ""] and g.overflows == 1  # 12 tokens do not fit a context of 10
  assert seen == [(2, 5)]  # 4 rows = 2 prompts x 2 samples; budget cut to the context
  out = g.generate(prompts, Sampling(n=1, max_new_tokens=2, max_prompt_tokens=4))
  assert out == [["7 13"], [""], [""]] and g.overflows == 3  # 5 tokens are over the limit of 4
