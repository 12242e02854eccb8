"""Regeneration: the designer writes environments, the sandbox admits them, the hint writer
hints them (docs/method.md §1–3, §5).

Slots are spread round-robin over the window's skills. Each attempt writes one program per
still-empty slot (a fresh corpus document each time), validates them all in the sandbox in one
batch, and fills the slots whose program is admitted; a failed attempt costs nothing and trains
nothing. Every admitted program keeps its designer sample (prompt + completion tokens, loss mask
on the completion, behaviour log-probs) for the delayed reward.

A replayed designer (`designer.programs=DIR`) takes its programs from the `.py` files of DIR
instead of sampling them: file ((regeneration * attempts + attempt) * slots + slot) mod n, in
sorted order. Each is rendered as the designer's reply to the real prompt and scored by the
current policy for its behaviour log-probs, so admission, hints, regret, memory and the delayed
designer update downstream run as they do on sampled programs.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
from typing import Callable, Sequence

import numpy as np

from spade_jax import rl, sampling
from spade_jax import tokenizer as tok_lib
from spade_jax.sandbox import starters
from spade_jax.sandbox import validate as validate_lib
from spade_jax.sandbox.contract import extract_code
from spade_jax.selfplay import corpus as corpus_lib
from spade_jax.selfplay import memory as memory_lib
from spade_jax.selfplay import progress as progress_lib
from spade_jax.selfplay import prompts, records, seeds

# (params, token lists, where each completion starts, temperature) -> each completion's log-probs
Scorer = Callable[[object, list[list[int]], list[int], float], list[np.ndarray]]
COLD_START = ("starter", "none")  # what a prompt shows while memory has no positive of its skill


@dataclasses.dataclass(frozen=True)
class Admitted:
  card: records.Card
  sample: records.Sample


@dataclasses.dataclass(frozen=True)
class Regeneration:
  admitted: list[Admitted]
  verdicts: list[validate_lib.Verdict]
  tokens: int  # designer + hint tokens sampled (replayed programs count 0)


def window_skills(skills: Sequence[str], regen_index: int, per_window: int) -> list[str]:
  """The rotating window: start = (regen_index * per_window) mod len(skills)."""
  start = (regen_index * per_window) % len(skills)
  return [skills[(start + j) % len(skills)] for j in range(per_window)]


def env_id_for(step: int, slot: int, code: str) -> str:
  return f"s{step:05d}-{slot:02d}-{hashlib.sha256(code.encode()).hexdigest()[:8]}"


def load_programs(directory: str) -> list[str]:
  """The replayed designer's programs: the `.py` files of `directory`, sorted by name."""
  paths = sorted(p for p in glob.glob(os.path.join(directory, "*.py"))
                 if os.path.basename(p) != "__init__.py")
  if not paths:
    raise ValueError(f"designer.programs: no .py files in {directory!r}")
  out = []
  for p in paths:
    with open(p, encoding="utf-8") as f:
      out.append(f.read())
  return out


def _messages(skill: str, doc: corpus_lib.Document | None, memory, mcfg, c,
              rng: np.random.Generator) -> list[dict[str, str]]:
  positives, negatives = ([], [])
  few_shots = []
  if c.memory.enabled:
    positives, negatives = memory_lib.examples(memory, skill, mcfg, rng)
    if not positives and c.memory.cold_start_example == "starter":
      # The skill's shortest hand-written environment shows the format (not a past environment).
      few_shots = [min((starters.code(n) for n in starters.by_skill(skill)), key=len)]
  block = prompts.memory_block(positives, negatives, few_shots)
  return prompts.designer(skill, doc.text if doc else None, block, c.env.min_turns)


