"""The SPADE self-play loop (docs/method.md §5), in one function: `run(config, workdir)`.

One rollout step t, as data (each phase takes the host state and returns a new one):

  t % k == 0:  close the previous window -> paid designer samples (delayed reward, §6)
               designer prompts -> sampler (or replayed programs) -> sandbox admission -> pool
               hint prompts -> sampler -> hints; hinted plays (measured, never trained)
  every step:  pool x plays_per_env agent episodes (sampler turn <-> sandbox step_many)
               returns -> window ledger (and, at t % k == 0, memory), agent advantages
               batch = paid designer samples first, then whole agent groups that fit
               learner.train_step -> params'
               metrics.jsonl, pool cards, memory.json, plots, report, checkpoint

The run's last window has no step t + k to be paid at: if it is complete (all k steps played)
it is paid at the last step, after its last plays (a delay of k - 1 steps, with the same
information); an unfinished one is not paid (`designer_unpaid` counts its samples).

Everything the next step needs is in the checkpoint (params, optimizer, `state.HostState`), and
every random choice is keyed by (seed, step, phase), so a killed run restarted with the same
command continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import numpy as np

from spade_jax import checkpoint as ckpt_lib
from spade_jax import learner as learner_lib
from spade_jax import loading, rl, sampling, sharding, sft
from spade_jax import tokenizer as tok_lib
from spade_jax.sandbox import families
from spade_jax.sandbox import pool as pool_lib
from spade_jax.sandbox import starters
from spade_jax.sandbox import validate as validate_lib
from spade_jax.sandbox.contract import Limits
from spade_jax.selfplay import baselines
from spade_jax.selfplay import batch as batch_lib
from spade_jax.selfplay import corpus as corpus_lib
from spade_jax.selfplay import designer as designer_lib
from spade_jax.selfplay import episodes as episodes_lib
from spade_jax.selfplay import ledger
from spade_jax.selfplay import memory as memory_lib
from spade_jax.selfplay import outputs
from spade_jax.selfplay import progress as progress_lib
from spade_jax.selfplay import records, rlve, seeds
from spade_jax.selfplay import state as state_lib
from spade_jax.selfplay.state import HostState


def _settings(s) -> sampling.Settings:
  return sampling.Settings(max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                           top_k=s.top_k, top_p=s.top_p)


def memory_config(c) -> memory_lib.MemoryConfig:
  m = c.memory
  return memory_lib.MemoryConfig(m.capacity, m.code_chars, m.n_positive, m.top_regret,
                                 (m.band_low, m.band_high), 1, m.negative_above, m.negative_below)


def reward_config(c) -> rl.RewardConfig:
  r = c.reward
  return rl.RewardConfig(r.variant, r.regret_weight, r.anchor_weight, r.regret_scale,
                         r.band_low, r.band_high, r.ramp, r.lp_fast, r.lp_slow, r.scale_cap)


def learner_config(c) -> learner_lib.LearnerConfig:
  o, r = c.optim, c.rl
  return learner_lib.LearnerConfig(
      lr=o.lr, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, adam_eps=o.eps,
      max_grad_norm=o.grad_clip, eps_low=r.eps_low, eps_high=r.eps_high, tis_cap=r.tis_cap,
      kl_beta=r.kl_beta, kl_clamp=r.kl_clamp, micro_batch=o.micro_batch, remat=o.remat,
      share_prefix=o.share_prefix, routing_replay=r.routing_replay,
      router_aux_coef=r.router_aux_coef, moe_impl=c.moe.impl)


def starter_cards(skills, need: int, step: int) -> list[records.Card]:
  """Hand-written environments of the window's skills, to keep the agent busy (counted)."""
  names = [n for s in skills for n in starters.by_skill(s)][:need]
  return [records.Card(f"starter-{n[:-3]}", starters.STARTERS[n], starters.code(n),
                       records.STARTER, step) for n in names]


