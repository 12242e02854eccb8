"""Corpus, memory and prompts of the self-play loop (host-side data, no model)."""

import json

import numpy as np
import pytest

from spade_jax import actions
from spade_jax import config as config_lib
from spade_jax.selfplay import corpus, memory, prompts


def _write(path, lines):
  path.write_text("\n".join(lines) + "\n")
  return str(path)


def test_corpus_reads_cuts_and_keeps_metadata(tmp_path):
  p = _write(tmp_path / "c.jsonl", [json.dumps({"text": "a b c d e", "id": "x", "url": "u"}),
                                    json.dumps({"text": "f g"})])
  docs = corpus.read_jsonl(p, max_words=3)
  assert [d.text for d in docs] == ["a b c", "f g"]
  assert docs[0].doc_id == "x" and docs[0].meta == {"id": "x", "url": "u"}


@pytest.mark.parametrize("line, match", [("{not json", "c.jsonl:2: not valid JSON"),
                                         ('{"body": "x"}', "c.jsonl:2: expected an object"),
                                         ('["x"]', "c.jsonl:2: expected an object")])
def test_corpus_malformed_line_is_named(tmp_path, line, match):
  p = _write(tmp_path / "c.jsonl", [json.dumps({"text": "ok"}), line])
  with pytest.raises(ValueError, match=match):
    corpus.read_jsonl(p, 10)


def test_corpus_missing_or_empty(tmp_path):
  with pytest.raises(FileNotFoundError):
    corpus.read_jsonl(str(tmp_path / "nope.jsonl"), 10)
  with pytest.raises(ValueError, match="no documents"):
    corpus.read_jsonl(_write(tmp_path / "e.jsonl", ['{"text": "  "}']), 10)


def test_corpus_stream_is_seeded_uniform_and_resumable():
  docs = [corpus.Document(str(i), str(i), {}) for i in range(7)]
  a = corpus.Corpus(docs, seed=3)
  first = [a.next().doc_id for _ in range(7)]
  assert sorted(first) == [str(i) for i in range(7)]  # each pass is a permutation
  state = a.get_state()
  expected = [a.next().doc_id for _ in range(10)]
  b = corpus.Corpus(docs, seed=3)
  b.set_state(json.loads(json.dumps(state)))  # the state survives JSON (checkpoints)
  assert [b.next().doc_id for _ in range(10)] == expected
  orders = {tuple(corpus.Corpus(docs, seed=s).next().doc_id for _ in range(7)) for s in range(5)}
  assert len(orders) > 1  # the seed matters


def test_default_corpus_is_real_text_and_cached(tmp_path):
  p = corpus.build_default_corpus(str(tmp_path / "corpus.jsonl"))
  docs = corpus.read_jsonl(p, 6000)
  assert len(docs) > 200
  ids = {d.doc_id for d in docs}
  assert "statistics.median" in ids and any(i.startswith("sympy.ntheory") for i in ids)
  mtime = (tmp_path / "corpus.jsonl").stat().st_mtime_ns
  corpus.build_default_corpus(p)
  assert (tmp_path / "corpus.jsonl").stat().st_mtime_ns == mtime


def _rec(skill, win, regret, step, code="x"):
  return memory.Record(skill, code, win, regret, step)


def test_memory_fifo_and_code_cut():
  cfg = memory.MemoryConfig(capacity=3, code_chars=5)
  recs = []
  for i in range(5):
    recs = memory.add(recs, _rec("A", 0.5, 0.1, i, code="abcdefgh"), cfg)
  assert [r.step for r in recs] == [2, 3, 4] and recs[0].code == "abcde"


def test_memory_examples_follow_section_8():
  cfg = memory.MemoryConfig(top_regret=3, n_positive=2)
  recs = [_rec("A", 0.5, 0.9, 0), _rec("A", 0.5, 0.8, 1), _rec("A", 0.5, 0.7, 2),
          _rec("A", 0.5, 0.6, 3),  # in band but not top-3 regret
          _rec("A", 0.95, 2.0, 4),  # too easy: negative only
          _rec("A", 0.05, 2.0, 5),  # too hard: negative only
          _rec("B", 0.5, 5.0, 6)]  # other skill
  seen_pos, seen_neg = set(), set()
  for seed in range(30):
    pos, neg = memory.examples(recs, "A", cfg, np.random.default_rng(seed))
    assert len(pos) == 2 and len(neg) == 1
    seen_pos |= {r.step for r in pos}
    seen_neg |= {r.step for r in neg}
  assert seen_pos == {0, 1, 2} and seen_neg == {4, 5}
  assert memory.examples(recs, "C", cfg, np.random.default_rng(0)) == ([], [])


def test_memory_json_round_trip(tmp_path):
  recs = [_rec("A", 0.25, -0.5, 3)]
  memory.save(str(tmp_path / "m.json"), recs)
  assert memory.load(str(tmp_path / "m.json")) == recs


def test_designer_prompt_variants():
  mem = prompts.memory_block([_rec("Optimization", 0.5, 0.3, 1, code="class AEnv: pass")],
                             [_rec("Optimization", 1.0, 0.0, 2, code="class BEnv: pass")], [])
  grounded = prompts.designer("Optimization", "Knapsack sizes are integers.", mem, 3)[0]["content"]
  assert "Knapsack sizes are integers." in grounded and "class AEnv" in grounded
  assert "Win rate 0.50, hint gain +0.30" in grounded and "always won" in grounded
  assert "at least 3 interactions" in grounded and "\\boxed{...}" in grounded
  skill_only = prompts.designer("Optimization", None, "", 3)[0]["content"]
  assert "<source>" not in skill_only
  few = prompts.memory_block([], [], ["class StarterEnv: pass"])
  assert "class StarterEnv" in few
  with pytest.raises(ValueError, match="unknown skill"):
    prompts.designer("Juggling", None, "", 3)


@pytest.mark.parametrize("text, action", [
    ("I think \\boxed{3} no wait \\boxed{\\frac{1}{2}}", "\\boxed{\\frac{1}{2}}"),
    ("move \\boxed{ north }", "\\boxed{north}"),
    ("no box here", "no box here"),
    ("\\boxed{unclosed", "\\boxed{unclosed"),
    # An unclosed last box (cut by the token limit) is no answer: the earlier complete one is,
    # exactly as eval grades boxed answers.
    ("\\boxed{12} and then \\boxed{unfinished", "\\boxed{12}"),
])
def test_agent_action_is_the_last_complete_box_rewrapped(text, action):
  assert actions.boxed_action(text) == action


def test_hint_cleaning_and_agent_prompt():
  assert prompts.clean_hint('HINT: "Go left.  Then right! Then up? Never down."') == (
      "Go left. Then right! Then up?")
  msg = prompts.agent_first_turn("You see a door.", hint="Knock.")[0]["content"]
  assert msg.endswith("You see a door.\n\nHINT: Knock.") and "\\boxed{}" in msg


@pytest.mark.parametrize("preset", ["local", "qwen3_4b", "qwen3_8b"])
def test_spade_config_presets_load(preset):
  c = config_lib.load(f"configs/spade.py:{preset}")
  assert c.rl.eps_high == 0.28 and c.reward.regret_scale == 0.15
  assert c.rl.kl_beta == (0.005 if preset == "qwen3_8b" else 0.0)