def regenerate(c, step: int, params, sampler: sampling.Sampler, tokenizer, pool,
               corpus: corpus_lib.Corpus | None, memory, mcfg: memory_lib.MemoryConfig,
               validation: validate_lib.Options, *, programs: Sequence[str] = (),
               scorer: Scorer | None = None, progress: progress_lib.Progress | None = None
               ) -> Regeneration:
  """Fills up to `envs_per_regen` slots; with `programs` (and a `scorer`), replays them."""
  progress = progress or progress_lib.quiet()
  regen = step // c.k
  skills = window_skills(c.skills, regen, c.skills_per_window)
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
    docs, messages = [], []
    for s in open_slots:
      doc = corpus.next() if corpus is not None else None
      rng = np.random.default_rng(seeds.derive(c.seed, step, seeds.MEMORY, s, attempt))
      docs.append(doc)
      messages.append(_messages(slot_skill[s], doc, memory, mcfg, c, rng))
    prompt_ids = [tok_lib.encode(tokenizer, tok_lib.render(tokenizer, m)) for m in messages]
    head = (f"attempt {attempt + 1}/{c.attempts_per_slot}, {len(open_slots)}/"
            f"{c.envs_per_regen} slots open")
    routed = None  # a replayed program was scored, not sampled: it is routed afresh
    if programs:
      with progress.phase("designer replay", f"{head}, programs from designer.programs"):
        texts = [programs[((regen * c.attempts_per_slot + attempt) * c.envs_per_regen + s)
                          % len(programs)] for s in open_slots]
        completions = [tok_lib.reply_tokens(tokenizer, m, prompts.designer_reply(t))
                       for m, t in zip(messages, texts)]
        with progress.compiling("policy scoring (replayed programs)"):
          logps = scorer(params, [p + q for p, q in zip(prompt_ids, completions)],
                         [len(p) for p in prompt_ids], settings.temperature)
    else:
      with progress.phase("designer sampling", f"{head}, up to {settings.max_new_tokens} "
                          "tokens each") as ph:
        with progress.compiling("sampler (designer)"):
          out = sampler.generate(params, prompt_ids, settings,
                                 seed=seeds.derive(c.seed, step, seeds.DESIGNER, attempt))
        completions = out.token_lists()
        logps = [out.logprobs[row, :len(toks)] for row, toks in enumerate(completions)]
        routed = None if out.experts is None else [
            [out.prefill_experts[row], out.experts[row, :max(len(toks) - 1, 0)]]
            for row, toks in enumerate(completions)]
        n_tokens += int(out.lengths.sum())
        ph.note = f"{int(out.lengths.sum())} tokens"
      texts = [tokenizer.decode(t, skip_special_tokens=True) for t in completions]
    # One sandbox call judges the whole batch concurrently, so the count moves once, at its end.
    with progress.phase("admission", "validating programs in the sandbox", total=len(texts),
                        unit="programs") as ph:
      # The validator draws its reset seeds and probes from this (never shown to a program), so
      # a resumed run admits exactly what the uninterrupted one did.
      got = validate_lib.validate_many(pool, texts, dataclasses.replace(
          validation, seed=seeds.derive(c.seed, step, seeds.ADMISSION, attempt)))
      ph.update(len(got))
      ph.note = _admission_note(got)
    verdicts += got
    for row, (s, v) in enumerate(zip(open_slots, got)):
      if not v.admitted:
        continue
      code, p, toks = extract_code(texts[row]), prompt_ids[row], completions[row]
      env_id = env_id_for(step, s, code)
      sample = records.Sample(
          tuple(p) + tuple(toks), (0,) * len(p) + (1,) * len(toks),
          (0.0,) * len(p) + tuple(float(x) for x in logps[row]), settings.temperature,
          records.DESIGNER, env_id, slot_skill[s],
          experts=None if routed is None else rl.routing_replay(routed[row], len(p) + len(toks)))
      card = records.Card(env_id, slot_skill[s], code, records.DESIGNER, step,
                          doc_id=docs[row].doc_id if docs[row] else "")
      admitted[s] = Admitted(card, sample)
  result = [admitted[s] for s in sorted(admitted)]
  result, hint_tokens = add_hints(c, step, params, sampler, tokenizer, result, progress=progress)
  return Regeneration(result, verdicts, n_tokens + hint_tokens)


def _admission_note(verdicts: Sequence[validate_lib.Verdict]) -> str:
  stats = validate_lib.rejection_stats(verdicts)
  why = ", ".join(f"{k} {v}" for k, v in sorted(stats["by_check"].items()))
  return f"admitted {stats['admitted']}/{stats['n']}" + (f"; rejected: {why}" if why else "")


def add_hints(c, step: int, params, sampler: sampling.Sampler, tokenizer,
              envs: list[Admitted], *, progress: progress_lib.Progress | None = None
              ) -> tuple[list[Admitted], int]:
  """The environments with a strategy hint each (None: hint generation failed, an empty hint;
  that environment's regret is then 0), and the number of tokens sampled."""
  progress = progress or progress_lib.quiet()
  if not envs:
    progress.line("hint writing: skipped (no environment admitted)")
    return envs, 0
  settings = sampling.Settings(max_new_tokens=c.hint.max_new_tokens,
                               temperature=c.hint.temperature, top_k=c.hint.top_k,
                               top_p=c.hint.top_p)
  prompt_ids = [tok_lib.encode(tokenizer,
                               tok_lib.render(tokenizer, prompts.hint_writer(e.card.code)))
                for e in envs]
  with progress.phase("hint writing", f"{len(envs)} environments, up to "
                      f"{settings.max_new_tokens} tokens each"):
    with progress.compiling("sampler (hints)"):
      out = sampler.generate(params, prompt_ids, settings,
                             seed=seeds.derive(c.seed, step, seeds.HINT))
  hinted = []
  for e, toks in zip(envs, out.token_lists()):
    hint = prompts.clean_hint(tokenizer.decode(toks, skip_special_tokens=True)) or None
    hinted.append(dataclasses.replace(e, card=dataclasses.replace(e.card, hint=hint)))
  return hinted, int(out.lengths.sum())