def run(c, workdir: str, log=None, progress: progress_lib.Progress | None = None) -> HostState:
  """Runs (or resumes) the self-play job of config `c` in `workdir`; returns the host state.

  Every line (progress and one summary per step) goes to `log`; without one, to stderr, with
  tqdm bars on a terminal. `progress` overrides both (e.g. `progress_lib.quiet()`)."""
  progress = progress or progress_lib.Progress(log=log)
  log = progress.line
  os.makedirs(workdir, exist_ok=True)
  mesh = sharding.make_mesh(c.mesh.to_dict())
  rules = c.rules.to_dict()
  model = sft.warm_start(c, workdir, progress)
  with progress.phase("loading model", f"{model} ({c.dtype})"):
    loaded = loading.load_model(model, mesh, rules, c.dtype, seed=c.seed)
  tok_spec = c.tokenizer or loaded.tokenizer_ref
  if c.tokenizer:
    loaded.tokenizer = tok_lib.load_tokenizer(ckpt_lib.tokenizer_path(c.tokenizer))
  tok = loaded.tokenizer
  if tok is None:
    raise ValueError(f"model {model!r} has no tokenizer; set --config.tokenizer=SPEC")
  with progress.phase("setting up sampler and learner"):
    routing = bool(c.rl.routing_replay and loaded.cfg.n_experts)
    sampler = sampling.Sampler.for_model(loaded, mesh, rules, routing=routing,
                                         moe_impl=c.moe.impl)
    experts_Lk = ((len(loaded.cfg.sparse_layers), loaded.cfg.experts_per_token) if routing
                  else None)
    learner = learner_lib.make_learner(loaded.cfg, learner_config(c), mesh, rules)
    state = learner.init_state(loaded.params, c.seed)
    logp_of = PolicyScorer(learner)
    ref_params = jax.tree.map(lambda a: a.copy(), loaded.params) if c.rl.kl_beta else None
  del loaded
  mgr = ckpt_lib.manager(os.path.join(workdir, "checkpoints"), keep=c.keep_checkpoints)
  host = HostState()
  if mgr.latest_step() is not None:
    with progress.phase("restoring checkpoint", f"step {mgr.latest_step()}"):
      state, host_json = ckpt_lib.restore(mgr, learner)
      host = state_lib.from_json(host_json)
    log(f"resuming from step {host.step} ({workdir})")
  corpus = _corpus(c, workdir, host, progress)
  programs = designer_lib.load_programs(c.designer.programs) if c.designer.programs else []
  if programs:
    log(f"designer: replaying {len(programs)} programs from {c.designer.programs}")
  mcfg, rcfg = memory_config(c), reward_config(c)
  limits = Limits(memory_bytes=c.env.memory_mb << 20, step_s=c.env.step_timeout_s,
                  episode_s=c.env.episode_timeout_s, max_tasks=c.env.max_tasks,
                  max_turns=c.env.max_turns)
  validation = validate_lib.Options(total_s=c.env.validation_timeout_s,
                                    degenerate_steps=c.env.max_turns + 5)
  plays = Plays(tok, sampler, episodes_lib.Limits(c.env.max_turns, c.agent_context),
                _settings(c.agent), progress)
  metrics = outputs.Metrics(workdir, host.step)
  with progress.phase("starting sandbox", f"{c.env.workers} workers"):
    pool = pool_lib.Pool(workers=c.env.workers, limits=limits, require=tuple(c.env.require))
  log(f"sandbox protections: {sorted(k for k, v in pool.protections.items() if v)}")
  fixed_cards = _fixed_pool(c, workdir, pool, validation, progress) if (
      c.method == "fixed_grpo") else []
  step_times: list[tuple[bool, float]] = []  # this process's steps, for the ETA
  try:
    for t in range(host.step, c.total_steps):
      t0 = time.perf_counter()
      regen = t % c.k == 0
      log(f"-- rollout step {t + 1}/{c.total_steps}{' (regeneration)' if regen else ''}")
      row: dict[str, Any] = {"step": t, "regen": regen}
      params = state.params
      paid: list[records.Sample] = []
      timing = episodes_lib.Timing()

      # ---- the environments of this step: a fixed-pool baseline draws them
      if c.method == "fixed_grpo":
        host = dataclasses.replace(host, pool=tuple(
            dataclasses.replace(cd, step=t) for cd in baselines.sample_pool(
                fixed_cards, c.envs_per_regen, seeds.derive(c.seed, t, seeds.POOL))))
      elif c.method == "fixed_rlve":
        controller = host.rlve or rlve.new_state(c.rlve.families or families.NAMES,
                                                 c.rlve.tau_acc, c.rlve.tau_num, c.rlve.d_delta)
        host = dataclasses.replace(host, rlve=controller, pool=tuple(baselines.rlve_cards(
            controller, c.envs_per_regen, t, seeds.derive(c.seed, t, seeds.POOL))))

      # ---- regeneration: pay the last window, design, admit, hint, hinted plays
      if regen and c.method == "spade":
        host, paid, stats = pay_window(c, host, rcfg)
        row.update(stats)
        tr = time.perf_counter()
        out = designer_lib.regenerate(
            c, t, params, sampler, tok, pool, corpus, host.memory, mcfg, validation,
            programs=programs, scorer=logp_of,
            progress=progress)
        row["time_regen_s"] = time.perf_counter() - tr
        host, more, h_time = open_window(c, t, host, out, pool, params, plays)
        row.update(more)
        timing = timing.add(h_time)

      # ---- unhinted plays of the whole pool (trained)
      host, agent, more, p_time, won = play_pool(c, t, host, pool, params, plays, mcfg)
      row.update(more)
      if host.rlve is not None:  # the wins move the difficulty windows
        host = dataclasses.replace(host, rlve=rlve.record_many(host.rlve, [
            (baselines.family_of(cd), cd.level, w) for cd in host.pool
            for w in won.get(cd.env_id, [])]))
        row.update(rlve.level_stats(host.rlve), rlve_levels_played=sorted(
            cd.level for cd in host.pool))
      timing = timing.add(p_time)
      if t == c.total_steps - 1:
        host, more_paid, stats = pay_final_window(c, host, rcfg)
        paid += more_paid
        row.update(stats)

      trained_designer = paid if c.designer.train else []
      samples, left_out = batch_lib.assemble(trained_designer, agent, c.global_batch,
                                             seeds.derive(c.seed, t, seeds.TRIM))
      n_designer = sum(s.role == records.DESIGNER for s in samples)
      starter_ids = {cd.env_id for cd in host.pool if cd.source == records.STARTER}
      row.update(designer_trained=n_designer, agent_trained=len(samples) - n_designer,
                 agent_left_out=left_out, tokens_sampled=timing.tokens,
                 starter_trained=sum(s.env_id in starter_ids for s in samples))

      # ---- one optimizer step
      tl = time.perf_counter()
      state, more = train(c, learner, state, samples, sampler.pad_id, ref_params, logp_of,
                          progress, experts_Lk)
      row.update(more)
      row["time_learner_s"] = time.perf_counter() - tl

      # ---- outputs and checkpoint
      host = dataclasses.replace(host, step=t + 1,
                                 corpus=corpus.get_state() if corpus is not None else None)
      for cd in host.pool:
        outputs.write_card(workdir, records.to_json(cd))
      memory_lib.save(os.path.join(workdir, "memory.json"), host.memory)
      total = time.perf_counter() - t0
      row.update(time_sample_s=timing.sample_s, time_env_wait_s=timing.env_wait_s,
                 time_total_s=total,
                 device_waits_on_host_frac=timing.env_wait_s / total if total else 0.0)
      metrics.write(row)
      if (t + 1) % c.checkpoint_every == 0 or t + 1 == c.total_steps:
        with progress.phase("checkpoint save", f"step {t + 1}"):
          ckpt_lib.save(mgr, state, learner.model_cfg, state_lib.to_json(host),
                        tokenizer=tok_spec, step=t + 1)
      _write_pictures(workdir, str(c), log)
      step_times.append((regen, time.perf_counter() - t0))  # with saves and plots
      eta = progress_lib.eta_s(step_times, [u % c.k == 0 for u in range(t + 1, c.total_steps)])
      log(progress_lib.step_line(t, c.total_steps, row, eta))
  finally:
    ckpt_lib.wait(mgr)
    pool.close()
    metrics.close()
  return host


