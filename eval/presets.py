"""Evaluation presets: `paper` (docs/method.md §10's sample counts and temperatures) and `smoke`.

paper: AIME 64 samples at T 1.0; GPQA-Diamond 8 samples; LiveCodeBench v6 1 sample;
Reasoning-Gym 8 episodes per task (see rgym.py); BFCL multi-turn greedy with BFCL's own 20-step
limit. HumanEval and MATH-500 are not in the paper's table; they use the common protocols
(greedy pass@1; 4 samples at T 0.6). The paper's token budget for thinking models is large
(32768 new tokens); lower `max_new_tokens` with `--max_new_tokens` for a non-thinking model.

smoke: two problems (or episodes) per benchmark, one short sample each, prompts up to 2048 tokens
— a few minutes on two CPU cores with SmolLM2-135M, meant to prove the pipeline end to end, not
to measure anything.

Environment suites (`envs:DIR`, see envs.py) play each program `Sampling.n` episodes with the
self-play agent's sampling (T 0.6, top-p 0.95, top-k 20; configs/spade.py `agent`), up to 25
turns: paper 8 episodes, 8192 tokens per turn and 32768 per episode (the recipe's
`agent_context`); smoke 2 episodes, 48 tokens per turn and 1024 per episode (the `local`
self-play preset's).
"""

from __future__ import annotations

import dataclasses

from .generation import Sampling
from .protocol import Protocol

_THINK = 32768
SMOKE_TASKS = {"math": ("basic_arithmetic", "gcd"), "algorithmic": ("graph_color", "word_sorting"),
               "cognition": ("color_cube_rotation", "number_sequence"),
               "logic": ("knights_knaves", "syllogism")}


def _paper() -> dict[str, Protocol]:
  aime = Protocol(None, Sampling(n=64, temperature=1.0, top_p=0.95, max_new_tokens=_THINK))
  return {
      "aime24": aime, "aime25_i": aime, "aime25": aime, "aime26": aime,
      "math500": Protocol(None, Sampling(n=4, temperature=0.6, top_p=0.95,
                                         max_new_tokens=_THINK)),
      "gpqa_diamond": Protocol(None, Sampling(n=8, temperature=1.0, top_p=0.95,
                                              max_new_tokens=_THINK)),
      "livecodebench_v6": Protocol(None, Sampling(n=1, temperature=0.6, top_p=0.95,
                                                  max_new_tokens=_THINK), timeout_s=20.0),
      "humaneval": Protocol(None, Sampling(n=1, temperature=0.0, max_new_tokens=2048),
                            timeout_s=10.0),
      **{f"rg_{b}": Protocol(None, Sampling(n=1, temperature=1.0, top_p=0.95,
                                            max_new_tokens=_THINK), episodes=8)
         for b in ("math", "algorithmic", "cognition", "logic")},
      **{f"bfcl_mt_{c}": Protocol(None, Sampling(n=1, temperature=0.0, max_new_tokens=4096),
                                  max_steps=20)
         for c in ("base", "miss_func", "miss_param", "long_context")},
  }


def _smoke() -> dict[str, Protocol]:
  # BFCL's function docs make its prompts 4k-8k tokens long: too slow to prefill on a CPU, so
  # smoke skips prompts over 2048 tokens (counted per benchmark as "over the prompt limit").
  short = Sampling(n=1, temperature=0.0, max_new_tokens=24, max_prompt_tokens=2048)
  out = {name: Protocol(2, short, timeout_s=10.0) for name in _paper()}
  # Reasoning-Gym: one episode of two tasks per bucket.
  out.update({f"rg_{b}": Protocol(None, short, episodes=1, subset=tasks)
              for b, tasks in SMOKE_TASKS.items()})
  out.update({f"bfcl_mt_{c}": Protocol(1, short, max_steps=1)
              for c in ("base", "miss_func", "miss_param", "long_context")})
  return out


PRESETS = {"paper": _paper, "smoke": _smoke}
ENVS_PREFIX = "envs:"


def _agent(n: int, max_new_tokens: int) -> Sampling:
  return Sampling(n=n, temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=max_new_tokens)


ENVS = {"paper": Protocol(None, _agent(8, 8192), max_turns=25, context=32768),
        "smoke": Protocol(None, _agent(2, 48), max_turns=25, context=1024)}


def get(preset: str) -> dict[str, Protocol]:
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; presets: {sorted(PRESETS)}")
  return PRESETS[preset]()


def protocol(preset: str, name: str) -> Protocol:
  """The protocol of one benchmark; every `envs:` suite shares its preset's ENVS entry."""
  if name.startswith(ENVS_PREFIX):
    get(preset)  # an unknown preset is the same error for every benchmark
    return ENVS[preset]
  return get(preset)[name]


def override(proto: Protocol, overrides: dict | None) -> Protocol:
  """`proto` with some fields replaced: Sampling fields (n, max_new_tokens, seed, ...) or
  Protocol fields (max_turns, context, ...); an unknown name is an error."""
  if not overrides:
    return proto
  s_fields = {f.name for f in dataclasses.fields(Sampling)}
  p_fields = {f.name for f in dataclasses.fields(Protocol)} - {"sampling"}
  unknown = set(overrides) - s_fields - p_fields
  if unknown:
    raise ValueError(f"unknown protocol fields {sorted(unknown)}; "
                     f"known: {sorted(s_fields | p_fields)}")
  sampling = dataclasses.replace(proto.sampling,
                                 **{k: v for k, v in overrides.items() if k in s_fields})
  return dataclasses.replace(proto, sampling=sampling,
                             **{k: v for k, v in overrides.items() if k in p_fields})
