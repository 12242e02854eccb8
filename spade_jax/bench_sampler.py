"""Sampler benchmark: `python -m spade_jax.bench sampler --model smollm2-135m --batch 8 ...`.

Prints one JSON line per (batch, capacity): steady-state `tokens_per_s` (compile excluded),
`compile_s`, and with `--compare_transformers` the tokens/s of transformers' `generate` on the
same weights, prompts and sampling settings (torch CPU, float32), measured in the same run, and the
ratio; `--compare_tunix` likewise times google/tunix's sampler (see `bench_tunix`) at the same
cache capacity. Every row generates exactly `--new_tokens` tokens (EOS ignored) with the agent's
settings (T 0.6, top-p 0.95, top-k 20). Batches and capacities take comma-separated lists, e.g.
`--batch 1,8,32 --capacity 256,2048`.

On an accelerator of known memory bandwidth each row also carries the memory roofline: a decode
step must read every weight it multiplies (the embedding table only if it is tied to the output
projection; of a mixture of experts only the experts its rows are routed to: the active
parameters for one row, E (1 - (1 - k/E)^batch) experts per layer under uniform routing) and each
row's live cache, so `roofline_tokens_per_s` = batch x bandwidth / those bytes, and
`roofline_fraction` is the measured steady-state tokens/s over it (prefill and sampling
included in the measured time, so it is a lower bound on how close decode runs to the roofline).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from spade_jax import bench
from spade_jax import cli
from spade_jax import loading
from spade_jax import moe
from spade_jax import sampling
from spade_jax import sharding


# Peak memory bandwidth (bytes/s) by device kind substring (vendor datasheets), for the roofline.
PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L4": 0.3e12,
                    "v5p": 2.765e12, "v6": 1.64e12, "v5 lite": 0.819e12, "v5e": 0.819e12,
                    "v4": 1.2e12}


def decode_bytes_per_step(cfg, params, batch: int, prompt_len: int, new_tokens: int) -> float:
  """Bytes one decode step must read, averaged over the generation: weights (as the sampler
  prepares them once per call, in the compute dtype) + the live KV cache."""
  itemsize = np.dtype(cfg.dtype).itemsize
  n = sum(x.size for x in jax.tree.leaves(params))
  if not cfg.tie_embeddings:  # an untied embedding table is gathered, not read whole
    n -= params["embed"].size
  if cfg.n_experts:  # the experts no row is routed to are not read
    experts = sum(x.size for k, x in params["moe"].items() if k != "router")
    n -= experts * (1 - moe.expected_experts_read(cfg, batch) / cfg.n_experts)
  live = prompt_len + (new_tokens + 1) / 2  # mean live slots per row over the decode steps
  kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * itemsize
  return n * itemsize + batch * live * kv


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x]


def _prompts(batch: int, prompt_len: int, vocab: int, seed: int) -> np.ndarray:
  # Token ids well inside the vocabulary, away from the special tokens at the start.
  return np.random.default_rng(seed).integers(100, vocab - 1, (batch, prompt_len), np.int64)


def _hf_model(spec: str):
  import torch
  from transformers import AutoModelForCausalLM

  from spade_jax import gguf_io

  # As many torch threads as cores this process may use (XLA's CPU client uses them all too).
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  if spec not in gguf_io.EMBEDDED:
    raise SystemExit("--compare_transformers needs an embedded model spec (e.g. smollm2-135m)")
  path = gguf_io.embedded_gguf_path(spec)
  m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                           gguf_file=os.path.basename(path), dtype=torch.float32)
  return m.eval()


def _hf_tokens_per_s(hf, prompts: np.ndarray, new_tokens: int, settings: sampling.Settings,
                     repeats: int) -> float:
  import torch

  ids = torch.as_tensor(prompts)
  kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=settings.temperature,
            top_p=settings.top_p, top_k=settings.top_k, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, pad_token_id=0)
  with torch.inference_mode():
    hf.generate(ids, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
    best = float("inf")
    for _ in range(repeats):
      t = time.perf_counter()
      out = hf.generate(ids, **kw)
      best = min(best, time.perf_counter() - t)
  assert out.shape[1] == prompts.shape[1] + new_tokens, out.shape
  return prompts.shape[0] * new_tokens / best


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m spade_jax.bench sampler", description=__doc__,
                              epilog=cli.ALIAS_NOTE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default="smollm2-135m", metavar="SPEC",
                 help="a model SPEC (see spade_jax.loading), e.g. random:qwen3_4b for an "
                 "architecture without its weights (default: %(default)s)")
  p.add_argument("--batch", default="8", metavar="LIST",
                 help="comma-separated batch sizes (default: 8)")
  p.add_argument("--prompt_len", type=int, default=64, metavar="N",
                 help="tokens of every random prompt (default: %(default)s)")
  p.add_argument("--new_tokens", type=int, default=128, metavar="N",
                 help="tokens every row generates, EOS ignored (default: %(default)s)")
  p.add_argument("--capacity", default="", metavar="LIST",
                 help="comma-separated cache capacities (default: the smallest bucket that fits)")
  p.add_argument("--num_samples", type=int, default=1, metavar="N",
                 help="completions per prompt (batch = prompts x num_samples)")
  p.add_argument("--repeats", type=int, default=2, metavar="N",
                 help="timed runs; the best is reported")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="compute dtype (default: %(default)s)")
  p.add_argument("--moe_impl", default="auto", choices=moe.IMPLS,
                 help="a MoE model's grouped matmul (default: %(default)s)")
  p.add_argument("--compare_transformers", action="store_true",
                 help="also time transformers' generate (torch CPU, float32) on the same "
                 "weights and prompts; needs an embedded model")
  p.add_argument("--compare_tunix", action="store_true",
                 help="also time google/tunix's sampler (pip install --no-deps -r "
                 "requirements-peer.txt)")
  return p


def main(argv) -> None:
  a = parser().parse_args(cli.underscored(argv))

  mesh = sharding.make_mesh({"data": -1}, jax.devices()[:1])
  loaded = loading.load_model(a.model, mesh, dtype=a.dtype, tokenizer=False)
  sampler = sampling.Sampler(loaded.cfg, mesh, moe_impl=a.moe_impl)
  settings = sampling.Settings(max_new_tokens=a.new_tokens, temperature=0.6, top_k=20,
                               top_p=0.95, ignore_eos=True)
  hf = _hf_model(a.model) if a.compare_transformers else None
  bandwidth = bench.accelerator_peak(PEAK_BYTES_PER_S)
  if a.compare_tunix:
    from spade_jax import bench_tunix
    tunix = bench_tunix.TunixPeer(loaded, a.dtype)
  for batch in _ints(a.batch):
    if batch % a.num_samples:
      raise SystemExit(f"batch {batch} is not a multiple of num_samples {a.num_samples}")
    prompts = _prompts(batch // a.num_samples, a.prompt_len, loaded.cfg.vocab_size, 0)
    hf_tps = None
    if hf is not None:
      hf_tps = _hf_tokens_per_s(hf, np.repeat(prompts, a.num_samples, 0), a.new_tokens, settings,
                                a.repeats)
    for capacity in _ints(a.capacity) or [None]:
      def run(seed):
        t = time.perf_counter()
        out = sampler.generate(loaded.params, prompts.tolist(), settings, seed, a.num_samples,
                               capacity)
        dt = time.perf_counter() - t
        assert (out.lengths == a.new_tokens).all(), out.lengths
        return dt

      first = run(0)
      steady = min(run(1 + r) for r in range(a.repeats))
      tps = batch * a.new_tokens / steady
      row = dict(model=a.model, device=jax.devices()[0].device_kind, batch=batch,
                 prompt_len=a.prompt_len, new_tokens=a.new_tokens, num_samples=a.num_samples,
                 capacity=capacity or "auto", dtype=a.dtype, tokens_per_s=round(tps, 1),
                 step_ms=round(1000 * steady / a.new_tokens, 2),
                 compile_s=round(first - steady, 2))
      if bandwidth:
        bytes_step = decode_bytes_per_step(loaded.cfg, loaded.params, batch, a.prompt_len,
                                           a.new_tokens)
        roof = batch * bandwidth / bytes_step
        row.update(roofline_tokens_per_s=round(roof, 1), roofline_fraction=round(tps / roof, 3))
      if hf_tps is not None:
        row.update(transformers_tokens_per_s=round(hf_tps, 1), ratio=round(tps / hf_tps, 2))
      if a.compare_tunix:
        S = sampler.capacity(a.prompt_len + a.new_tokens, capacity)
        t_tps = tunix.tokens_per_s(np.repeat(prompts, a.num_samples, 0), settings, S, a.repeats)
        row.update(tunix_capacity=S, tunix_tokens_per_s=round(t_tps, 1),
                   tunix_ratio=round(tps / t_tps, 2))
      print(json.dumps(row), flush=True)
