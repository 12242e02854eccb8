"""Warm start by supervised fine-tuning: `python -m spade_jax.sft --config=configs/sft.py:local
--workdir=DIR [--config.KEY=VALUE ...]`. Rerunning the same command on the same workdir resumes
from the last checkpoint; a finished run is not rerun. `DIR/checkpoints` is then a model SPEC
(`python -m spade_jax.train --config.model=DIR/checkpoints`).

The data (`sft_data`): environments played in the sandbox with their own solutions, rendered as
the self-play agent's episodes, and designer prompts answered with complete programs. The model,
sharding, optimizer and checkpoints are the self-play learner's; only its objective differs
(`LearnerConfig.objective = "sft"`: the mean over samples of each sample's token-mean negative
log-likelihood of its assistant tokens, through the learner's own scoring path).

Library use (what a self-play job calls to start from a cached warm start):

    spec = sft.ensure(sft.config("configs/sft.py:local"), "/tmp/spade_local/warm_start")
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Sequence

import ml_collections

from spade_jax import cli
from spade_jax import config as config_lib
from spade_jax import hostmem
from spade_jax import train as train_cli

PROG = "python -m spade_jax.sft"
DEFAULT_CONFIG = config_lib.shipped("sft.py")
DONE = "warm_start.json"  # written once the last checkpoint is on disk


def validate(c: ml_collections.ConfigDict) -> None:
  """Every problem with the config, in one error, before anything is loaded."""
  from spade_jax import sft_data
  from spade_jax.sandbox import pool as sandbox_pool

  p = []
  if not c.model:
    p.append("model is empty: pass --config.model=/path/to/hf_dir (or an embedded name)")
  if c.model.startswith("random:") and not c.tokenizer:
    p.append(f"model {c.model!r} has no tokenizer: pass --config.tokenizer=SPEC")
  d = c.data
  if not (d.starters or d.families or d.dirs):
    p.append("data: no source (starters, families and dirs are all off)")
  for name in ("seeds_per_env", "max_turns", "max_len", "designer_max_len", "min_turns"):
    if d[name] <= 0:
      p.append(f"data.{name} must be positive, got {d[name]}")
  if any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in d.levels):
    p.append(f"data.levels must be ints >= 1, got {d.levels}")
  if not 0 <= d.designer_share < 1:
    p.append(f"data.designer_share must lie in [0, 1), got {d.designer_share}")
  if d.designer_memory not in sft_data.MEMORY_MODES:
    p.append(f"data.designer_memory {d.designer_memory!r} is not one of "
             f"{sft_data.MEMORY_MODES}")
  try:
    ok = d.reasoning.count("{action}") == 1 and d.reasoning.format(action="x")
  except (KeyError, IndexError, ValueError):
    ok = False
  if not ok:
    p.append(f"data.reasoning {d.reasoning!r} must name {{action}} once and nothing else")
  p += sft_data.check_dirs(d.dirs)
  if c.corpus.path and not os.path.exists(c.corpus.path):
    p.append(f"corpus.path {c.corpus.path!r} does not exist")
  if d.designer_share and not c.corpus.path and not c.corpus.builtin:
    p.append("corpus: designer examples need documents: --config.corpus.path=DOCS.jsonl or "
             "--config.corpus.builtin=true (or --config.data.designer_share=0)")
  if c.corpus.path and c.corpus.builtin:
    p.append("corpus: path and builtin=true both given; choose one")
  if c.max_steps < 0:
    p.append(f"max_steps must be >= 0 (0 = all epochs), got {c.max_steps}")
  for name in ("epochs", "batch", "length_multiple", "checkpoint_every", "keep_checkpoints"):
    if c[name] <= 0:
      p.append(f"{name} must be positive, got {c[name]}")
  o = c.optim
  if o.lr <= 0 or o.micro_batch < 0 or o.chunk <= 0:
    p.append("optim: lr and chunk must be > 0 and micro_batch >= 0")
  if o.micro_batch and c.batch % o.micro_batch:
    p.append(f"batch {c.batch} is not a multiple of optim.micro_batch {o.micro_batch}")
  if c.env.workers <= 0 or c.env.memory_mb <= 0 or c.env.step_timeout_s <= 0:
    p.append("env: workers, memory_mb and step_timeout_s must be positive")
  unknown = set(c.env.require) - set(sandbox_pool.PROTECTIONS)
  if unknown:
    p.append(f"env.require: unknown protections {sorted(unknown)}; known: "
             f"{sandbox_pool.PROTECTIONS}")
  if p:
    raise ValueError("invalid config:\n  - " + "\n  - ".join(p))
  config_lib.validate_mesh(c)


def parser(spec: str = DEFAULT_CONFIG) -> argparse.ArgumentParser:
  return train_cli.job_parser(
      PROG, __doc__, spec, "configs/sft.py, preset local",
      "the run's directory (metrics, data summary, checkpoints), created if missing; rerunning "
      "the same command on it resumes, a finished run is kept")


def parse(argv: Sequence[str]) -> tuple[ml_collections.ConfigDict, argparse.Namespace]:
  return train_cli.parse_job(argv, DEFAULT_CONFIG, parser, validate)


def config(spec: str = "configs/sft.py:local", overrides: Sequence[str] = ()
           ) -> ml_collections.ConfigDict:
  """The validated config of `spec` with ['KEY=VALUE', ...] applied (library callers)."""
  c = config_lib.build(spec, overrides)
  validate(c)
  return c


def digest(c: ml_collections.ConfigDict) -> str:
  """Names the config a warm start was made with (its printed form)."""
  return hashlib.sha256(str(c).encode()).hexdigest()[:16]


def finished(workdir: str) -> dict | None:
  """The summary of a finished warm start in `workdir`, else None (nothing is loaded)."""
  path = os.path.join(workdir, DONE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def ensure(c: ml_collections.ConfigDict, workdir: str, progress=None) -> str:
  """The model SPEC of config `c`'s warm start in `workdir`: made (or resumed) on first use,
  taken as it is once finished. A finished one made with another config is an error."""
  done = finished(workdir)
  if done is None:
    from spade_jax import sft_loop

    done = sft_loop.run(c, workdir, progress)
  elif done["config_digest"] != digest(c):
    raise ValueError(f"{workdir} holds a warm start made with another config (digest "
                     f"{done['config_digest']}, this one {digest(c)}); remove it or pick "
                     "another directory")
  elif progress is not None:
    progress.line(f"warm start: {done['spec']} (cached: {done['steps']} steps, made in "
                  f"{done['time_s']:.0f} s)")
  return done["spec"]


def cache_root() -> str:
  """Where self-play jobs keep the warm starts they make: `$SPADE_JAX_CACHE/warm_starts`, else
  `$XDG_CACHE_HOME/spade_jax/warm_starts`, else `~/.cache/spade_jax/warm_starts`."""
  base = os.environ.get("SPADE_JAX_CACHE") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spade_jax")
  return os.path.join(base, "warm_starts")


def for_selfplay(ws: ml_collections.ConfigDict, model: str, tokenizer: str = ""
                 ) -> tuple[ml_collections.ConfigDict, str]:
  """(SFT config, directory) of a self-play config's `warm_start` block for its `model` (and
  `tokenizer`): the SFT preset `ws.config` made from them with `ws.overrides`, kept in `ws.dir`
  or, by default, in the cache under the config's digest (one warm start per distinct config)."""
  c = config(ws.config, [f"model={model}", f"tokenizer={tokenizer}", *ws.overrides])
  return c, ws.dir or cached_dir(c)


