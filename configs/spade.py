"""SPADE self-play: one policy as environment designer and reasoning agent (docs/method.md).

Presets (`--config=configs/spade.py:PRESET`):

  local     the embedded SmolLM2-135M on CPU; two regeneration windows in a few minutes:
              python -m spade_jax.train --config=configs/spade.py:local --workdir=/tmp/spade
  qwen3_4b  the paper's games recipe for Qwen3-4B (beta 0); give the HF directory:
              python -m spade_jax.train --config=configs/spade.py:qwen3_4b \
                  --config.model=/data/Qwen3-4B --workdir=gs://bucket/run
  qwen3_8b  the same for Qwen3-8B (KL beta 0.005).
  qwen3_30b_a3b  the same for Qwen3-30B-A3B (beta 0), experts split over the mesh's expert axis,
              with routing replay; mesh planned with `python -m spade_jax.plan` (README, MoE).

Every number of docs/method.md is a field here with the paper's default; rerunning the same command on
the same workdir resumes the run.
"""

import ml_collections

from spade_jax import config as config_lib
from spade_jax.sandbox import pool as sandbox_pool
from spade_jax.selfplay import prompts

SKILLS = tuple(prompts.SKILL_DESCRIPTIONS)  # the games setting's six skills, declared there

# Preset -> what it runs; `python -m spade_jax.train --help` lists these.
PRESETS = {
    "local": "the embedded SmolLM2-135M on CPU: two regeneration windows in a few minutes",
    "qwen3_4b": "the paper's games recipe for Qwen3-4B (beta 0); needs --config.model=HF_DIR",
    "qwen3_8b": "the same for Qwen3-8B (KL beta 0.005); needs --config.model=HF_DIR",
    "qwen3_30b_a3b": "the same for Qwen3-30B-A3B (beta 0, expert-parallel, routing replay); "
                     "needs --config.model=HF_DIR",
}


def _sampling(temperature, top_p, top_k, max_new_tokens):
  return ml_collections.ConfigDict(dict(temperature=temperature, top_p=top_p, top_k=top_k,
                                        max_new_tokens=max_new_tokens))


