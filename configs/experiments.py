"""Comparisons as one command: the methods and ablations of a preset, equal budgets and seeds.

  python -m spade_jax.experiment --config=configs/experiments.py:PRESET --workdir=W

Presets (`--config=configs/experiments.py:PRESET`):

  local   SmolLM2-135M on CPU: base, warm start, warm start + fixed-env GRPO, warm start +
          SPADE (docs/results.md); every final checkpoint on the held-out suite (sandbox/heldout)
          as an environment benchmark. Add fixed-env RLVE with a line of the table, e.g.
          --config.runs="$(printf 'base: eval_only\nwarm: sft\nrlve: from=warm method=fixed_rlve')".
  smoke   the same runs at one rollout step each, to check the wiring (a few minutes).
  paper   Qwen3-4B: the paper's comparison (with fixed-env RLVE) and ablations (no corpus, no
          memory, no designer training, reward variants); give --config.model=HF_DIR --config.corpus=DOCS.jsonl.

Every run is `python -m spade_jax.train` (or `spade_jax.sft` for the warm start) with the shared
overrides plus its own; `runs` is a string of `name: [from=RUN] override override ...` lines, so
a preset reads as the table it produces. A finished run (its `done.json`) is not rerun.
"""

import ml_collections

PRESETS = {
    "local": "SmolLM2-135M on CPU: base, warm start, + fixed-env GRPO, + SPADE",
    "smoke": "the local runs at one rollout step each (checks the wiring)",
    "paper": "Qwen3-4B: the paper's comparison and ablations; needs --config.model, corpus",
}

_LOCAL_RUNS = """
base:          eval_only
warm:          sft
grpo:          from=warm method=fixed_grpo
spade:         from=warm method=spade
"""

_PAPER_RUNS = _LOCAL_RUNS + """
rlve:          from=warm method=fixed_rlve
no_corpus:     from=warm method=spade corpus.enabled=false
no_memory:     from=warm method=spade memory.enabled=false
no_designer:   from=warm method=spade designer.train=false
solve_rate:    from=warm method=spade reward.variant=solve_rate
regret:        from=warm method=spade reward.variant=regret
lp:            from=warm method=spade reward.variant=learning_potential
"""


def get_config(arg=None):
  preset = arg or "local"
  c = ml_collections.ConfigDict()
  c.preset = preset
  c.model = "smollm2-135m"  # the base model every run starts from (SPEC)
  c.train_config = "configs/spade.py:local"  # the train preset every training run extends
  c.sft_config = "configs/sft.py:local"  # the warm start's preset
  # Warm starts live in the self-play jobs' cache (spade_jax.sft.cache_root, by config digest)
  # rather than in W/runs/NAME: one SFT per distinct config across jobs and experiments.
  c.shared_warm_start = True
  c.overrides = ""  # space-separated KEY=VALUE given to every training run (equal budgets)
  c.runs = _LOCAL_RUNS
  c.seed = 0
  # Held-out evaluation of every final checkpoint: eval.run benchmarks and its preset.
  c.benchmarks = "envs:sandbox/heldout"  # add ",envs:sandbox/starters" for the training games
  c.eval_preset = "paper"
  # More eval.run flags for every evaluation (the same for all runs), e.g. a per-turn token
  # budget that CPU runs can afford.
  c.eval_flags = ""
  c.corpus = ""  # a JSONL corpus for SPADE runs ("" = the train preset's own choice)
  if preset == "local":  # 2 CPU cores: short agent turns (the paper's 8192 would take hours)
    c.eval_flags = "--max_new_tokens=64 --dtype=bfloat16"
  elif preset == "smoke":
    c.overrides = "total_steps=1"
    c.eval_preset = "smoke"
    c.eval_flags = "--max_new_tokens=64 --dtype=bfloat16"
    c.runs = _LOCAL_RUNS.replace("warm:          sft", "warm:          sft max_steps=2")
  elif preset == "paper":
    c.model = ""
    c.train_config = "configs/spade.py:qwen3_4b"
    c.sft_config = "configs/sft.py:qwen3_4b"
    c.runs = _PAPER_RUNS
    c.benchmarks = "envs:sandbox/heldout,all"
  else:
    raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
  return c
