"""Train-step benchmark: `python -m spade_jax.bench train --model smollm2-135m --batch 8 --seq 256`.

Times full learner steps (forward, backward, AdamW on the GRPO loss; compile excluded) on a
synthetic batch whose second half of every row is trained, and prints one JSON line with
tokens_per_s (all B x T tokens per step), step_s, compile_s and, on an accelerator of known
peak, mfu. `--compare_torch` also times the same step in PyTorch (transformers' model of the
same GGUF, float32 weights, the same loss, torch.optim.AdamW; with `--dtype bfloat16` its
forward and loss run under torch.autocast(bfloat16), PyTorch's own mixed precision) in the same
process, alternating one step of each so that machine load hits both alike, and adds
torch_tokens_per_s, speedup (ratio of the median step times) and speedup_paired (median of the
per-pair ratios: each torch step against the step of ours just before it, which saw the same
machine load; the steadier figure on a noisy machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import numpy as np

from spade_jax import bench
from spade_jax import cli
from spade_jax import learner as learner_lib
from spade_jax import loading, moe, sharding
from spade_jax import model as model_lib

# Dense bf16 peak FLOP/s by device kind substring, for MFU.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "v5p": 459e12,
              "v6": 918e12, "v5 lite": 197e12, "v5e": 197e12, "v4": 275e12}


def train_flops_per_token(cfg: model_lib.ModelConfig, T: int) -> float:
  """6 x (matmul params, output projection included) + attention scores/values, fwd + bwd; of a
  mixture of experts only the active share (k of E experts, and the router) counts."""
  table = model_lib.param_table(cfg)
  n = sum(int(np.prod(s.shape)) * moe.active_fraction(k, cfg) for k, s in table.items()
          if k.split("/")[-1].startswith(("w", "router")) and "norm" not in k or k == "lm_head")
  if cfg.tie_embeddings:
    n += cfg.vocab_size * cfg.d_model
  return 6.0 * n + 12.0 * cfg.n_layers * T * cfg.n_heads * cfg.head_dim


def paired_speedup(ours_s, theirs_s) -> float:
  """Median over alternated step pairs of their time / our time."""
  if not ours_s or len(ours_s) != len(theirs_s):
    raise ValueError(f"need equal, non-empty step lists, got {len(ours_s)} and {len(theirs_s)}")
  return statistics.median(t / o for o, t in zip(ours_s, theirs_s))


def synthetic_batch(B: int, T: int, vocab: int, seed: int = 0, group: int = 1):
  """Random rows whose first half is the prompt and second half the trained completion; rows in
  consecutive groups of `group` share their prompt, as a GRPO group's samples do."""
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), np.float32)
  mask[:, T // 2:] = 1.0
  tokens = rng.integers(0, vocab, (B, T)).astype(np.int32)
  tokens[:, :T // 2] = tokens[np.arange(B) // group * group, :T // 2]
  return {
      "tokens_BT": tokens,
      "loss_mask_BT": mask,
      "advantages_B": rng.normal(size=B).astype(np.float32),
      "logp_behaviour_BT": np.full((B, T), -10.0, np.float32),
      "temperature_B": np.full(B, 0.6, np.float32),
  }


def torch_step_fn(spec: str, batch, lcfg: learner_lib.LearnerConfig, dtype: str = "float32"):
  """The same GRPO step in PyTorch, for the side-by-side comparison."""
  import torch
  from transformers import AutoModelForCausalLM

  from spade_jax import gguf_io

  path = gguf_io.embedded_gguf_path(spec) if spec in gguf_io.EMBEDDED else spec
  model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                               gguf_file=os.path.basename(path),
                                               dtype=torch.float32)
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=lcfg.lr, betas=(lcfg.b1, lcfg.b2),
                          eps=lcfg.adam_eps, weight_decay=lcfg.weight_decay)
  tok = torch.from_numpy(batch["tokens_BT"]).long()
  mask = torch.from_numpy(batch["loss_mask_BT"])[:, 1:]
  adv = torch.from_numpy(batch["advantages_B"])[:, None]
  beh = torch.from_numpy(batch["logp_behaviour_BT"])[:, 1:]
  temp = torch.from_numpy(batch["temperature_B"])[:, None, None]

  def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
      logits = model(tok).logits[:, :-1].float() / temp
    logp = torch.log_softmax(logits, -1).gather(-1, tok[:, 1:, None])[..., 0]
    old = logp.detach()
    ratio = torch.exp(logp - old)
    pg = torch.maximum(-ratio * adv, -ratio.clamp(1 - lcfg.eps_low, 1 + lcfg.eps_high) * adv)
    w = torch.exp(old - beh).clamp(max=lcfg.tis_cap)
    loss = ((mask * w * pg).sum(1) / mask.sum(1)).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), lcfg.max_grad_norm)
    opt.step()
    return float(loss.detach())

  return step


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m spade_jax.bench train", description=__doc__,
                               epilog=cli.ALIAS_NOTE,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m", metavar="SPEC",
                  help="a model SPEC (see spade_jax.loading) (default: %(default)s)")
  ap.add_argument("--batch", type=int, default=8, metavar="B",
                  help="rows per step (default: %(default)s)")
  ap.add_argument("--seq", type=int, default=256, metavar="T",
                  help="tokens per row, the second half trained (default: %(default)s)")
  ap.add_argument("--group", type=int, default=1, metavar="G",
                  help="rows per prompt: groups of rows share their first half")
  ap.add_argument("--steps", type=int, default=3, help="timed steps (after one compile step)")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                  help="compute dtype (master params stay float32)")
  ap.add_argument("--micro_batch", type=int, default=0, metavar="N",
                  help="rows per accumulated micro-batch; 0: the whole batch at once")
  ap.add_argument("--chunk", type=int, default=256, metavar="N",
                  help="sequence positions scored at a time, which bounds the [B, chunk, V] "
                  "logits (default: %(default)s)")
  ap.add_argument("--remat", action="store_true",
                  help="recompute each layer's activations in the backward pass (less memory)")
  ap.add_argument("--entropy", action="store_true", help="also compute the entropy metric")
  ap.add_argument("--no_share_prefix", action="store_true",
                  help="score every row's prompt separately even where rows share it")
  ap.add_argument("--moe_impl", default="auto", choices=moe.IMPLS,
                  help="a MoE model's grouped matmul (default: %(default)s)")
  ap.add_argument("--compare_torch", action="store_true",
                  help="also time the same step in PyTorch (transformers, CPU), alternating "
                  "step by step; adds speedup and speedup_paired")
  return ap