def get_config(arg=None):
  preset = arg or "local"
  c = ml_collections.ConfigDict()
  c.preset = preset
  # spade (default) | fixed_grpo (agent-only GRPO on a frozen pool) | fixed_rlve (agent-only, on
  # parameterised families under RLVE's difficulty controller): docs/method.md §9.
  c.method = "spade"
  c.fixed_pool = ""  # fixed_grpo: a directory of .py programs; "" = the starter environments
  # fixed_rlve: RLVE's difficulty controller per family (sandbox/families; () = all twelve):
  # the window [l, h] rises when accuracy at h reaches tau_acc over >= tau_num plays, and keeps
  # at most d_delta levels.
  c.rlve = ml_collections.ConfigDict(dict(tau_acc=0.9, tau_num=128, d_delta=4, families=()))
  c.model = "smollm2-135m"  # SPEC: embedded name, HF directory, .gguf, checkpoint, random:PRESET
  c.tokenizer = ""  # SPEC to take the tokenizer from; "" = the model's own (random:* need one)
  # A warm start before self-play (spade_jax.sft, docs/method.md §9): `config` names an SFT
  # preset ("" = self-play starts from `model` as it is), made from `model` with `overrides`
  # (('KEY=VALUE', ...) of configs/sft.py) on first use and reused once finished, from `dir`
  # ("" = the cache: $SPADE_JAX_CACHE, $XDG_CACHE_HOME/spade_jax or ~/.cache/spade_jax, under
  # warm_starts/<the SFT config's digest>).
  c.warm_start = ml_collections.ConfigDict(dict(config="", dir="", overrides=()))
  c.dtype = "float32"  # compute dtype (params and optimizer stay float32)
  c.seed = 0
  c.total_steps = 400  # rollout steps, one optimizer step each
  c.mesh = config_lib.mesh_config()
  c.rules = config_lib.rules_config()

  # §5 schedule
  c.k = 4  # regeneration period (steps per window)
  c.envs_per_regen = 24
  c.plays_per_env = 8  # unhinted plays per pool environment per step (trained)
  c.hinted_plays = 16  # hinted plays per new environment at a regeneration step (not trained)
  c.attempts_per_slot = 5  # designer attempts per environment slot, a fresh document each
  c.global_batch = 192  # trained sequences per optimizer step (designer samples first)
  c.skills = SKILLS
  c.skills_per_window = 3  # window start = (regen_index * 3) mod len(skills)
  # Play hand-written starter environments when too few generated ones are admitted (counted
  # as starter_envs / starter_trained). Off in the paper's recipe: a short pool then simply
  # gives a smaller batch (the loss averages over the samples there are), rather than training
  # on environments the designer did not write.
  c.starter_fill = False

  # §1-2, §4 environments and episodes
  c.env = ml_collections.ConfigDict(dict(
      max_turns=25,  # agent turns per episode (capped by the environment's own limit)
      min_turns=3,  # interactions the designer is asked to require
      validation_timeout_s=60.0,  # whole admission check of one environment
      step_timeout_s=5.0,
      # Host wall time one episode may take in the sandbox, all its steps together.
      episode_timeout_s=30.0,
      max_tasks=64,  # processes + threads of one episode
      memory_mb=1024,  # address-space limit of one episode process
      workers=2,  # sandbox zygote processes
      # Protections that must be in force, or the run refuses to start (sandbox/README.md).
      require=tuple(sandbox_pool.DEFAULT_REQUIRE),
  ))
  c.agent = _sampling(0.6, 0.95, 20, 8192)  # max_new_tokens per turn
  c.agent_context = 32768  # tokens of one whole episode
  c.designer = _sampling(0.6, 0.95, 20, 16384)
  c.designer.train = True  # False: the designer still writes and is measured, never trained
  c.designer.programs = ""  # DIR: replay its .py files as the designer's output (no sampling)
  c.hint = _sampling(0.3, 1.0, 0, 4096)

  # §6 rewards
  c.reward = ml_collections.ConfigDict(dict(
      variant="blend",  # blend | solve_rate | regret | learning_potential
      regret_weight=0.4, anchor_weight=0.6, regret_scale=0.15,
      band_low=0.4, band_high=0.6, ramp=0.25,
      scale_cap=50.0,  # designer advantage scale = min(n_agent / n_designer * k, cap)
      # learning_potential: per-skill win-rate averages mu <- (1 - g) mu + g r (g weighs the
      # new window's rate); each environment's signal is |its win rate - mu_slow(skill)|.
      lp_fast=0.98, lp_slow=0.85,
      agent_eps=1e-8,
  ))

  # §7 policy loss and optimizer
  c.rl = ml_collections.ConfigDict(dict(eps_low=0.2, eps_high=0.28, tis_cap=2.0, kl_beta=0.0,
                                        kl_clamp=10.0))
  c.optim = ml_collections.ConfigDict(dict(lr=1e-6, weight_decay=0.1, b1=0.9, b2=0.98,
                                           eps=1e-8, grad_clip=1.0, micro_batch=0, remat=True,
                                           share_prefix=True))  # run a group's shared prompt once
  # Mixture-of-experts models: the learner routes each token to the experts the sampler chose
  # (routing replay), the router's load-balancing loss weight (0 in RL), the grouped matmul
  # (spade_jax/moe.py: auto, ragged_dot, megablox, tiles, dense).
  c.rl.routing_replay = False
  c.rl.router_aux_coef = 0.0
  c.moe = ml_collections.ConfigDict(dict(impl="auto"))

  # §8 memory and corpus
  c.memory = ml_collections.ConfigDict(dict(capacity=200, code_chars=2000, n_positive=2,
                                            top_regret=10, band_low=0.15, band_high=0.85,
                                            negative_above=0.9, negative_below=0.1,
                                            enabled=True,
                                            # What a designer prompt shows while memory holds
                                            # no positive of its skill: "starter" (the skill's
                                            # shortest hand-written environment, for the
                                            # format) or "none". Nothing when memory is off.
                                            cold_start_example="starter"))
  # Designer grounding: a JSONL file with a `text` field (path), or the built-in corpus of
  # standard-library docstrings (builtin=true, for smoke runs); the paper presets need one.
  c.corpus = ml_collections.ConfigDict(dict(path="", builtin=False, max_words=6000,
                                            enabled=True))

  c.checkpoint_every = 1  # rollout steps between checkpoints
  c.keep_checkpoints = 3

  if preset == "local":  # sized for 2 CPU cores: two windows, every phase exercised once
    c.total_steps = 4
    c.warm_start.config = "configs/sft.py:local"  # the protocol first: returns above zero
    c.k = 2
    c.envs_per_regen = 2
    c.plays_per_env = 4
    c.hinted_plays = 4
    c.attempts_per_slot = 1
    c.starter_fill = True  # SmolLM2-135M writes no valid program: keep the agent busy
    c.corpus.builtin = True
    c.global_batch = 16
    c.env.max_turns = 6  # the starters need 3 to 6 turns played well (the warm start: 6)
    c.agent.max_new_tokens = 48
    c.agent_context = 1024
    c.designer.max_new_tokens = 192
    c.hint.max_new_tokens = 32
    c.corpus.max_words = 120
    c.optim.micro_batch = 4  # bounds activation memory of the 16 x ~1k-token batch
  elif preset == "qwen3_4b":
    c.model = ""  # required: --config.model=/path/to/Qwen3-4B
    c.dtype = "bfloat16"
    c.mesh.data, c.mesh.fsdp = 1, -1
  elif preset == "qwen3_8b":
    c.model = ""
    c.dtype = "bfloat16"
    c.mesh.data, c.mesh.fsdp = 1, -1
    c.rl.kl_beta = 0.005
    c.designer.max_new_tokens = 20000
  elif preset == "qwen3_30b_a3b":
    c.model = ""
    c.dtype = "bfloat16"
    # From `python -m spade_jax.plan` (README, MoE): experts over 8 devices, which also split the
    # batch, FSDP over the rest; one row per device per micro-batch on a v5p-64 slice (45 of
    # 95 GB). An 8 x H200 node: --config.optim.micro_batch=8 --config.agent_context=16384.
    c.mesh.data, c.mesh.fsdp, c.mesh.expert = 1, -1, 8
    c.rules.batch = ("data", "fsdp", "expert")
    c.optim.micro_batch = 64
    c.rl.routing_replay = True
  else:
    raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
  return c
