"""The SPADE self-play loop (docs/method.md §5), in one function: `run(config, workdir)`.

One rollout step t, as data:

  t % k == 0:  close the previous window -> paid designer samples (delayed reward, §6)
               designer prompts -> sampler -> programs -> sandbox admission -> new pool
               hint prompts -> sampler -> hints; hinted plays (measured, never trained)
  every step:  pool x plays_per_env agent episodes (sampler turn <-> sandbox step_many)
               returns -> window ledger, agent advantages
               batch = paid designer samples first, then agent samples, trimmed to global_batch
               learner.train_step -> params'
               metrics.jsonl, pool cards, memory.json, checkpoint (with all host state)

Everything the next step needs is in the checkpoint (params, optimizer, pool, memory, window
ledger, corpus position), and every random choice is keyed by (seed, step), so a killed run
restarted with the same command continues exactly where it stopped.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

from spade_jax.sandbox import pool as pool_lib
from spade_jax.sandbox import starters
from spade_jax.sandbox import validate as validate_lib
from spade_jax.sandbox.contract import Limits
from spade_jax import checkpoint as ckpt_lib
from spade_jax import learner as learner_lib
from spade_jax import loading, rl, sampling, sharding
from spade_jax import tokenizer as tok_lib
from spade_jax.selfplay import batch as batch_lib
from spade_jax.selfplay import corpus as corpus_lib
from spade_jax.selfplay import designer as designer_lib
from spade_jax.selfplay import episodes as episodes_lib
from spade_jax.selfplay import ledger
from spade_jax.selfplay import memory as memory_lib
from spade_jax.selfplay import outputs
from spade_jax.selfplay import progress as progress_lib
from spade_jax.selfplay import seeds


def _settings(s) -> sampling.Settings:
  return sampling.Settings(max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                           top_k=s.top_k, top_p=s.top_p)


def _memory_config(c) -> memory_lib.MemoryConfig:
  m = c.memory
  return memory_lib.MemoryConfig(m.capacity, m.code_chars, m.n_positive, m.top_regret,
                                 (m.band_low, m.band_high), 1, m.negative_above, m.negative_below)


def learner_config(c) -> learner_lib.LearnerConfig:
  o, r = c.optim, c.rl
  return learner_lib.LearnerConfig(
      lr=o.lr, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, adam_eps=o.eps,
      max_grad_norm=o.grad_clip, eps_low=r.eps_low, eps_high=r.eps_high, tis_cap=r.tis_cap,
      kl_beta=r.kl_beta, kl_clamp=r.kl_clamp, micro_batch=o.micro_batch, remat=o.remat,
      share_prefix=o.share_prefix)


def _starter_cards(skills, need: int, step: int) -> list[dict[str, Any]]:
  """Hand-written environments of the window's skills, to keep the agent busy (counted)."""
  names = [n for s in skills for n in starters.by_skill(s)]
  return [{"env_id": f"starter-{names[i % len(names)][:-3]}", "skill":
           starters.STARTERS[names[i % len(names)]], "code": starters.code(names[i % len(names)]),
           "hint": None, "doc_id": "", "step": step, "source": "starter"}
          for i in range(min(need, len(names)))]


def _sample_of(ep: episodes_lib.Episode, advantage: float, temperature: float) -> dict:
  return {"tokens": ep.tokens, "mask": ep.mask, "logp": ep.logp, "advantage": float(advantage),
          "temperature": temperature}