def cached_dir(c: ml_collections.ConfigDict) -> str:
  """The cache's directory of config `c`'s warm start (one per distinct config)."""
  return os.path.join(cache_root(), digest(c))


def ensure_locked(c: ml_collections.ConfigDict, workdir: str, progress=None) -> str:
  """`ensure`, holding `workdir`'s lock: two jobs wanting one cached warm start make it once
  (the second waits, then takes it as finished)."""
  import fcntl

  os.makedirs(os.path.dirname(os.path.abspath(workdir)), exist_ok=True)
  with open(os.path.abspath(workdir) + ".lock", "w") as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      if progress is not None:
        progress.line(f"warm start: {workdir} is being made by another job; waiting for it")
      fcntl.flock(lock, fcntl.LOCK_EX)
    return ensure(c, workdir, progress)


def warm_start(c, workdir: str, progress) -> str:
  """The model SPEC a self-play job of config `c` starts from: `c.model`, or its warm start
  (`c.warm_start`), made on first use (the SFT's own progress lines, its time at the end) and
  taken from the cache after that; `workdir/warm_start.json` says which (the report shows it). A resumed run asks for
  it too: the KL reference is the warm start."""
  if not c.warm_start.config:
    return c.model
  from spade_jax.selfplay import outputs

  sc, where = for_selfplay(c.warm_start, c.model, c.tokenizer)
  cached = finished(where) is not None
  t0 = time.perf_counter()
  if cached:
    spec = ensure_locked(sc, where, progress)  # one line: the cached SPEC, its time
  else:
    with progress.phase("warm start", f"{c.warm_start.config} from {c.model} into {where}"):
      spec = ensure_locked(sc, where, progress)
    progress.line(f"warm start: made in {time.perf_counter() - t0:.0f} s; {spec} (cached: a "
                  "rerun takes it as it is)")
  done = finished(where) or {}
  info = {"spec": spec, "config": c.warm_start.config, "from": c.model, "cached": cached,
          "steps": done.get("steps"), "time_s": done.get("time_s"),
          "final_loss": done.get("final_loss"),
          "agent_examples": done.get("data", {}).get("agent_examples"),
          "designer_examples": done.get("data", {}).get("designer_examples")}
  os.makedirs(workdir, exist_ok=True)
  outputs.write_text(os.path.join(workdir, "warm_start.json"), json.dumps(info, indent=1) + "\n")
  return spec


