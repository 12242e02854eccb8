"""The warm start's run, in one function: `run(config, workdir)` (`spade_jax.sft` is its CLI).

  sources -> sandbox solution plays -> agent transcripts; programs x documents -> designer
  examples; examples by length bucket -> batches (shuffled, `epochs` passes)
  every batch: learner.train_step (objective "sft") -> metrics.jsonl, a progress line with ETA
  every `checkpoint_every` steps and at the end: checkpoint (params, Adam, the step)
  at the end: DONE marker (`sft.DONE`) naming the model SPEC, DIR/checkpoints

The data are rebuilt identically on resume (seeded, and the sandbox is deterministic); their
digest is in the checkpoint, so a resume on changed data is an error rather than a different
run. The checkpoint is the self-play loop's format with the tokenizer reference, so
DIR/checkpoints loads as a model SPEC anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import jax
import numpy as np

from spade_jax import checkpoint as ckpt_lib
from spade_jax import learner as learner_lib
from spade_jax import loading, sft, sft_data, sharding
from spade_jax import prefix as prefix_lib
from spade_jax import tokenizer as tok_lib
from spade_jax.convert import CheckpointError
from spade_jax.sandbox import pool as pool_lib
from spade_jax.sandbox.contract import Limits
from spade_jax.selfplay import batch as batch_lib
from spade_jax.selfplay import corpus as corpus_lib
from spade_jax.selfplay import outputs
from spade_jax.selfplay import progress as progress_lib
from spade_jax.selfplay import records

FIELDS = ("tokens_BT", "loss_mask_BT", "temperature_B")


def learner_config(c) -> learner_lib.LearnerConfig:
  o = c.optim
  return learner_lib.LearnerConfig(
      lr=o.lr, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, adam_eps=o.eps,
      max_grad_norm=o.grad_clip, micro_batch=o.micro_batch, chunk=o.chunk, remat=o.remat,
      share_prefix=o.share_prefix, entropy=False, objective="sft")


def build_data(c, tokenizer, workdir: str, progress) -> tuple[list[records.Sample], dict]:
  """The examples (agent transcripts, then designer examples) and a summary of how they came."""
  d = c.data
  srcs = sft_data.sources(d.starters, d.families, d.levels, d.dirs, log=progress.line)
  if not srcs:
    raise sft_data.DataError("data: the sources hold no program")
  limits = Limits(memory_bytes=c.env.memory_mb << 20, step_s=c.env.step_timeout_s,
                  max_turns=d.max_turns)
  with progress.phase("starting sandbox", f"{c.env.workers} workers"):
    pool = pool_lib.Pool(workers=c.env.workers, limits=limits, require=tuple(c.env.require))
  try:
    with progress.phase("solution plays", f"{len(srcs)} programs x {d.seeds_per_env} seeds",
                        total=len(srcs) * d.seeds_per_env, unit="episodes") as ph:
      plays = sft_data.play_solutions(pool, srcs, d.seeds_per_env, d.max_turns, d.reasoning,
                                      c.seed, on_done=ph.update)
      ends: dict[str, int] = {}
      for p in plays:
        ends[p.end] = ends.get(p.end, 0) + 1
      ph.note = " ".join(f"{k} {v}" for k, v in sorted(ends.items()))
  finally:
    pool.close()
  agent, too_long, per_source = [], 0, {}
  for p in plays:
    if p.won:
      t = sft_data.agent_transcript(tokenizer, p.observations, p.replies)
      if len(t) > d.max_len:
        too_long += 1
        continue
      agent.append(sft_data.sample(t, records.AGENT, srcs[p.source]))
      per_source[srcs[p.source].name] = per_source.get(srcs[p.source].name, 0) + 1
  if not agent:
    raise sft_data.DataError(f"data: no solution play was won within {d.max_turns} turns and "
                             f"{d.max_len} tokens (ends: {ends})")
  designer, designer_long = _designer_examples(c, tokenizer, srcs, len(agent), workdir,
                                               progress)
  samples = agent + designer
  summary = {
      "sources": len(srcs), "distinct_programs": len(sft_data.distinct(srcs)),
      "plays": ends, "agent_examples": len(agent), "agent_too_long": too_long,
      "designer_examples": len(designer), "designer_too_long": designer_long,
      "tokens": sum(len(s.tokens) for s in samples),
      "trained_tokens": sum(s.trained_tokens for s in samples),
      "agent_per_source": per_source,
      "data_digest": _digest(samples)}
  return samples, summary


def _designer_examples(c, tokenizer, srcs, n_agent: int, workdir: str, progress):
  """`data.designer_share` of the examples: candidates in `sft_data.designer_order`, each with
  the next corpus document, those over `data.designer_max_len` tokens left out (counted);
  the candidates are cycled with fresh documents until enough fit or none does."""
  d = c.data
  n = int(round(n_agent * d.designer_share / (1.0 - d.designer_share)))
  order = sft_data.designer_order(srcs, d.designer_memory, c.seed)
  if n <= 0 or not order:
    return [], 0
  path = c.corpus.path or corpus_lib.build_default_corpus(os.path.join(workdir, "corpus.jsonl"))
  corpus = corpus_lib.Corpus(corpus_lib.read_jsonl(path, c.corpus.max_words), c.seed)
  out, too_long = [], 0
  with progress.phase("designer examples", f"{n} prompts answered with programs"):
    for j in range(len(order) * max(1, -(-n // len(order))) * 2):
      src, memory = order[j % len(order)]
      t = sft_data.designer_transcript(tokenizer, src, corpus.next().text, memory, d.min_turns)
      if len(t) > d.designer_max_len:
        too_long += 1
      else:
        out.append(sft_data.sample(t, records.DESIGNER, src))
      if len(out) == n or (j + 1 == len(order) and not out):
        break
  return out, too_long


def _digest(samples) -> str:
  h = hashlib.sha256()
  for s in samples:
    h.update(np.asarray(s.tokens, np.int32).tobytes() + np.asarray(s.mask, np.int8).tobytes())
  return h.hexdigest()[:16]


def _write_examples(workdir: str, tokenizer, samples) -> None:
  """examples.jsonl: every example as text, with its trained part, for reading."""
  rows = []
  for s in samples:
    trained = [t for t, m in zip(s.tokens, s.mask) if m]
    rows.append(json.dumps({"role": s.role, "source": s.env_id, "tokens": len(s.tokens),
                            "trained_tokens": len(trained), "text": tokenizer.decode(
                                list(s.tokens)), "trained": tokenizer.decode(trained)}))
  outputs.write_text(os.path.join(workdir, "examples.jsonl"), "\n".join(rows) + "\n")


class Batches:
  """The run's batches as learner arrays, with one shape per length bucket so the step compiles
  once per bucket: rows padded to the bucket, a scored-position width fixed per bucket, and
  (with `share_prefix`) the prefix every row of the bucket begins with (the chat template's
  system turn and the instruction) run once, cut at a fixed `prefix.split_points` length."""

  def __init__(self, samples, plan, rows: int, multiple: int, pad_id: int,
               share_prefix: bool = False, parts: int = 1, shards: int = 1):
    self.samples, self.plan, self.rows = samples, plan, rows
    self.multiple, self.pad_id, self.parts, self.shards = multiple, pad_id, parts, shards
    self.width: dict[int, int] = {}
    self.prefix: dict[int, tuple[int, ...]] = {}  # T -> the shared prefix (absent: none)
    members: dict[int, list[int]] = {}
    for idx in plan:
      T = self.length(idx)
      members.setdefault(T, []).extend(idx)
      self.width[T] = max(self.width.get(T, 1), max(samples[i].trained_tokens for i in idx))
    for T, most in self.width.items():  # rounded up as learner.score_index rounds
      g = max(1, T // 8)
      self.width[T] = min(T, -(-most // g) * g)
      common = _common_prefix([samples[i].tokens for i in members[T]])
      # Never into a trained token: a prefix row is not scored.
      first_trained = min(samples[i].mask.index(1) for i in members[T])
      points = [p for p in prefix_lib.split_points(T) if p <= min(common, first_trained)]
      if share_prefix and points:
        self.prefix[T] = samples[members[T][0]].tokens[:max(points)]

  def length(self, idx) -> int:
    return batch_lib.length_bucket(max(len(self.samples[i].tokens) for i in idx), self.multiple)

  def __len__(self) -> int:
    return len(self.plan)

  def __getitem__(self, step: int) -> dict[str, np.ndarray]:
    idx = self.plan[step]
    packed = batch_lib.pack([self.samples[i] for i in idx], self.rows, self.multiple,
                            self.pad_id)
    batch = {k: packed[k] for k in FIELDS}
    T = batch["tokens_BT"].shape[1]
    batch["score_index_BM"] = learner_lib.score_index(batch["loss_mask_BT"], self.width[T])
    if T in self.prefix:
      # Empty rows (a short last batch) begin with the prefix too, as `prefix.check` requires.
      pre = np.asarray(self.prefix[T], np.int32)
      batch["tokens_BT"][len(idx):, :len(pre)] = pre
      U = self.parts * self.shards  # one prefix per micro-batch and batch shard
      batch["prefix_tokens_UP"] = np.tile(pre, (U, 1))
      batch["prefix_slot_B"] = np.zeros((self.rows,), np.int32)
    return batch


def _common_prefix(seqs) -> int:
  first = np.asarray(seqs[0])
  n = len(first)
  for s in seqs[1:]:
    s = np.asarray(s[:n])
    diff = np.flatnonzero(s != first[:len(s)])
    n = min(n, len(s), int(diff[0]) if len(diff) else len(s))
  return n


def _eta(times: dict, seen_first: dict, remaining_tokens: float, unseen: int) -> float | None:
  """Seconds left: the remaining padded tokens at the rate of steps that did not compile, plus
  each shape still to compile at the mean compile overhead seen (its first step's excess)."""
  steady = times.get("steady")
  if steady is None:
    if not seen_first:
      return None
    rate = sum(s for s, _ in seen_first.values()) / sum(n for _, n in seen_first.values())
    return remaining_tokens * rate
  rate = steady[0] / steady[1]
  over = [max(0.0, s - n * rate) for s, n in seen_first.values()]
  return remaining_tokens * rate + unseen * (sum(over) / len(over) if over else 0.0)


def run(c, workdir: str, progress: progress_lib.Progress | None = None) -> dict[str, Any]:
  """Makes (or resumes) the warm start of config `c` in `workdir`; returns the DONE summary."""
  progress = progress or progress_lib.Progress()
  log = progress.line
  t_start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  mesh = sharding.make_mesh(c.mesh.to_dict())
  rules = c.rules.to_dict()
  with progress.phase("loading model", f"{c.model} ({c.dtype})"):
    loaded = loading.load_model(c.model, mesh, rules, c.dtype, seed=c.seed)
  tok_spec = c.tokenizer or loaded.tokenizer_ref
  if c.tokenizer:
    loaded.tokenizer = tok_lib.load_tokenizer(ckpt_lib.tokenizer_path(c.tokenizer))
  tok = loaded.tokenizer
  if tok is None:
    raise ValueError(f"model {c.model!r} has no tokenizer; set --config.tokenizer=SPEC")
  samples, summary = build_data(c, tok, workdir, progress)
  log(f"data: {summary['agent_examples']} agent transcripts from {len(summary['agent_per_source'])}"
      f" programs ({summary['agent_too_long']} over {c.data.max_len} tokens left out), "
      f"{summary['designer_examples']} designer examples; {summary['tokens']} tokens, "
      f"{summary['trained_tokens']} trained")
  outputs.write_text(os.path.join(workdir, "data.json"), json.dumps(summary, indent=1) + "\n")
  _write_examples(workdir, tok, samples)
  lengths = [len(s.tokens) for s in samples]
  plan = sft_data.plan_batches(
      lengths, c.batch, c.epochs, c.seed,
      lambda n: batch_lib.length_bucket(n, c.length_multiple))
  pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
  micro = c.optim.micro_batch or c.batch
  batches = Batches(samples, plan, c.batch, c.length_multiple, int(pad_id),
                    c.optim.share_prefix, c.batch // micro, sharding.batch_shards(mesh, rules))
  with progress.phase("setting up learner"):
    learner = learner_lib.make_learner(loaded.cfg, learner_config(c), mesh, rules)
    state = learner.init_state(loaded.params, c.seed)
  del loaded
  mgr = ckpt_lib.manager(os.path.join(workdir, "checkpoints"), keep=c.keep_checkpoints)
  start, time_before = 0, 0.0
  if mgr.latest_step() is not None:
    with progress.phase("restoring checkpoint", f"step {mgr.latest_step()}"):
      state, host = ckpt_lib.restore(mgr, learner)
    info = host.get("sft", {})
    if info.get("data_digest") != summary["data_digest"] or info.get(
        "config_digest") != sft.digest(c):
      raise CheckpointError(f"{workdir}: its checkpoint was made from other data or another "
                            "config; remove the directory or pick another --workdir")
    start, time_before = int(info["steps_done"]), float(info["time_s"])
    log(f"resuming from step {start} ({workdir})")
  metrics = outputs.Metrics(workdir, start)
  n = min(len(batches), c.max_steps) if c.max_steps else len(batches)
  seen_first: dict[int, tuple[float, float]] = {}  # T -> (seconds, padded tokens) of its 1st
  steady: dict[str, tuple[float, float]] = {}
  rows = c.batch
  last = None
  try:
    with progress.phase("training", f"{n} steps of {rows} rows ({c.epochs} epochs, "
                        f"{len(samples)} examples), lengths {sorted(batches.width)}"):
      for i in range(start, n):
        batch = batches[i]
        T = batch["tokens_BT"].shape[1]
        t0 = time.perf_counter()
        with progress.compiling(f"sft step ({rows} x {T})"):
          state, m = learner.train_step(state, batch)
          m = {k: float(v) for k, v in jax.device_get(m).items()}
        dt = time.perf_counter() - t0
        if T in seen_first:
          s, k = steady.get("steady", (0.0, 0.0))
          steady["steady"] = (s + dt, k + rows * T)
        else:
          seen_first[T] = (dt, rows * T)
        row = dict(step=i, epoch=i * c.epochs // len(batches), rows=len(batches.plan[i]), length=T,
                   time_step_s=dt, **m)
        metrics.write(row)
        last = row
        if (i + 1) % c.checkpoint_every == 0 or i + 1 == n:
          with progress.phase("checkpoint save", f"step {i + 1}"):
            host = {"sft": {"steps_done": i + 1, "config_digest": sft.digest(c),
                            "data_digest": summary["data_digest"],
                            "time_s": time_before + time.perf_counter() - t_start}}
            ckpt_lib.save(mgr, state, learner.model_cfg, host, tokenizer=tok_spec, step=i + 1)
        left = sum(rows * batches.length(batches.plan[j]) for j in range(i + 1, n))
        unseen = len({batches.length(batches.plan[j]) for j in range(i + 1, n)} - set(seen_first))
        eta = _eta(steady, seen_first, left, unseen)
        log(f"sft step {i + 1}/{n}  loss {m['loss']:.4f}  nll/token {m['nll_token_mean']:.3f}  "
            f"{rows} x {T}  {dt:.1f} s  eta " + ("-" if eta is None else f"{eta / 60:.1f} min"))
  finally:
    ckpt_lib.wait(mgr)
    metrics.close()
  done = {"spec": os.path.abspath(os.path.join(workdir, "checkpoints")),
          "config_digest": sft.digest(c), "steps": n,
          "time_s": time_before + time.perf_counter() - t_start,
          "final_loss": None if last is None else last["loss"], "data": summary}
  outputs.write_text(os.path.join(workdir, sft.DONE), json.dumps(done, indent=1) + "\n")
  return done
