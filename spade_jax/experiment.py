"""Comparisons as one command: `python -m spade_jax.experiment --config=configs/experiments.py:PRESET
--workdir=W`.

Runs every line of the preset's `runs` table (the base model evaluated as is, a warm start by
supervised fine-tuning, training runs of each method or ablation from a given run's final
checkpoint), each as its own process of the ordinary entry point, with the same shared overrides
and seed; evaluates every final checkpoint with `spade_jax.eval.run`; and writes, as results come:

  W/runs/<name>/      the run's own workdir (metrics.jsonl, checkpoints, report.md, ...)
  W/eval/<name>/      its held-out evaluation (summary.json, samples)
  W/results.json      every run: the command, wall time, model, held-out scores with 95% CIs
  W/results.md        the same as a table, with the figures below it
  W/plots/            learning curves of all runs on one figure per metric, held-out bars

It resumes: a run with `done.json` is not run again, an evaluation resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Sequence

from spade_jax import cli
from spade_jax import config as config_lib

PROG = "python -m spade_jax.experiment"
CURVES = (("agent_return_mean", "agent mean return"), ("agent_win_rate", "agent win rate"),
          ("designer_admission_rate", "designer admission rate"), ("loss", "loss"))


def parse_runs(table: str) -> list[dict]:
  """`name: [eval_only | sft | from=RUN] KEY=VALUE ...` lines -> run specs, in order."""
  runs, names = [], set()
  for line in table.strip().splitlines():
    if not line.strip() or line.lstrip().startswith("#"):
      continue
    name, sep, rest = line.partition(":")
    name, words = name.strip(), rest.split()
    if not sep or not name or not name.replace("_", "").isalnum():
      raise ValueError(f"runs: {line.strip()!r} is not `name: ...`")
    if name in names:
      raise ValueError(f"runs: {name!r} appears twice")
    kind = "train"
    if words[:1] in (["eval_only"], ["sft"]):
      kind, words = words[0], words[1:]
    start = None
    if words and words[0].startswith("from="):
      start, words = words[0][5:], words[1:]
      if start not in names:
        raise ValueError(f"runs: {name} starts from {start!r}, which no earlier line defines")
    bad = [w for w in words if "=" not in w]
    if bad:
      raise ValueError(f"runs: {name}: {bad} are not KEY=VALUE")
    runs.append({"name": name, "kind": kind, "from": start, "overrides": words})
    names.add(name)
  if not runs:
    raise ValueError("runs: the table is empty")
  return runs


def run_command(run: dict, c, workdir: str, model_of: dict[str, str]) -> list[str] | None:
  """The command line of one run (None for eval_only: nothing to train)."""
  model = model_of[run["from"]] if run["from"] else c.model
  out = os.path.join(workdir, "runs", run["name"])
  py = [sys.executable, "-m"]
  if run["kind"] == "eval_only":
    return None
  if run["kind"] == "sft":
    where = sft_dir(run, c, out, model)
    return py + ["spade_jax.sft", f"--config={c.sft_config}", f"--workdir={where}",
                 f"--config.model={model}", f"--config.seed={c.seed}",
                 *[f"--config.{o}" for o in run["overrides"]]]
  # The runs' own `from=` is their start: no train preset's warm start on top of it.
  extra = (["warm_start.config="] + c.overrides.split()
           + ([f"corpus.path={c.corpus}"] if c.corpus else []))
  return py + ["spade_jax.train", f"--config={c.train_config}", f"--workdir={out}",
               f"--config.model={model}", f"--config.seed={c.seed}",
               *[f"--config.{o}" for o in extra + run["overrides"]]]


def sft_dir(run: dict, c, out: str, model: str) -> str:
  """Where a warm start run writes: its own run directory, or (`shared_warm_start`) the cache
  that self-play jobs take their warm starts from (one per distinct SFT config: a warm start
  the README job made is the experiment's, and the reverse)."""
  if not c.shared_warm_start:
    return out
  from spade_jax import sft

  return sft.cached_dir(sft.config(c.sft_config, [f"model={model}", f"seed={c.seed}",
                                                  *run["overrides"]]))


def final_model(run: dict, c, workdir: str, model_of: dict[str, str]) -> str:
  model = model_of[run["from"]] if run["from"] else c.model
  if run["kind"] == "eval_only":
    return model
  out = os.path.join(workdir, "runs", run["name"])
  if run["kind"] == "sft":
    out = sft_dir(run, c, out, model)
  return os.path.join(out, "checkpoints")


def _sh(cmd: Sequence[str], log_path: str) -> None:
  """Runs one step of the experiment; its output goes to a log file and, line by line, here."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  with open(log_path, "a") as log:
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
      log.write(line)
      log.flush()
      print(f"  | {line.rstrip()}", file=sys.stderr, flush=True)
    if proc.wait():
      raise RuntimeError(f"{cmd[2]} failed (exit {proc.returncode}); see {log_path}")


def _load_json(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _write(path: str, text: str) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def run_all(c, workdir: str) -> dict:
  """Runs what is not done, evaluates, and writes results.json / results.md / plots."""
  runs = parse_runs(c.runs)
  os.makedirs(workdir, exist_ok=True)
  model_of: dict[str, str] = {}
  results = {"preset": c.preset, "benchmarks": c.benchmarks, "eval_preset": c.eval_preset,
             "runs": {}}
  for i, run in enumerate(runs):
    name = run["name"]
    rdir = os.path.join(workdir, "runs", name)
    done = _load_json(os.path.join(rdir, "done.json"))
    cmd = run_command(run, c, workdir, model_of)
    entry = {"kind": run["kind"], "from": run["from"], "command": cmd}
    print(f"[{i + 1}/{len(runs)}] {name}: "
          f"{'done, skipped' if done else run['kind']}", file=sys.stderr, flush=True)
    if cmd is not None and done is None:
      t0 = time.perf_counter()
      _sh(cmd, os.path.join(rdir, "log.txt"))
      done = {"wall_s": round(time.perf_counter() - t0, 1)}
      if run["kind"] == "sft":  # its own making time (a shared one may have been made before)
        from spade_jax import sft

        made = sft.finished(os.path.dirname(final_model(run, c, workdir, model_of))) or {}
        if made.get("time_s") is not None:
          done.update(wall_s=round(made["time_s"], 1), run_s=done["wall_s"])
      os.makedirs(rdir, exist_ok=True)
      _write(os.path.join(rdir, "done.json"), json.dumps(done))
    entry["wall_s"] = (done or {}).get("wall_s", 0.0)
    model_of[name] = final_model(run, c, workdir, model_of)
    entry["model"] = model_of[name]
    edir = os.path.join(workdir, "eval", name)
    _sh([sys.executable, "-m", "spade_jax.eval.run", f"--model={model_of[name]}",
         f"--benchmarks={c.benchmarks}", f"--preset={c.eval_preset}", f"--out={edir}",
         *c.eval_flags.split()],
        os.path.join(edir, "log.txt"))
    summary = _load_json(os.path.join(edir, "summary.json")) or {}
    entry["eval"] = summary.get("benchmarks", {})
    entry["eval_wall_s"] = summary.get("wall_s")
    results["runs"][name] = entry
    _write(os.path.join(workdir, "results.json"), json.dumps(results, indent=1))
    report(workdir, results)
  return results


def _curve_rows(workdir: str, name: str) -> list[dict]:
  path = os.path.join(workdir, "runs", name, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def report(workdir: str, results: dict) -> str:
  """results.md (a table of held-out scores with CIs per run, wall times) and its figures."""
  from spade_jax.selfplay import plots

  benches = sorted({b for r in results["runs"].values() for b in r.get("eval", {})})
  head = "| run | from | wall time | " + " | ".join(benches) + " |"
  lines = [f"# Experiment `{results['preset']}`", "",
           f"Held-out evaluation: `{results['benchmarks']}` (preset `{results['eval_preset']}`);"
           " score with its 95% bootstrap interval.", "", head,
           "|" + "---|" * (3 + len(benches))]
  for name, r in results["runs"].items():
    cells = []
    for b in benches:
      e = r.get("eval", {}).get(b, {})
      if e.get("status") == "ok":
        lo, hi = e.get("ci95", [None, None])
        cells.append(f"{e['score']:.3f} [{lo:.3f}, {hi:.3f}] (n={e['n']})")
      else:
        cells.append(e.get("status", "-"))
    lines.append(f"| {name} | {r.get('from') or '-'} | {r.get('wall_s', 0):.0f} s | "
                 + " | ".join(cells) + " |")
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  figures = []
  for key, label in CURVES:
    fig = _curves(workdir, results, key, label, plots)
    if fig is not None:
      path = os.path.join(workdir, "plots", f"curve_{key}.png")
      plots.save_png(fig, path)
      figures.append((f"plots/curve_{key}.png", label))
  fig = _bars(results, benches)
  if fig is not None:
    plots.save_png(fig, os.path.join(workdir, "plots", "heldout.png"))
    figures.append(("plots/heldout.png", "held-out scores"))
  lines += [""] + [f"![{label}]({path})" for path, label in figures]
  text = "\n".join(lines) + "\n"
  _write(os.path.join(workdir, "results.md"), text)
  return text


def _curves(workdir, results, key, label, plots):
  series = {n: plots.series(_curve_rows(workdir, n), key) for n in results["runs"]}
  series = {n: s for n, s in series.items() if s[0]}
  if not series:
    return None
  fig, (ax,) = plots.figure(1, label, [])
  for name, (x, y) in series.items():
    ax.plot(x, y, marker="o", label=name)
  ax.legend(fontsize="small")
  return fig


def _bars(results, benches):
  ok = [(n, b, r["eval"][b]) for n, r in results["runs"].items() for b in benches
        if r.get("eval", {}).get(b, {}).get("status") == "ok"]
  if not ok:
    return None
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  fig = Figure(figsize=(6.4, 3.6), dpi=100, layout="constrained")
  FigureCanvasAgg(fig)
  ax = fig.subplots()
  names = list(results["runs"])
  width = 0.8 / max(1, len(benches))
  for j, b in enumerate(benches):
    xs, ys, errs = [], [], [[], []]
    for i, n in enumerate(names):
      e = results["runs"][n].get("eval", {}).get(b, {})
      if e.get("status") != "ok":
        continue
      lo, hi = e["ci95"]
      xs.append(i + j * width)
      ys.append(e["score"])
      errs[0].append(e["score"] - lo)
      errs[1].append(hi - e["score"])
    ax.bar(xs, ys, width=width, yerr=errs, capsize=3, label=b)
  ax.set_xticks([i + width * (len(benches) - 1) / 2 for i in range(len(names))], names)
  ax.set_ylabel("score")
  ax.set_title("held-out scores (95% CI)")
  ax.legend(fontsize="small")
  return fig


def main(argv: Sequence[str] | None = None) -> None:
  argv = cli.underscored(sys.argv[1:] if argv is None else argv)
  default = config_lib.shipped("experiments.py")
  spec, assignments, rest = config_lib.split_argv(argv, default)
  p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
  config_lib.add_help(p, "configs/experiments.py, preset local", "FILE[:PRESET]")
  p.add_argument("--workdir", required=True, metavar="DIR",
                 help="the experiment's directory; rerunning on it resumes")
  p.add_argument("--print_config", action="store_true", help="print the config and exit")
  args = p.parse_args(rest)
  try:
    c = config_lib.build(spec, assignments)
    parse_runs(c.runs)
    if not c.model:
      raise ValueError("model is empty: pass --config.model=SPEC")
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  if args.print_config:
    print(c)
    return
  try:
    results = run_all(c, args.workdir)
  except RuntimeError as e:
    sys.exit(f"error: {e}")
  print(report(args.workdir, results))


if __name__ == "__main__":
  cli.quiet_broken_pipe(main)
