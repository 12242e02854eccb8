"""Evaluation CLI: sample, grade, save, summarize — or re-grade saved samples without a model.

  python -m spade_jax.eval.run --model SPEC --benchmarks LIST --preset smoke|paper --out DIR \\
      [--data_dir USER_DATA] [--samples N] [--max_new_tokens N] [--max_turns N] [--seed S] \\
      [--dtype bfloat16] [--tokenizer SPEC]
  python -m spade_jax.eval.run --rescore DIR [--out DIR2] [--data_dir USER_DATA]

SPEC is any model the generate CLI accepts (smollm2-135m, an HF directory, a .gguf file,
random:PRESET) or a check generator: `oracle` (answers with the reference; must score 1.0) or
`empty` (must score 0.0). LIST is comma-separated benchmark or family names, or `all`
(see `spade_jax.eval.benchmarks`), including environment suites `envs:DIR` (every program of DIR
played by the self-play agent; eval/envs.py). Writes, as results complete:

  DIR/samples/<benchmark>.jsonl   one graded sample per line (see eval/samples.py)
  DIR/summary.json                {"benchmarks": {name: {"score", "n", "stderr", "ci95",
                                   "problems", "status": "ok"|"unavailable"|"error", ...}}, ...}
  DIR/summary.md                  the same as a table

A re-run into the same DIR resumes: problems whose samples are all saved are not sampled again.
Re-scoring reads DIR/samples and writes DIR2 (default DIR/rescored) with fresh verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from typing import Sequence

from . import benchmarks as bench_lib
from . import presets, samples, stats
from .generation import Prompt, make_generator
from .protocol import Benchmark, Context, Protocol, Unavailable
from spade_jax import cli
from spade_jax import hostmem

CHUNK_PROMPTS = 8  # prompts sampled, graded and saved together


def _record(bench: Benchmark, item: dict, sample: int, completion, graded: dict) -> dict:
  score = float(graded["score"])
  return {"benchmark": bench.name, "id": item["id"], "sample": sample,
          "messages": list(item["prompt"].messages), "completion": completion,
          "gold": item.get("gold"), **graded, "score": score, "correct": score >= 1.0}


def _progress(total: int, desc: str):
  from tqdm import tqdm

  return tqdm(total=total, desc=desc, unit="sample", file=sys.stderr, dynamic_ncols=True)


def _existing(path: str) -> dict[tuple[str, int], dict]:
  if not os.path.exists(path):
    return {}
  return {(r["id"], int(r["sample"])): r for r in samples.read(path)}


def run_benchmark(bench: Benchmark, gen, proto: Protocol, ctx: Context, path: str) -> dict:
  """Samples and grades one benchmark, appending each graded sample to `path`."""
  t0 = time.perf_counter()
  overflow0 = getattr(gen, "overflows", 0)
  items = bench.load(ctx)
  if proto.problems is not None:
    items = items[:proto.problems]
  n = proto.sampling.n
  done = _existing(path)
  scores: dict[str, list[float]] = defaultdict(list)
  for (pid, _), r in done.items():
    scores[pid].append(r["score"])
  todo = [it for it in items if any((it["id"], s) not in done for s in range(n))]
  writer = samples.Writer(path)
  bar = _progress(len(items) * n, bench.name)
  bar.update(len(items) * n - len(todo) * n)
  try:
    if bench.play is not None:
      for item, s, completion in bench.play(todo, gen, proto, ctx):
        if (item["id"], s) in done:
          continue
        (graded,) = bench.grade([(item, completion)], ctx)
        rec = _record(bench, item, s, completion, graded)
        writer.write(rec)
        scores[item["id"]].append(rec["score"])
        bar.update(1)
    else:
      for start in range(0, len(todo), CHUNK_PROMPTS):
        chunk = todo[start:start + CHUNK_PROMPTS]
        completions = gen.generate([it["prompt"] for it in chunk], proto.sampling)
        pairs = [(it, c) for it, cs in zip(chunk, completions) for c in cs]
        graded = bench.grade(pairs, ctx)
        for k, ((it, c), g) in enumerate(zip(pairs, graded)):
          if (it["id"], k % n) in done:  # a partly saved problem: keep the saved samples
            continue
          rec = _record(bench, it, k % n, c, g)
          writer.write(rec)
          scores[it["id"]].append(rec["score"])
        bar.update(len(pairs))
  finally:
    bar.close()
    writer.close()
  row = stats.summarize({it["id"]: scores[it["id"]] for it in items})
  row = {**row, **ctx.notes, "status": "ok", "wall_s": round(time.perf_counter() - t0, 2)}
  if hasattr(gen, "overflows"):  # prompts the model never saw score 0: say how many
    row["overflowed_prompts"] = gen.overflows - overflow0
  return row


def _fmt(x: float) -> str:
  return "nan" if x != x else f"{100 * x:.1f}"


def _status(row: dict) -> str:
  """"ok", with what the row left out or lost on the way (prompts, environments)."""
  notes = []
  if row.get("overflowed_prompts"):
    notes.append(f"{row['overflowed_prompts']} prompts over the prompt limit, not sampled")
  if row.get("unscored"):
    notes.append("not scored: " + ", ".join(f"{k} ({v})" for k, v in row["unscored"].items()))
  if row.get("failed_to_start"):
    notes.append("failed to start, counted as losses: " + ", ".join(row["failed_to_start"]))
  return "ok" + (f" ({'; '.join(notes)})" if notes else "")


def write_summary(out: str, summary: dict) -> None:
  with open(os.path.join(out, "summary.json.tmp"), "w") as f:
    json.dump(summary, f, indent=2)
  os.replace(os.path.join(out, "summary.json.tmp"), os.path.join(out, "summary.json"))
  lines = [f"# {summary['model']} — preset {summary['preset']}", "",
           "| benchmark | score (%) | 95% CI | stderr | n | problems | status | wall s |",
           "|---|---|---|---|---|---|---|---|"]
  for name, r in summary["benchmarks"].items():
    if r["status"] == "ok":
      lo, hi = r["ci95"]
      lines.append(f"| {name} | {_fmt(r['score'])} | [{_fmt(lo)}, {_fmt(hi)}] | "
                   f"{_fmt(r['stderr'])} | {r['n']} | {r['problems']} | {_status(r)} | "
                   f"{r.get('wall_s', '')} |")
    else:
      lines.append(f"| {name} | – | – | – | 0 | 0 | {r['status']}: {r['reason']} | "
                   f"{r.get('wall_s', '')} |")
  lines += ["", f"wall time: {summary['wall_s']} s"]
  if summary.get("generator"):
    lines.append(f"generator: {json.dumps(summary['generator'])}")
  with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


def evaluate(model: str, selected: list[Benchmark], preset: str, out: str,
             data_dir: str | None = None, overrides: dict | None = None,
             dtype: str = "float32", tokenizer: str | None = None) -> dict:
  """Runs the selected benchmarks; every finished benchmark is in summary.json at once.
  `overrides`: protocol fields for every benchmark (presets.override)."""
  t0 = time.perf_counter()
  protos = {b.name: presets.override(presets.protocol(preset, b.name), overrides)
            for b in selected}  # first: a bad preset or override loads no model
  # Then the model: one that fails to load leaves no `out`.
  gen = make_generator(model, dtype=dtype, tokenizer=tokenizer)
  os.makedirs(os.path.join(out, "samples"), exist_ok=True)
  summary = {"model": model, "preset": preset, "benchmarks": {}, "wall_s": 0.0}
  for bench in selected:
    proto = protos[bench.name]
    ctx = Context(proto, data_dir)
    path = os.path.join(out, "samples", f"{bench.name}.jsonl")
    t1 = time.perf_counter()
    try:
      row = run_benchmark(bench, gen, proto, ctx, path)
    except Unavailable as e:
      row = {"score": None, "n": 0, "stderr": None, "status": "unavailable", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - one broken benchmark must not lose the others
      row = {"score": None, "n": 0, "stderr": None, "status": "error",
             "reason": f"{type(e).__name__}: {e}"}
    finally:
      ctx.close()
    row.setdefault("wall_s", round(time.perf_counter() - t1, 2))
    summary["benchmarks"][bench.name] = row
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    summary["generator"] = gen.stats() if hasattr(gen, "stats") else {}
    write_summary(out, summary)
  return summary


def _saved_items(bench: Benchmark, recs: list[dict], ctx: Context, fname: str) -> list[dict]:
  """The item each saved sample was graded against: the benchmark's own, or, for a
  self-contained one, rebuilt from the sample (its prompt messages)."""
  if bench.self_contained:
    return [{"id": r["id"], "gold": r.get("gold"),
             "prompt": Prompt(tuple(r.get("messages") or ()))} for r in recs]
  items = {it["id"]: it for it in bench.load(ctx)}
  unknown = sorted({r["id"] for r in recs} - set(items))
  if unknown:
    raise samples.SampleFileError(f"{fname}: ids not in {bench.name}: {unknown[:5]}")
  return [items[r["id"]] for r in recs]


def rescore(src: str, out: str, data_dir: str | None = None) -> dict:
  """Grades saved samples again (no model): new verdicts, same completions."""
  t0 = time.perf_counter()
  sample_dir = os.path.join(src, "samples")
  if not os.path.isdir(sample_dir):
    raise FileNotFoundError(f"{sample_dir}: no saved samples to re-score")
  old = {}
  if os.path.exists(os.path.join(src, "summary.json")):
    with open(os.path.join(src, "summary.json")) as f:
      old = json.load(f)
  summary = {"model": old.get("model", "?"), "preset": old.get("preset", "?"),
             "rescored_from": os.path.abspath(src), "benchmarks": {}, "wall_s": 0.0}
  for fname in sorted(os.listdir(sample_dir)):
    if not fname.endswith(".jsonl"):
      continue
    name = fname[:-len(".jsonl")]
    recs = list(samples.read(os.path.join(sample_dir, fname)))
    bench = bench_lib.saved(name)
    if bench is None:
      raise samples.SampleFileError(f"{fname}: unknown benchmark {name!r}")
    proto = presets.protocol(summary["preset"] if summary["preset"] in presets.PRESETS
                             else "smoke", name)
    ctx = Context(proto, data_dir)
    try:
      items_of = _saved_items(bench, recs, ctx, fname)
      graded = bench.grade([(it, r["completion"]) for it, r in zip(items_of, recs)], ctx)
    except Unavailable as e:
      summary["benchmarks"][name] = {"score": None, "n": 0, "stderr": None,
                                     "status": "unavailable", "reason": str(e)}
      continue
    finally:
      ctx.close()
    os.makedirs(os.path.join(out, "samples"), exist_ok=True)  # not before a sample file is good
    writer = samples.Writer(os.path.join(out, "samples", fname + ".tmp"))
    scores: dict[str, list[float]] = defaultdict(list)
    changed = 0
    for it, r, g in zip(items_of, recs, graded):
      new = _record(bench, it, r["sample"], r["completion"], g)
      changed += new["score"] != r["score"]
      writer.write(new)
      scores[r["id"]].append(new["score"])
    writer.close()
    os.replace(os.path.join(out, "samples", fname + ".tmp"),
               os.path.join(out, "samples", fname))
    summary["benchmarks"][name] = {**stats.summarize(scores), "status": "ok",
                                   "changed_verdicts": changed}
  summary["wall_s"] = round(time.perf_counter() - t0, 2)
  os.makedirs(out, exist_ok=True)
  write_summary(out, summary)
  return summary


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m spade_jax.eval.run", description=__doc__,
                              epilog=cli.ALIAS_NOTE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", metavar="SPEC", help="model SPEC, or oracle / empty")
  p.add_argument("--benchmarks", default="all", metavar="LIST",
                 help="comma-separated benchmark or family names, or all (default: all)")
  p.add_argument("--preset", default="smoke", choices=sorted(presets.PRESETS),
                 help="sampling protocol and problem counts (default: smoke)")
  p.add_argument("--out", metavar="DIR", help="output directory")
  p.add_argument("--data_dir", metavar="DIR", help="directory of user-supplied benchmark files")
  p.add_argument("--samples", type=int, metavar="N", help="override samples per problem")
  p.add_argument("--max_new_tokens", type=int, metavar="N",
                 help="override the token budget (environment suites: per turn)")
  p.add_argument("--max_turns", type=int, metavar="N",
                 help="override the agent turns per episode of environment suites")
  p.add_argument("--seed", type=int, metavar="S",
                 help="override the run seed (sampling; environment suites' reset seeds)")
  p.add_argument("--tokenizer", metavar="SPEC",
                 help="take the tokenizer from this SPEC (random:* weights have none)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="compute dtype of the model (default: float32)")
  p.add_argument("--rescore", metavar="DIR", help="re-grade DIR/samples without a model")
  return p


def _check_out(out: str) -> None:
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"--out {out!r} exists and is not a directory")


def _main(argv: Sequence[str]) -> int:
  p = parser()
  a = p.parse_args(cli.underscored(argv))
  hostmem.retain_freed_memory()
  try:
    if a.rescore:
      out = a.out or os.path.join(a.rescore, "rescored")
      _check_out(out)
      summary = rescore(a.rescore, out, a.data_dir)
    else:
      if not a.model or not a.out:
        p.error("--model and --out are required (or --rescore DIR)")
      _check_out(a.out)
      selected = bench_lib.select(a.benchmarks)
      overrides = {k: v for k, v in (("n", a.samples), ("max_new_tokens", a.max_new_tokens),
                                     ("max_turns", a.max_turns), ("seed", a.seed))
                   if v is not None}
      summary = evaluate(a.model, selected, a.preset, a.out, a.data_dir, overrides, a.dtype,
                         a.tokenizer)
      out = a.out
  except BrokenPipeError:
    raise
  except (ValueError, OSError) as e:  # a bad model, input or output path: one line
    print(f"error: {e}", file=sys.stderr)
    return 2
  with open(os.path.join(out, "summary.md")) as f:
    print(f.read())
  return 1 if any(r["status"] == "error" for r in summary["benchmarks"].values()) else 0


def main(argv: Sequence[str] | None = None) -> int:
  return cli.quiet_broken_pipe(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
  sys.exit(main())
