"""Self-play training entry point: `python -m spade_jax.train --config=configs/spade.py:local
--workdir=DIR [--config.total_steps=N ...]`. Rerunning the same command on the same workdir
resumes from the last checkpoint.

The flags are parsed and the config is validated before anything heavy is imported, so `--help`
and `--print_config` answer at once. The workdir and the model SPEC are checked before the
workdir is created; a run that fails to start removes the directories it created while they are
still empty.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import ml_collections

from spade_jax import cli
from spade_jax import config as config_lib
from spade_jax import hostmem

PROG = "python -m spade_jax.train"
DEFAULT_CONFIG = config_lib.shipped("spade.py")


def validate(c: ml_collections.ConfigDict) -> None:
  """Every problem with the config, in one error, before anything is loaded."""
  p = []
  if not c.model:
    p.append("model is empty: pass --config.model=/path/to/hf_dir (or an embedded name)")
  if c.model.startswith("random:") and not c.tokenizer:
    p.append(f"model {c.model!r} has no tokenizer: pass --config.tokenizer=SPEC")
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
  from spade_jax import rl
  if c.reward.variant not in rl.DESIGNER_REWARDS:
    p.append(f"reward.variant {c.reward.variant!r} is not one of {sorted(rl.DESIGNER_REWARDS)}")
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
  from spade_jax.selfplay import baselines
  if c.method not in baselines.METHODS:
    p.append(f"method {c.method!r} is not one of {baselines.METHODS}")
  if c.fixed_pool and not os.path.isdir(c.fixed_pool):
    p.append(f"fixed_pool {c.fixed_pool!r} is not a directory")
  from spade_jax.sandbox import families
  unknown = [f for f in c.rlve.families if f not in families.NAMES]
  if unknown:
    p.append(f"rlve.families: unknown {unknown}; known: {list(families.NAMES)}")
  if not 0 < c.rlve.tau_acc <= 1 or c.rlve.tau_num < 1 or c.rlve.d_delta < 1:
    p.append("rlve: need 0 < tau_acc <= 1, tau_num >= 1 and d_delta >= 1")
  if c.fixed_pool and c.method != "fixed_grpo":
    p.append(f"fixed_pool is set but method is {c.method!r} (fixed_pool is fixed_grpo's)")
  if c.method == "spade" and c.corpus.enabled and not c.corpus.path and not c.corpus.builtin:
    p.append("corpus: give the designer's documents with --config.corpus.path=DOCS.jsonl (a "
             "`text` field per line), or --config.corpus.builtin=true for the built-in "
             "standard-library docstrings, or --config.corpus.enabled=false (skill-only prompts)")
  if c.corpus.path and c.corpus.builtin:
    p.append("corpus: path and builtin=true both given; choose one")
  from spade_jax.selfplay import designer
  if c.memory.cold_start_example not in designer.COLD_START:
    p.append(f"memory.cold_start_example {c.memory.cold_start_example!r} is not one of "
             f"{designer.COLD_START}")
  if c.designer.programs:
    try:
      designer.load_programs(c.designer.programs)
    except (OSError, ValueError) as e:
      p.append(str(e))
  if c.warm_start.config:
    from spade_jax import sft
    try:
      sft.for_selfplay(c.warm_start, c.model, c.tokenizer)
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
      text = str(e.args[0] if isinstance(e, KeyError) else e)
      p += [f"warm_start ({c.warm_start.config}): {x}"
            for x in text.removeprefix("invalid config:\n  - ").split("\n  - ")]
  elif c.warm_start.dir or c.warm_start.overrides:
    p.append("warm_start: dir / overrides are set but warm_start.config is empty")
  if p:
    raise ValueError("invalid config:\n  - " + "\n  - ".join(p))
  config_lib.validate_mesh(c)


def _presets_text(spec: str) -> str:
  """The help's list of the config file's presets (its module-level PRESETS, if it has one)."""
  path = config_lib.resolve(spec.partition(":")[0])
  presets = getattr(config_lib.load_module(path), "PRESETS", {})
  name = path
  if os.path.dirname(os.path.abspath(path)) == os.path.abspath(config_lib.shipped_dir()):
    name = "configs/" + os.path.basename(path)  # as the README spells the shipped ones
  if not presets:
    return f"{name} declares no presets."
  width = max(map(len, presets))
  lines = [f"  {k:<{width}}  {v}" for k, v in presets.items()]
  return f"presets of {name} (--config={name}:PRESET):\n" + "\n".join(lines)


def job_parser(prog: str, doc: str, spec: str, config_help: str, workdir_help: str
               ) -> argparse.ArgumentParser:
  """The flags of a job entry point (train, sft): --config, --workdir, --print_config."""
  p = argparse.ArgumentParser(
      prog=prog, description=doc.split("\n\n")[0], allow_abbrev=False,
      epilog=f"{_presets_text(spec)}\n\n{cli.ALIAS_NOTE}",
      formatter_class=argparse.RawDescriptionHelpFormatter)
  config_lib.add_help(p, config_help, "FILE[:PRESET]")
  p.add_argument("--workdir", metavar="DIR", help=workdir_help)
  p.add_argument("--print_config", action="store_true",
                 help="print the resolved config (preset and overrides applied, validated) and "
                 "exit without loading anything")
  return p


def parse_job(argv: Sequence[str], default: str, make_parser, check
              ) -> tuple[ml_collections.ConfigDict, argparse.Namespace]:
  """(config checked by `check`, flags) of a job entry point; `--help` exits here, before any
  config is built."""
  spec, assignments, rest = config_lib.split_argv(cli.underscored(argv), default)
  p = make_parser(spec)
  args = p.parse_args(rest)
  if not args.workdir and not args.print_config:
    p.error("--workdir is required")
  c = config_lib.build(spec, assignments)
  check(c)
  return c, args


def parser(spec: str = DEFAULT_CONFIG) -> argparse.ArgumentParser:
  return job_parser(PROG, __doc__, spec, "configs/spade.py, preset local",
                    "the run's directory (metrics, pool, checkpoints, report), created if "
                    "missing; rerunning the same command on it resumes")


def parse(argv: Sequence[str]) -> tuple[ml_collections.ConfigDict, argparse.Namespace]:
  """(validated config, flags); `--help` exits here, before any config is built."""
  return parse_job(argv, DEFAULT_CONFIG, parser, validate)


def check_workdir(workdir: str) -> str | None:
  """Fails on a workdir that cannot be one; returns the topmost directory that creating it
  will make (None if it exists), which a failed start may remove again."""
  path = os.path.abspath(workdir)
  if os.path.exists(path):
    if not os.path.isdir(path):
      raise ValueError(f"workdir {workdir!r} exists and is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
      raise ValueError(f"workdir {workdir!r} is not writable")
    return None
  top, parent = path, os.path.dirname(path)
  while not os.path.exists(parent):
    top, parent = parent, os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ValueError(f"workdir {workdir!r}: {parent!r} is not a directory")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ValueError(f"workdir {workdir!r}: cannot create directories in {parent!r}")
  return top


def remove_if_empty(workdir: str, top: str | None) -> None:
  """Removes the workdir and its parents up to `top`, the ones this run created, while empty."""
  if top is None:
    return
  d = os.path.abspath(workdir)
  while True:
    try:
      os.rmdir(d)  # fails on a directory that is not empty: it is kept
    except OSError:
      return
    if d == top:
      return
    d = os.path.dirname(d)


def check_model(c: ml_collections.ConfigDict) -> None:
  """The checks the loader runs before it reads any weights (the SPEC names a model; the
  config, every file header, tensor name and shape), run here before the workdir exists."""
  from spade_jax import gguf_io, hf, loading

  kind = loading.spec_kind(c.model)  # CheckpointError for a SPEC that names nothing
  if kind == "hf":
    hf.open_checkpoint(c.model, hf.read_config(c.model, c.dtype))
  elif kind == "gguf":
    g = gguf_io.GGUFFile(c.model)
    g.open(g.config(c.dtype))
  if c.tokenizer and c.tokenizer not in gguf_io.EMBEDDED and not os.path.exists(c.tokenizer):
    raise loading.CheckpointError(f"tokenizer {c.tokenizer!r}: no such file or directory")


def _fail(e: BaseException) -> None:
  sys.exit(f"error: {e.args[0] if isinstance(e, KeyError) else e}")


def _main(argv: Sequence[str]) -> None:
  try:
    c, args = parse(argv)
    if args.print_config:
      print(c)
      return
    hostmem.retain_freed_memory()
    created = check_workdir(args.workdir)
    check_model(c)
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    _fail(e)
  # The first line, before the loop's imports and the model load, which take a while; progress
  # goes to stderr, as the loop's own lines do.
  print(f"spade_jax.train: model {c.model}, workdir {args.workdir}", file=sys.stderr, flush=True)
  from spade_jax import sharding
  from spade_jax.convert import CheckpointError

  sharding.initialize_distributed()
  try:
    from spade_jax.selfplay import loop, outputs

    loop.run(c, args.workdir)
  except BaseException as e:
    remove_if_empty(args.workdir, created)
    # ValueError: what a run finds wrong with its inputs once running (e.g. a fixed pool of
    # which nothing is admitted) -- said in one line, as the config's own problems are.
    if (isinstance(e, (CheckpointError, OSError, ValueError))
        and not isinstance(e, BrokenPipeError)):
      _fail(e)
    raise
  print(outputs.report(args.workdir, str(c)))


def main(argv: Sequence[str] | None = None) -> None:
  cli.quiet_broken_pipe(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
  main()