def _fixed_pool(c, workdir: str, pool, validation, progress) -> list[records.Card]:
  """fixed_grpo's pool: its programs through admission once; the rejected ones are named with
  their reasons (in the log and in fixed_pool.json) and skipped."""
  programs = baselines.pool_programs(c.fixed_pool)
  with progress.phase("fixed pool admission", f"{len(programs)} programs from "
                      f"{c.fixed_pool or 'the starter environments'}", total=len(programs),
                      unit="programs") as ph:
    cards, rejected = baselines.admit_pool(pool, programs, dataclasses.replace(
        validation, seed=seeds.derive(c.seed, 0, seeds.ADMISSION, 0)))
    ph.update(len(programs))
    ph.note = f"admitted {len(cards)}/{len(programs)}"
  for r in rejected:
    progress.line(f"fixed pool: rejected {r.name} ({r.check}: {r.reason})")
  outputs.write_json(os.path.join(workdir, "fixed_pool.json"), {
      "admitted": [cd.env_id for cd in cards],
      "rejected": [dataclasses.asdict(r) for r in rejected]})
  if not cards:
    raise ValueError(f"fixed_pool: none of the {len(programs)} programs was admitted")
  return cards


def _corpus(c, workdir: str, host: HostState, progress) -> corpus_lib.Corpus | None:
  if c.method != "spade":
    return None  # nothing is designed
  if not c.corpus.enabled:
    progress.line("corpus: none (skill-only designer prompts)")
    return None
  with progress.phase("corpus", c.corpus.path or "building the built-in corpus"):
    path = c.corpus.path or corpus_lib.build_default_corpus(os.path.join(workdir, "corpus.jsonl"))
    corpus = corpus_lib.Corpus(corpus_lib.read_jsonl(path, c.corpus.max_words), c.seed)
  what = c.corpus.path or "built-in (docstrings of the standard library's and sympy's math modules)"
  progress.line(f"corpus: {what}, {len(corpus)} documents")
  if host.corpus is not None:
    corpus.set_state(host.corpus)
  return corpus