def run(c, workdir: str, log=None, progress: progress_lib.Progress | None = None
        ) -> dict[str, Any]:
  """Runs (or resumes) the self-play job of config `c` in `workdir`; returns the host state.

  Every line (progress and one summary per step) goes to `log`; without one, to stderr, with
  tqdm bars on a terminal. `progress` overrides both (e.g. `progress_lib.quiet()`)."""
  progress = progress or progress_lib.Progress(log=log)
  log = progress.line
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
  with progress.phase("setting up sampler and learner"):
    sampler = sampling.Sampler.for_model(loaded, mesh, rules)
    learner = learner_lib.make_learner(loaded.cfg, learner_config(c), mesh, rules)
    state = learner.init_state(loaded.params, c.seed)
    ref_logp = _reference_scorer(c, learner, loaded.params)
  del loaded
  mgr = ckpt_lib.manager(os.path.join(workdir, "checkpoints"), keep=c.keep_checkpoints)
  host: dict[str, Any] = {"step": 0, "pool": [], "memory": [], "window": None, "lp_state": {},
                          "corpus": None, "regen_index": 0}
  if mgr.latest_step() is not None:
    with progress.phase("restoring checkpoint", f"step {mgr.latest_step()}"):
      state, host = ckpt_lib.restore(mgr, learner)
    log(f"resuming from step {host['step']} ({workdir})")
  corpus = None
  if c.corpus.enabled:
    with progress.phase("corpus", c.corpus.path or "building the default corpus"):
      path = c.corpus.path or corpus_lib.build_default_corpus(
          os.path.join(workdir, "corpus.jsonl"))
      corpus = corpus_lib.Corpus(corpus_lib.read_jsonl(path, c.corpus.max_words), c.seed)
    if host["corpus"] is not None:
      corpus.set_state(host["corpus"])
  records = memory_lib.from_json(host["memory"])
  mcfg = _memory_config(c)
  limits = Limits(memory_bytes=c.env.memory_mb << 20, step_s=c.env.step_timeout_s,
                  max_turns=c.env.max_turns)
  validation = validate_lib.Options(total_s=c.env.validation_timeout_s,
                                    degenerate_steps=c.env.max_turns + 5)
  ep_limits = episodes_lib.Limits(c.env.max_turns, c.agent_context)
  agent_settings = _settings(c.agent)
  metrics = outputs.Metrics(workdir, host["step"])
  with progress.phase("starting sandbox", f"{c.env.workers} workers"):
    pool = pool_lib.Pool(workers=c.env.workers, limits=limits, require=tuple(c.env.require))
  log(f"sandbox protections: {sorted(k for k, v in pool.protections.items() if v)}")
  step_times: list[tuple[bool, float]] = []  # this process's steps, for the ETA
  try:
    for t in range(host["step"], c.total_steps):
      t0 = time.perf_counter()
      log(f"-- rollout step {t + 1}/{c.total_steps}"
          f"{' (regeneration)' if t % c.k == 0 else ''}")
      row: dict[str, Any] = {"step": t, "regen": t % c.k == 0}
      params = state.params
      paid: list[dict[str, Any]] = []
      timing = episodes_lib.Timing()

      # ---- regeneration: close the last window, design, admit, hint, hinted plays
      if t % c.k == 0:
        if host["window"] is not None:
          paid, stats = _close_window(c, host)
          row.update(stats)
        tr = time.perf_counter()
        regen = designer_lib.regenerate(c, t, host["regen_index"], params, sampler, tok, pool,
                                        corpus, records, mcfg, validation, progress=progress)
        row["time_regen_s"] = time.perf_counter() - tr
        skills = designer_lib.window_skills(c.skills, host["regen_index"], c.skills_per_window)
        host["regen_index"] += 1
        window = ledger.new_window(t)
        cards = []
        for a in regen.admitted:
          ledger.add_designer_sample(window, a.sample)
          cards.append({"env_id": a.env_id, "skill": a.skill, "code": a.code, "hint": a.hint,
                        "doc_id": a.doc_id, "step": t, "source": "designer"})
        need = c.envs_per_regen - len(cards)
        if need > 0 and c.starter_fill:
          cards += _starter_cards(skills, need, t)
        host["pool"], host["window"] = cards, window
        rej = validate_lib.rejection_stats(regen.verdicts)
        row.update(designer_attempts=rej["n"], designer_admitted=rej["admitted"],
                   designer_admission_rate=rej["admission_rate"],
                   designer_rejections=rej["by_check"], designer_tokens=regen.tokens)
        hinted = [episodes_lib.Group(cd["env_id"], cd["code"], seeds.derive(c.seed, t, 3, i),
                                     cd["hint"])
                  for i, cd in enumerate(cards) if cd["source"] == "designer" and cd["hint"]]
        h_eps, h_time = episodes_lib.play(pool, sampler, params, tok, hinted, c.hinted_plays,
                                          agent_settings, ep_limits, seeds.derive(c.seed, t, 4),
                                          progress=progress, name="hinted plays")
        if not hinted:
          log("hinted plays: skipped (no hinted environment)")
        timing = timing.add(h_time)
        for cd in cards:
          if cd["source"] == "designer":
            rets = [e.ret for e in h_eps if hinted[e.group].env_id == cd["env_id"]] or None
            ledger.add_env(window, cd["env_id"], cd["skill"], rets)

      # ---- unhinted plays of the whole pool (trained)
      cards = host["pool"]
      row["pool_size"] = len(cards)
      row["starter_envs"] = sum(cd["source"] == "starter" for cd in cards)
      groups = [episodes_lib.Group(cd["env_id"], cd["code"], seeds.derive(c.seed, t, 3, i))
                for i, cd in enumerate(cards)]
      eps, p_time = episodes_lib.play(pool, sampler, params, tok, groups, c.plays_per_env,
                                      agent_settings, ep_limits, seeds.derive(c.seed, t, 5),
                                      progress=progress, name="unhinted plays")
      timing = timing.add(p_time)
      played = [e for e in eps if e.end != "start_failed"]
      by_env: dict[str, list[float]] = {}
      for e in played:
        by_env.setdefault(groups[e.group].env_id, []).append(e.ret)
      if host["window"] is not None:
        ledger.record_unhinted(host["window"], t, by_env)
      if t % c.k == 0:
        _remember(c, t, host, records, mcfg, cards)
      if t == c.total_steps - 1 and host["window"] is not None:  # flush the last window
        more, stats = _close_window(c, host)
        paid += more
        row.update(stats)

      agent = []
      if played:
        adv = rl.agent_advantages([e.ret for e in played], [e.group for e in played],
                                  c.reward.agent_eps)
        agent = [_sample_of(e, a, c.agent.temperature) for e, a in zip(played, adv)]
      samples, n_designer = batch_lib.assemble(paid, agent, c.global_batch)
      row.update(_episode_stats(played), designer_trained=n_designer,
                 agent_trained=len(samples) - n_designer, tokens_sampled=timing.tokens)

      # ---- one optimizer step
      tl = time.perf_counter()
      if any(sum(s["mask"]) for s in samples):
        batch = batch_lib.pack(samples, c.global_batch, pad_id=sampler.pad_id)
        with progress.phase("learner step", _batch_text(batch, c.optim.micro_batch)) as ph:
          with progress.compiling("learner step"):
            if ref_logp is not None:
              batch["logp_ref_BT"] = ref_logp(batch)
            state, m = learner.train_step(state, batch)
            # The metrics were read back here before: the same one sync ends the phase.
            row.update({k: float(v) for k, v in jax.device_get(m).items()})
          ph.note = f"loss {row.get('loss', float('nan')):+.4f}"
        row["tokens_trained"] = int(batch["loss_mask_BT"].sum())
      else:
        row["learner_skipped"] = "no trained tokens"
        log("learner step: skipped (no trained tokens)")
      row["time_learner_s"] = time.perf_counter() - tl

      # ---- outputs and checkpoint
      host["step"] = t + 1
      host["memory"] = memory_lib.to_json(records)
      host["corpus"] = corpus.get_state() if corpus is not None else None
      for cd in cards:
        outputs.write_card(workdir, cd)
      memory_lib.save(os.path.join(workdir, "memory.json"), records)
      total = time.perf_counter() - t0
      row.update(time_sample_s=timing.sample_s, time_env_wait_s=timing.env_wait_s,
                 time_total_s=total,
                 device_waits_on_host_frac=timing.env_wait_s / total if total else 0.0)
      metrics.write(row)
      if (t + 1) % c.checkpoint_every == 0 or t + 1 == c.total_steps:
        with progress.phase("checkpoint save", f"step {t + 1}"):
          ckpt_lib.save(mgr, state, learner.model_cfg, host, tokenizer=tok_spec, step=t + 1)
      _write_pictures(workdir, str(c), log)
      step_times.append((t % c.k == 0, time.perf_counter() - t0))  # with saves and plots
      eta = progress_lib.eta_s(step_times, [u % c.k == 0 for u in range(t + 1, c.total_steps)])
      log(progress_lib.step_line(t, c.total_steps, row, eta))
  finally:
    ckpt_lib.wait(mgr)
    pool.close()
    metrics.close()
  return host


