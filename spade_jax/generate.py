"""Generation CLI: `python -m spade_jax.generate --model SPEC --prompt TEXT [--chat] ...`.

Every flag sets a field of configs/generate.py (see its docstring); `--config.x=y` sets any other.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import jax
import ml_collections

from spade_jax import cli
from spade_jax import config as config_lib
from spade_jax import hostmem
from spade_jax import loading
from spade_jax import sampling
from spade_jax import sharding
from spade_jax import tokenizer as tok_lib


def validate(c: ml_collections.ConfigDict) -> None:
  problems = []
  if not c.prompt:
    problems.append("prompt is empty (--prompt TEXT)")
  if not c.greedy and c.temperature <= 0:
    problems.append(f"temperature must be > 0 (or use --greedy), got {c.temperature}")
  if not 0 < c.top_p <= 1:
    problems.append(f"top_p must be in (0, 1], got {c.top_p}")
  if c.top_k < 0:
    problems.append(f"top_k must be >= 0, got {c.top_k}")
  if c.max_new_tokens <= 0 or c.num_samples <= 0:
    problems.append("max_new_tokens and num_samples must be positive")
  if c.dtype not in ("float32", "bfloat16"):
    problems.append(f"dtype must be float32 or bfloat16, got {c.dtype!r}")
  if problems:
    raise ValueError("invalid generate config: " + "; ".join(problems))
  config_lib.validate_mesh(c)


def decode(loaded: loading.Loaded, mesh, rules, prompt_ids: Sequence[int],
           c: ml_collections.ConfigDict) -> list[list[int]]:
  """`num_samples` completions of one prompt with the cached sampler (one shared prefill)."""
  if len(prompt_ids) + c.max_new_tokens > loaded.cfg.max_seq_len:
    raise ValueError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({c.max_new_tokens}) exceeds "
                     f"the model's context of {loaded.cfg.max_seq_len} tokens")
  sampler = sampling.Sampler.for_model(loaded, mesh, rules)
  settings = sampling.Settings(c.max_new_tokens, 0.0 if c.greedy else c.temperature,
                               0 if c.greedy else c.top_k, 1.0 if c.greedy else c.top_p)
  out = sampler.generate(loaded.params, [list(prompt_ids)], settings, c.seed, c.num_samples)
  return out.token_lists()


def run(c: ml_collections.ConfigDict) -> list[str]:
  validate(c)
  mesh = sharding.make_mesh(c.mesh.to_dict())
  loaded = loading.load_model(c.model, mesh, c.rules.to_dict(), c.dtype)
  tok = loaded.tokenizer
  if tok is None:
    raise ValueError(f"model {c.model!r} has no tokenizer; generation needs one")
  if c.chat:
    prompt_ids = tok_lib.encode(tok, tok_lib.render(tok, [{"role": "user", "content": c.prompt}]))
  else:
    prompt_ids = list(tok(c.prompt)["input_ids"])
  stops = tok_lib.stop_token_ids(tok)
  completions = decode(loaded, mesh, c.rules.to_dict(), prompt_ids, c)
  return [tok.decode([t for t in ids if t not in stops]) for ids in completions]


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m spade_jax.generate", description=__doc__,
                              epilog=cli.ALIAS_NOTE, allow_abbrev=False,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  config_lib.add_help(p, "configs/generate.py", "FILE[:ARG]")
  p.add_argument("--model", metavar="SPEC", help="embedded name (smollm2-135m), HF directory, "
                 ".gguf file, spade_jax checkpoint or random:PRESET")
  p.add_argument("--prompt", metavar="TEXT", help="the text to continue (or, with --chat, the "
                 "user's message)")
  p.add_argument("--chat", action="store_true", default=None,
                 help="render the prompt as one user turn with the model's chat template")
  p.add_argument("--greedy", action="store_true", default=None,
                 help="take the most likely token at every step (ignores the sampling flags)")
  p.add_argument("--temperature", type=float, metavar="T", help="sampling temperature, > 0")
  p.add_argument("--top_p", type=float, metavar="P", help="nucleus sampling mass, in (0, 1]")
  p.add_argument("--top_k", type=int, metavar="K",
                 help="sample among the k most likely tokens; 0: all")
  p.add_argument("--max_new_tokens", type=int, metavar="N",
                 help="tokens to generate at most per sample")
  p.add_argument("--num_samples", type=int, metavar="N",
                 help="completions of the prompt (one shared prefill)")
  p.add_argument("--seed", type=int, metavar="S", help="sampling seed")
  p.add_argument("--dtype", choices=("float32", "bfloat16"),
                 help="compute dtype (params stay float32)")
  return p


def parse(argv: Sequence[str]) -> ml_collections.ConfigDict:
  c, rest = config_lib.from_argv(cli.underscored(argv), config_lib.shipped("generate.py"))
  args = parser().parse_args(rest)
  for k, v in vars(args).items():
    if v is not None:
      c[k] = v
  return c


def _main(argv: Sequence[str]) -> None:
  hostmem.retain_freed_memory()
  sharding.initialize_distributed()
  try:
    c = parse(argv)
    completions = run(c)
  except (ValueError, KeyError, TypeError, OSError) as e:
    sys.exit(f"error: {e.args[0] if isinstance(e, KeyError) else e}")
  if jax.process_index() != 0:
    return
  for i, text in enumerate(completions):
    if c.num_samples > 1:
      print(f"--- sample {i}")
    print(text)


def main(argv: Sequence[str] | None = None) -> None:
  cli.quiet_broken_pipe(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
  main()