def _main(argv: Sequence[str]) -> None:
  try:
    c, args = parse(argv)
    if args.print_config:
      print(c)
      return
    hostmem.retain_freed_memory()
    created = train_cli.check_workdir(args.workdir)
    train_cli.check_model(c)
    done = finished(args.workdir)
    if done is not None and done["config_digest"] != digest(c):
      raise ValueError(f"workdir {args.workdir!r} holds a finished warm start made with "
                       "another config; remove it or pick another --workdir")
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    train_cli._fail(e)
  if done is not None:
    print(f"spade_jax.sft: {args.workdir} is finished ({done['steps']} steps); model SPEC "
          f"{done['spec']}", file=sys.stderr)
    print(done["spec"])
    return
  print(f"spade_jax.sft: model {c.model}, workdir {args.workdir}", file=sys.stderr, flush=True)
  from spade_jax import sharding
  from spade_jax.convert import CheckpointError

  sharding.initialize_distributed()
  t0 = time.perf_counter()
  try:
    from spade_jax import sft_loop

    done = sft_loop.run(c, args.workdir)
  except BaseException as e:
    train_cli.remove_if_empty(args.workdir, created)
    from spade_jax.sft_data import DataError

    if isinstance(e, (CheckpointError, OSError, DataError)) and not isinstance(
        e, BrokenPipeError):
      train_cli._fail(e)
    raise
  print(f"spade_jax.sft: done in {time.perf_counter() - t0:.0f} s; model SPEC {done['spec']}",
        file=sys.stderr)
  print(done["spec"])


def main(argv: Sequence[str] | None = None) -> None:
  cli.quiet_broken_pipe(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
  main()