@dataclasses.dataclass(frozen=True)
class Plays:
  """What every batch of agent episodes is played with."""
  tokenizer: Any
  sampler: sampling.Sampler
  limits: episodes_lib.Limits
  settings: sampling.Settings
  progress: progress_lib.Progress

  def __call__(self, pool, params, groups, n: int, seed: int, name: str):
    return episodes_lib.play(pool, self.sampler, params, self.tokenizer, groups, n,
                             self.settings, self.limits, seed, progress=self.progress, name=name)


def pay_window(c, host: HostState, rcfg: rl.RewardConfig
               ) -> tuple[HostState, list[records.Sample], dict[str, Any]]:
  """Closes the open window: its designer samples with their advantages, and metrics."""
  if host.window is None:
    return host, [], {}
  p = ledger.close(host.window, rcfg, host.skill_emas, c.envs_per_regen * c.plays_per_env, c.k)
  host = dataclasses.replace(host, window=None, skill_emas=p.skill_emas)
  stats: dict[str, Any] = {"designer_paid": len(p.samples),
                           "designer_unmeasured": len(p.unmeasured)}
  if p.stats:
    mean = lambda key: float(np.mean([s[key] for s in p.stats.values()]))  # noqa: E731
    stats.update(designer_reward_mean=mean("reward"), designer_regret_mean=mean("regret"),
                 designer_win_rate_mean=mean("win_rate"), designer_anchor_mean=mean("anchor"))
  return host, p.samples, stats


