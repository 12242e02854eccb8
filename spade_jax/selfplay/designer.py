"""Regeneration: the designer writes environments, the sandbox admits them, the hint writer
hints them (docs/method.md §1–3, §5).

Slots are spread round-robin over the window's skills. Each attempt samples one program per
still-empty slot (a fresh corpus document each time), validates them all in the sandbox in one
batch, and fills the slots whose program is admitted; a failed attempt costs nothing and trains
nothing. Every admitted program keeps its designer sample (prompt + completion tokens, loss mask
on the completion, behaviour log-probs) for the delayed reward.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Sequence

import numpy as np

from spade_jax.sandbox import starters
from spade_jax.sandbox import validate as validate_lib
from spade_jax.sandbox.contract import extract_code
from spade_jax import sampling
from spade_jax import tokenizer as tok_lib
from spade_jax.selfplay import corpus as corpus_lib
from spade_jax.selfplay import memory as memory_lib
from spade_jax.selfplay import progress as progress_lib
from spade_jax.selfplay import prompts, seeds


@dataclasses.dataclass
class Admitted:
  env_id: str
  skill: str
  code: str
  doc_id: str
  sample: dict[str, Any]  # the designer sample (see ledger.add_designer_sample)
  hint: str | None = None


@dataclasses.dataclass
class Regeneration:
  admitted: list[Admitted]
  verdicts: list[validate_lib.Verdict]
  tokens: int  # designer + hint tokens sampled


def window_skills(skills: Sequence[str], regen_index: int, per_window: int) -> list[str]:
  """The rotating window: start = (regen_index * per_window) mod len(skills)."""
  start = (regen_index * per_window) % len(skills)
  return [skills[(start + j) % len(skills)] for j in range(per_window)]


def env_id_for(step: int, slot: int, code: str) -> str:
  return f"s{step:05d}-{slot:02d}-{hashlib.sha256(code.encode()).hexdigest()[:8]}"


def _prompt(tokenizer, skill: str, doc: corpus_lib.Document | None, records, mcfg, c,
            rng: np.random.Generator) -> list[int]:
  positives, negatives = memory_lib.examples(records, skill, mcfg, rng) if c.memory.enabled else (
      [], [])
  # While memory has nothing for this skill, the skill's shortest starter shows the format.
  few_shots = [] if positives else [min((starters.code(n) for n in starters.by_skill(skill)),
                                        key=len)]
  block = prompts.memory_block(positives, negatives, few_shots)
  messages = prompts.designer(skill, doc.text if doc else None, block, c.env.min_turns)
  return tok_lib.encode(tokenizer, tok_lib.render(tokenizer, messages))


def regenerate(c, step: int, regen_index: int, params, sampler: sampling.Sampler, tokenizer,
               pool, corpus: corpus_lib.Corpus | None, records, mcfg: memory_lib.MemoryConfig,
               validation: validate_lib.Options, *,
               progress: progress_lib.Progress | None = None) -> Regeneration:
  progress = progress or progress_lib.quiet()
  skills = window_skills(c.skills, regen_index, c.skills_per_window)
  slot_skill = [skills[i % len(skills)] for i in range(c.envs_per_regen)]
  settings = sampling.Settings(max_new_tokens=c.designer.max_new_tokens,
                               temperature=c.designer.temperature, top_k=c.designer.top_k,
                               top_p=c.designer.top_p)
  admitted: dict[int, Admitted] = {}
  verdicts, n_tokens = [], 0
  for attempt in range(c.attempts_per_slot):
    open_slots = [s for s in range(c.envs_per_regen) if s not in admitted]
    if not open_slots:
      break
    docs, prompt_ids = [], []
    for s in open_slots:
      doc = corpus.next() if corpus is not None else None
      rng = np.random.default_rng([c.seed, step, s, attempt])
      docs.append(doc)
      prompt_ids.append(_prompt(tokenizer, slot_skill[s], doc, records, mcfg, c, rng))
    with progress.phase("designer sampling", f"attempt {attempt + 1}/{c.attempts_per_slot}, "
                        f"{len(open_slots)}/{c.envs_per_regen} slots open, up to "
                        f"{settings.max_new_tokens} tokens each") as ph:
      with progress.compiling("sampler (designer)"):
        out = sampler.generate(params, prompt_ids, settings,
                               seed=seeds.derive(c.seed, step, 1, attempt))
      completions = out.token_lists()
      n_tokens += int(out.lengths.sum())
      ph.note = f"{int(out.lengths.sum())} tokens"
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in completions]
    # One sandbox call judges the whole batch concurrently, so the count moves once, at its end.
    with progress.phase("admission", "validating programs in the sandbox", total=len(texts),
                        unit="programs") as ph:
      got = validate_lib.validate_many(pool, texts, validation)
      ph.update(len(got))
      ph.note = _admission_note(got)
    verdicts += got
    for row, (s, v) in enumerate(zip(open_slots, got)):
      if not v.admitted:
        continue
      code, p, toks = extract_code(texts[row]), prompt_ids[row], completions[row]
      env_id = env_id_for(step, s, code)
      sample = {"env_id": env_id, "skill": slot_skill[s], "tokens": p + toks,
                "mask": [0] * len(p) + [1] * len(toks),
                "logp": [0.0] * len(p) + out.logprobs[row, :len(toks)].tolist(),
                "temperature": settings.temperature, "step": step}
      admitted[s] = Admitted(env_id, slot_skill[s], code, docs[row].doc_id if docs[row] else "",
                             sample)
  result = [admitted[s] for s in sorted(admitted)]
  n_tokens += add_hints(c, step, params, sampler, tokenizer, result, progress=progress)
  return Regeneration(result, verdicts, n_tokens)


def _admission_note(verdicts: Sequence[validate_lib.Verdict]) -> str:
  stats = validate_lib.rejection_stats(verdicts)
  why = ", ".join(f"{k} {v}" for k, v in sorted(stats["by_check"].items()))
  return f"admitted {stats['admitted']}/{stats['n']}" + (f"; rejected: {why}" if why else "")


def add_hints(c, step: int, params, sampler: sampling.Sampler, tokenizer,
              envs: list[Admitted], *, progress: progress_lib.Progress | None = None) -> int:
  """Writes a strategy hint for each environment in place; an empty hint counts as failed
  (that environment's regret is then 0). Returns the number of tokens sampled."""
  progress = progress or progress_lib.quiet()
  if not envs:
    progress.line("hint writing: skipped (no environment admitted)")
    return 0
  settings = sampling.Settings(max_new_tokens=c.hint.max_new_tokens,
                               temperature=c.hint.temperature, top_k=c.hint.top_k,
                               top_p=c.hint.top_p)
  prompt_ids = [tok_lib.encode(tokenizer, tok_lib.render(tokenizer, prompts.hint_writer(e.code)))
                for e in envs]
  with progress.phase("hint writing", f"{len(envs)} environments, up to "
                      f"{settings.max_new_tokens} tokens each"):
    with progress.compiling("sampler (hints)"):
      out = sampler.generate(params, prompt_ids, settings, seed=seeds.derive(c.seed, step, 2))
  for e, toks in zip(envs, out.token_lists()):
    e.hint = prompts.clean_hint(tokenizer.decode(toks, skip_special_tokens=True)) or None
  return int(out.lengths.sum())