def _batch_text(batch, micro: int) -> str:
  B, T = batch["tokens_BT"].shape
  # The micro-batches are a scan inside one jitted call: the host cannot count them as they go.
  mb = f", {B // micro} micro-batches of {micro} in one call" if micro and micro < B else ""
  return f"{B} rows x {T} tokens{mb}"


def _write_pictures(workdir: str, config_text: str, log) -> None:
  """plots/*.png and report.md from metrics.jsonl, after every step, so a killed run has them;
  a failure here is reported and never ends the run."""
  from spade_jax.selfplay import plots

  try:
    failed = plots.write_all(workdir, outputs.read(os.path.join(workdir, "metrics.jsonl")))
    outputs.report(workdir, config_text)
  except Exception as e:  # noqa: BLE001 -- pictures are never worth a run
    failed = {"report": f"{type(e).__name__}: {e}"}
  if failed:
    log(f"plots: could not write {', '.join(f'{k} ({v})' for k, v in failed.items())}")


def _reference_scorer(c, learner, params):
  """Log-probs under the frozen initial policy, for the k3 KL term; None when beta = 0 (then no
  reference copy is kept and no reference pass runs)."""
  if c.rl.kl_beta == 0:
    return None
  ref = jax.tree.map(lambda a: a.copy(), params)
  fn = jax.jit(lambda p, b: learner_lib.score(p, b, learner.model_cfg, learner.cfg.chunk)[0])
  return lambda batch: np.asarray(fn(ref, {k: batch[k] for k in ("tokens_BT", "temperature_B")}))


