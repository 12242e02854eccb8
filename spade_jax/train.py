"""Self-play training entry point: `python -m spade_jax.train --config=configs/spade.py:local
--workdir=DIR [--config.total_steps=N ...]`. Rerunning the same command on the same workdir
resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import ml_collections

from spade_jax import config as config_lib
from spade_jax import hostmem
from spade_jax import sharding

REWARD_VARIANTS = ("blend", "solve_rate", "regret", "learning_potential")


def validate(c: ml_collections.ConfigDict) -> None:
  """Every problem with the config, in one error, before anything is loaded."""
  p = []
  if not c.model:
    p.append("model is empty: pass --config.model=/path/to/hf_dir (or an embedded name)")
  for name in ("total_steps", "k", "envs_per_regen", "plays_per_env", "hinted_plays",
               "attempts_per_slot", "global_batch", "skills_per_window", "checkpoint_every",
               "keep_checkpoints", "agent_context"):
    if c[name] <= 0:
      p.append(f"{name} must be positive, got {c[name]}")
  if not c.skills or c.skills_per_window > len(c.skills):
    p.append(f"skills_per_window={c.skills_per_window} needs at least that many skills")
  from spade_jax.selfplay import prompts
  unknown = [s for s in c.skills if s not in prompts.SKILL_DESCRIPTIONS]
  if unknown:
    p.append(f"unknown skills {unknown}; known: {sorted(prompts.SKILL_DESCRIPTIONS)}")
  for role in ("agent", "designer", "hint"):
    s = c[role]
    if s.temperature < 0 or s.top_k < 0 or not 0 < s.top_p <= 1 or s.max_new_tokens <= 0:
      p.append(f"{role}: need temperature >= 0, top_k >= 0, 0 < top_p <= 1, max_new_tokens > 0")
  if c.reward.variant not in REWARD_VARIANTS:
    p.append(f"reward.variant {c.reward.variant!r} is not one of {REWARD_VARIANTS}")
  if not 0 <= c.reward.band_low <= c.reward.band_high <= 1 or c.reward.ramp <= 0:
    p.append("reward band must satisfy 0 <= band_low <= band_high <= 1 and ramp > 0")
  if c.rl.eps_low < 0 or c.rl.eps_high < 0 or c.rl.tis_cap <= 0 or c.rl.kl_beta < 0:
    p.append("rl: eps_low, eps_high, kl_beta must be >= 0 and tis_cap > 0")
  if c.optim.lr <= 0 or c.optim.micro_batch < 0:
    p.append("optim: lr must be > 0 and micro_batch >= 0")
  if c.optim.micro_batch and c.global_batch % c.optim.micro_batch:
    p.append(f"global_batch {c.global_batch} is not a multiple of micro_batch "
             f"{c.optim.micro_batch}")
  if c.env.max_turns <= 0 or c.env.workers <= 0 or c.env.memory_mb <= 0:
    p.append("env: max_turns, workers and memory_mb must be positive")
  from spade_jax.sandbox import pool as sandbox_pool
  unknown = set(c.env.require) - set(sandbox_pool.PROTECTIONS)
  if unknown:
    p.append(f"env.require: unknown protections {sorted(unknown)}; known: "
             f"{sandbox_pool.PROTECTIONS}")
  if c.corpus.path and not os.path.exists(c.corpus.path):
    p.append(f"corpus.path {c.corpus.path!r} does not exist")
  if p:
    raise ValueError("invalid config:\n  - " + "\n  - ".join(p))
  config_lib.validate_mesh(c)


def main(argv: Sequence[str] | None = None) -> None:
  hostmem.retain_freed_memory()
  sharding.initialize_distributed()
  argv = sys.argv[1:] if argv is None else argv
  try:
    c, rest = config_lib.from_argv(argv, config_lib.shipped("spade.py"))
    parser = argparse.ArgumentParser(prog="python -m spade_jax.train", description=__doc__)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args(rest)
    validate(c)
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    sys.exit(f"error: {e.args[0] if isinstance(e, KeyError) else e}")
  from spade_jax.selfplay import loop, outputs

  loop.run(c, args.workdir)
  print(outputs.report(args.workdir, str(c)))


if __name__ == "__main__":
  main()
