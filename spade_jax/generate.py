"""Generation CLI: `python -m spade_jax.generate --model SPEC --prompt TEXT [--chat] ...`.

Every flag sets a field of configs/generate.py (see its docstring); `--config.x=y` sets any other.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from spade_jax import config as config_lib
from spade_jax import loading
from spade_jax import model as model_lib
from spade_jax import sharding
from spade_jax import tokenizer as tok_lib

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "generate.py")


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


def _filter_logits(logits_V, temperature, top_k, top_p):
  """Tempered logits with everything outside top-k / the top-p nucleus set to -inf."""
  logits_V = logits_V / temperature
  if top_k:
    kth = jax.lax.top_k(logits_V, top_k)[0][-1]
    logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
  order = jnp.argsort(-logits_V)
  probs = jax.nn.softmax(logits_V[order])
  keep_sorted = (jnp.cumsum(probs) - probs) < top_p  # always keeps the top token
  keep = jnp.zeros_like(keep_sorted).at[order].set(keep_sorted)
  return jnp.where(keep, logits_V, -jnp.inf)


def decode(loaded: loading.Loaded, prompt_ids: Sequence[int], c: ml_collections.ConfigDict,
           stop_ids: Sequence[int]) -> list[list[int]]:
  """Uncached decoding: every step re-runs the forward over a fixed-size buffer (one compile)."""
  cfg, n, T = loaded.cfg, len(prompt_ids), len(prompt_ids) + c.max_new_tokens
  if T > cfg.max_seq_len:
    raise ValueError(f"prompt ({n}) + max_new_tokens ({c.max_new_tokens}) exceeds the model's "
                     f"context of {cfg.max_seq_len} tokens")
  B = c.num_samples

  @jax.jit
  def step(params, buf_BT, t, key):
    logits = model_lib.forward(params, buf_BT, cfg)
    last_BV = jnp.take(logits, t - 1, axis=1)
    if c.greedy:
      return jnp.argmax(last_BV, axis=-1)
    keys = jax.random.split(key, B)
    filt = jax.vmap(lambda l: _filter_logits(l, c.temperature, c.top_k, c.top_p))(last_BV)
    return jax.vmap(jax.random.categorical)(keys, filt)

  buf = np.zeros((B, T), np.int32)
  buf[:, :n] = prompt_ids
  done = np.zeros(B, bool)
  out: list[list[int]] = [[] for _ in range(B)]
  key = jax.random.key(c.seed)
  for t in range(n, T):
    nxt = np.asarray(step(loaded.params, buf, t, jax.random.fold_in(key, t)))
    for b in np.flatnonzero(~done):
      out[b].append(int(nxt[b]))
      done[b] = int(nxt[b]) in stop_ids
    buf[:, t] = nxt
    if done.all():
      break
  return out


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
  completions = decode(loaded, prompt_ids, c, stops)
  return [tok.decode([t for t in ids if t not in stops]) for ids in completions]


def parse(argv: Sequence[str]) -> ml_collections.ConfigDict:
  c, rest = config_lib.from_argv(argv, DEFAULT_CONFIG)
  p = argparse.ArgumentParser(prog="python -m spade_jax.generate", description=__doc__)
  p.add_argument("--model")
  p.add_argument("--prompt")
  p.add_argument("--chat", action="store_true", default=None)
  p.add_argument("--greedy", action="store_true", default=None)
  p.add_argument("--temperature", type=float)
  p.add_argument("--top_p", type=float)
  p.add_argument("--top_k", type=int)
  p.add_argument("--max_new_tokens", type=int)
  p.add_argument("--num_samples", type=int)
  p.add_argument("--seed", type=int)
  p.add_argument("--dtype", choices=("float32", "bfloat16"))
  args = p.parse_args(rest)
  for k, v in vars(args).items():
    if v is not None:
      c[k] = v
  return c


def main(argv: Sequence[str] | None = None) -> None:
  sharding.initialize_distributed()
  try:
    c = parse(sys.argv[1:] if argv is None else argv)
    completions = run(c)
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    sys.exit(f"error: {e.args[0] if isinstance(e, KeyError) else e}")
  if jax.process_index() != 0:
    return
  for i, text in enumerate(completions):
    if c.num_samples > 1:
      print(f"--- sample {i}")
    print(text)


if __name__ == "__main__":
  main()