def pay_final_window(c, host: HostState, rcfg: rl.RewardConfig
                     ) -> tuple[HostState, list[records.Sample], dict[str, Any]]:
  """At the run's last step: pays the open window if complete, else drops it (counted)."""
  if host.window is None:
    return host, [], {}
  if ledger.complete(host.window, c.k):
    return pay_window(c, host, rcfg)
  return dataclasses.replace(host, window=None), [], {
      "designer_unpaid": len(host.window.designer)}


def open_window(c, t: int, host: HostState, regen: designer_lib.Regeneration, pool, params,
                plays: Plays) -> tuple[HostState, dict[str, Any], episodes_lib.Timing]:
  """The new pool (admitted programs, then starters if configured), its hinted plays and the
  window that will pay the designer samples."""
  cards = [a.card for a in regen.admitted]
  skills = designer_lib.window_skills(c.skills, t // c.k, c.skills_per_window)
  if c.starter_fill and len(cards) < c.envs_per_regen:
    cards += starter_cards(skills, c.envs_per_regen - len(cards), t)
  hinted = [episodes_lib.Group(cd.env_id, cd.code, seeds.derive(c.seed, t, seeds.RESET, i),
                               cd.hint)
            for i, cd in enumerate(cards) if cd.source == records.DESIGNER and cd.hint]
  h_eps, h_time = plays(pool, params, hinted, c.hinted_plays,
                        seeds.derive(c.seed, t, seeds.HINTED_PLAYS), "hinted plays")
  if not hinted:
    plays.progress.line("hinted plays: skipped (no hinted environment)")
  h_returns: dict[str, list[float]] = {}
  for e in h_eps:  # plays that failed to start measured nothing: they are left out
    if e.end != "start_failed":
      h_returns.setdefault(hinted[e.group].env_id, []).append(e.ret)
  envs = {cd.env_id: (cd.skill, h_returns.get(cd.env_id) or None)
          for cd in cards if cd.source == records.DESIGNER}
  window = ledger.new_window(t, envs, [a.sample for a in regen.admitted])
  rej = validate_lib.rejection_stats(regen.verdicts)
  stats = dict(designer_attempts=rej["n"], designer_admitted=rej["admitted"],
               designer_admission_rate=rej["admission_rate"],
               designer_rejections=rej["by_check"], designer_tokens=regen.tokens,
               designer_hinted=len(hinted),
               hinted_start_failed=sum(e.end == "start_failed" for e in h_eps))
  return dataclasses.replace(host, pool=tuple(cards), window=window), stats, h_time


def play_pool(c, t: int, host: HostState, pool, params, plays: Plays,
              mcfg: memory_lib.MemoryConfig):
  """The pool's unhinted plays: (host state with the window's returns and, at a regeneration
  step, the new environments' memory records; agent samples with their advantages; metrics;
  timing; {env_id: [won, ...]} of the plays that ran)."""
  cards = host.pool
  groups = [episodes_lib.Group(cd.env_id, cd.code, seeds.derive(c.seed, t, seeds.RESET, i))
            for i, cd in enumerate(cards)]
  eps, timing = plays(pool, params, groups, c.plays_per_env,
                      seeds.derive(c.seed, t, seeds.PLAYS), "unhinted plays")
  played = [e for e in eps if e.end != "start_failed"]
  by_env: dict[str, list[float]] = {}
  won: dict[str, list[bool]] = {}
  for e in played:
    by_env.setdefault(groups[e.group].env_id, []).append(e.ret)
    won.setdefault(groups[e.group].env_id, []).append(e.won)
  if host.window is not None:
    host = dataclasses.replace(host, window=ledger.record_unhinted(host.window, t, by_env))
  if t % c.k == 0:
    host = remember(t, host, mcfg)
  agent = []
  if played:
    adv = rl.agent_advantages([e.ret for e in played], [e.group for e in played],
                              c.reward.agent_eps)
    agent = [records.Sample(e.transcript.tokens, e.transcript.mask, e.transcript.logp,
                            c.agent.temperature, records.AGENT, groups[e.group].env_id,
                            cards[e.group].skill, float(a), e.group,
                            rl.routing_replay(e.routing, len(e.transcript)) if e.routing
                            else None)
             for e, a in zip(played, adv)]
  stats = dict(_episode_stats(played), pool_size=len(cards),
               starter_envs=sum(cd.source == records.STARTER for cd in cards),
               envs_start_failed=len({groups[e.group].env_id for e in eps
                                      if e.end == "start_failed"}))
  return host, agent, stats, timing, won


def remember(t: int, host: HostState, mcfg: memory_lib.MemoryConfig) -> HostState:
  """One memory record per new designer environment measured at its regeneration step (§8),
  and its card with the same win rate and regret."""
  memory, cards = list(host.memory), []
  for cd in host.pool:
    env = host.window.envs.get(cd.env_id) if cd.source == records.DESIGNER else None
    st = ledger.env_stats(env) if env is not None else None
    if st is not None:
      cd = dataclasses.replace(cd, win_rate=st["win_rate_0"], regret=st["regret"])
      memory = memory_lib.add(memory, memory_lib.Record(
          cd.skill, cd.code, st["win_rate_0"], st["regret"], t, cd.env_id), mcfg)
    cards.append(cd)
  return dataclasses.replace(host, pool=tuple(cards), memory=tuple(memory))


def train(c, learner, state, samples, pad_id: int, ref_params, logp_of, progress,
          experts_Lk=None):
  """One optimizer step on the samples (skipped when nothing is trained): (state, metrics)."""
  if not any(s.trained_tokens for s in samples):
    progress.line("learner step: skipped (no trained tokens)")
    return state, {"learner_skipped": "no trained tokens"}
  batch = batch_lib.pack(samples, c.global_batch, pad_id=pad_id, experts_Lk=experts_Lk)
  row: dict[str, Any] = {}
  with progress.phase("learner step", _batch_text(batch, c.optim.micro_batch)) as ph:
    with progress.compiling("learner step"):
      if ref_params is not None:
        batch["logp_ref_BT"] = logp_of.tokens(ref_params, batch)
      state, m = learner.train_step(state, batch)
      # The metrics were read back here before: the same one sync ends the phase.
      row.update({k: float(v) for k, v in jax.device_get(m).items()})
    ph.note = f"loss {row.get('loss', float('nan')):+.4f}"
  row["tokens_trained"] = int(batch["loss_mask_BT"].sum())
  return state, row


class PolicyScorer:
  """Log-probs of given tokens under some parameters of the learner's model: the frozen
  reference policy's for the KL term, the current policy's for replayed designer programs.
  Only the positions that are used are projected to the vocabulary (`learner.score_index`)."""

  def __init__(self, learner):
    self._fn = jax.jit(lambda p, b: learner_lib.score(p, b, learner.model_cfg,
                                                      learner.cfg.chunk)[0])

  def tokens(self, params, batch) -> np.ndarray:
    """[B, T] token-aligned log-probs of batch["tokens_BT"] at batch["temperature_B"], at the
    positions of batch["loss_mask_BT"] (0 elsewhere)."""
    return np.asarray(self._fn(params, {
        "tokens_BT": batch["tokens_BT"], "temperature_B": batch["temperature_B"],
        "score_index_BM": learner_lib.score_index(batch["loss_mask_BT"])}))

  def __call__(self, params, token_lists, starts, temperature) -> list[np.ndarray]:
    """Each list's log-probs from its `start` on (a completion after its prompt)."""
    rows = 1 << max(0, len(token_lists) - 1).bit_length()  # few shapes to compile
    T = batch_lib.length_bucket(max(len(t) for t in token_lists))
    tokens = np.zeros((rows, T), np.int32)
    mask = np.zeros((rows, T), np.float32)
    for i, (ts, start) in enumerate(zip(token_lists, starts)):
      tokens[i, :len(ts)] = ts
      mask[i, start:len(ts)] = 1.0
    lp = self.tokens(params, {"tokens_BT": tokens, "loss_mask_BT": mask,
                              "temperature_B": np.full((rows,), temperature, np.float32)})
    return [lp[i, s:len(ts)] for i, (ts, s) in enumerate(zip(token_lists, starts))]


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