def main(argv=None) -> None:
  ap = parser()
  args = ap.parse_args(cli.underscored(sys.argv[1:] if argv is None else argv))
  if args.group < 1 or args.batch % args.group:
    ap.error(f"--group {args.group} must divide --batch {args.batch}")

  mesh = sharding.make_mesh({"data": -1})
  loaded = loading.load_model(args.model, mesh, dtype=args.dtype, tokenizer=False)
  lcfg = learner_lib.LearnerConfig(micro_batch=args.micro_batch, chunk=args.chunk,
                                   remat=args.remat, entropy=args.entropy,
                                   share_prefix=not args.no_share_prefix,
                                   moe_impl=args.moe_impl)
  lrn = learner_lib.make_learner(loaded.cfg, lcfg, mesh)
  state = lrn.init_state(loaded.params)
  batch = synthetic_batch(args.batch, args.seq, loaded.cfg.vocab_size, group=args.group)

  t0 = time.perf_counter()
  state, m = lrn.train_step(state, batch)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t0
  torch_step = (torch_step_fn(args.model, batch, lcfg, args.dtype) if args.compare_torch
                else None)
  if torch_step:
    torch_step()  # warm-up

  ours, theirs = [], []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    state, m = lrn.train_step(state, batch)
    jax.block_until_ready(m)
    ours.append(time.perf_counter() - t0)
    if torch_step:
      t0 = time.perf_counter()
      torch_step()
      theirs.append(time.perf_counter() - t0)

  tokens = args.batch * args.seq
  step_s = statistics.median(ours)
  out = {"bench": "train", "model": args.model, "batch": args.batch, "seq": args.seq,
         "group": args.group, "share_prefix": lcfg.share_prefix,
         "dtype": args.dtype, "micro_batch": args.micro_batch, "remat": args.remat,
         "devices": len(jax.devices()), "platform": jax.devices()[0].platform,
         "tokens_per_s": round(tokens / step_s, 2), "step_s": round(step_s, 4),
         "compile_s": round(compile_s - step_s, 2), "loss": float(m["loss"]),
         "prefix_saving": round(float(m["prefix_saving"]), 3)}
  peak = bench.accelerator_peak(PEAK_FLOPS)
  if peak:
    flops = train_flops_per_token(loaded.cfg, args.seq) * tokens / step_s
    out["mfu"] = round(flops / (peak * len(jax.devices())), 4)
  if theirs:
    torch_s = statistics.median(theirs)
    out.update(torch_tokens_per_s=round(tokens / torch_s, 2), torch_step_s=round(torch_s, 4),
               speedup=round(torch_s / step_s, 3),
               speedup_paired=round(paired_speedup(ours, theirs), 3))
  print(json.dumps(out))