def _close_window(c, host) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """Pays the designer samples of the open window; returns (samples, metrics)."""
  w = host["window"]
  host["window"] = None
  reward_of, stats, host["lp_state"] = ledger.rewards(w, c.reward, host["lp_state"])
  n_agent = c.envs_per_regen * c.plays_per_env
  paid = ledger.paid_samples(w, reward_of, n_agent, c.k, c.reward.scale_cap)
  if not stats:
    return paid, {}
  vals = lambda key: [s[key] for s in stats.values()]
  return paid, {"designer_reward_mean": float(np.mean(vals("reward"))),
                "designer_regret_mean": float(np.mean(vals("regret"))),
                "designer_win_rate_mean": float(np.mean(vals("win_rate"))),
                "designer_anchor_mean": float(np.mean(vals("anchor"))),
                "designer_paid": len(paid)}


def _remember(c, t: int, host, records, mcfg, cards) -> None:
  """One memory record per admitted environment, from its regeneration-step plays (§8)."""
  w = host["window"]
  for cd in cards:
    env = w["envs"].get(cd["env_id"]) if cd["source"] == "designer" else None
    if env is None or "0" not in env["unhinted"]:
      continue
    st = ledger.env_stats(env)
    cd.update(win_rate=st["win_rate_0"], regret=st["regret"])
    records[:] = memory_lib.add(records, memory_lib.Record(
        cd["skill"], cd["code"], st["win_rate_0"], st["regret"], t, cd["env_id"]), mcfg)


def _episode_stats(eps: list[episodes_lib.Episode]) -> dict[str, Any]:
  if not eps:
    return {"episodes": 0}
  ends: dict[str, int] = {}
  errors: dict[str, int] = {}
  for e in eps:
    ends[e.end] = ends.get(e.end, 0) + 1
    if e.status != "OK":
      errors[e.status] = errors.get(e.status, 0) + 1
  return {"episodes": len(eps), "agent_return_mean": float(np.mean([e.ret for e in eps])),
          "agent_win_rate": float(np.mean([e.won for e in eps])),
          "agent_turns_mean": float(np.mean([e.turns for e in eps])), "episode_ends": ends,
          "episode_errors": errors}
