"""What a run leaves in its workdir: metrics.jsonl, TensorBoard events, pool cards, report.md
(with the pictures of `plots.py`).

Metrics are appended one JSON object per step as the step completes. On resume the file is cut
back to the steps before the checkpoint, so a step that ran but was not checkpointed is not
counted twice.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Sequence


class Metrics:
  def __init__(self, workdir: str, resume_step: int):
    self.path = os.path.join(workdir, "metrics.jsonl")
    kept = [r for r in read(self.path) if r["step"] < resume_step]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, self.path)
    from tensorboardX import SummaryWriter

    self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=resume_step)

  def write(self, row: Mapping[str, Any]) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    for k, v in flat_numbers(row).items():
      if k != "step":
        self.tb.add_scalar(k, v, row["step"])
    self.tb.flush()

  def close(self) -> None:
    self.tb.close()


def read(path: str) -> list[dict[str, Any]]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def flat_numbers(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  out = {}
  for k, v in row.items():
    if isinstance(v, Mapping):
      out.update(flat_numbers(v, f"{prefix}{k}/"))
    elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
      out[f"{prefix}{k}"] = float(v)
  return out


def write_text(path: str, text: str) -> None:
  """Atomically: a crash leaves the previous file, never half of the new one."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def write_json(path: str, data: Any) -> None:
  write_text(path, json.dumps(data, indent=1))


def write_card(workdir: str, card: Mapping[str, Any]) -> None:
  """pool/<env_id>.py (the code) and pool/<env_id>.json (everything else), atomically."""
  d = os.path.join(workdir, "pool")
  os.makedirs(d, exist_ok=True)
  write_text(os.path.join(d, f"{card['env_id']}.py"), card["code"])
  write_json(os.path.join(d, f"{card['env_id']}.json"),
             {k: v for k, v in card.items() if k != "code"})


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
  vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
  return sum(vals) / len(vals) if vals else None


def report(workdir: str, config_text: str) -> str:
  """A short markdown summary of the run so far, from metrics.jsonl, with a table of the figures
  in plots/ (those present); written atomically, so it can be rewritten after every step."""
  rows = read(os.path.join(workdir, "metrics.jsonl"))
  fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
  attempts = sum(r.get("designer_attempts", 0) for r in rows)
  admitted = sum(r.get("designer_admitted", 0) for r in rows)
  rejections: dict[str, int] = {}
  for r in rows:
    for k, v in r.get("designer_rejections", {}).items():
      rejections[k] = rejections.get(k, 0) + v
  total = sum(r.get("time_total_s", 0.0) for r in rows)
  lines = [
      "# SPADE run report", "", *_warm_start_line(workdir),
      f"- steps: {len(rows)} (last step {rows[-1]['step'] if rows else 'n/a'})",
      f"- agent mean return: {fmt(_mean(rows, 'agent_return_mean'))}; first step "
      f"{fmt(rows[0].get('agent_return_mean') if rows else None)}, last step "
      f"{fmt(rows[-1].get('agent_return_mean') if rows else None)}",
      f"- agent win rate: {fmt(_mean(rows, 'agent_win_rate'))}",
      f"- designer admission: {admitted}/{attempts} attempts "
      f"({fmt(admitted / attempts if attempts else None)}); rejections by check: "
      f"{json.dumps(rejections, sort_keys=True)}",
      f"- steps that needed starter environments: "
      f"{sum(1 for r in rows if r.get('starter_envs', 0) > 0)}",
      f"- designer reward (blend) mean: {fmt(_mean(rows, 'designer_reward_mean'))}; regret mean: "
      f"{fmt(_mean(rows, 'designer_regret_mean'))}",
      f"- wall time: {total:.0f} s; device sampling {fmt(_sum_frac(rows, 'time_sample_s', total))},"
      f" host environments {fmt(_sum_frac(rows, 'time_env_wait_s', total))}, learner "
      f"{fmt(_sum_frac(rows, 'time_learner_s', total))} of it",
      "", *_figure_table(workdir), "## Config", "", "```", config_text.strip(), "```", "",
  ]
  text = "\n".join(lines)
  path = os.path.join(workdir, "report.md")
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)
  return text


def _warm_start_line(workdir: str) -> list[str]:
  """The report's line on the warm start the run began from (none: no line)."""
  path = os.path.join(workdir, "warm_start.json")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    w = json.load(f)
  loss = "n/a" if w.get("final_loss") is None else f"{w['final_loss']:.3f}"
  return [f"- warm start: {w['config']} from {w['from']}: {w.get('steps')} SFT steps on "
          f"{w.get('agent_examples')} solution transcripts and {w.get('designer_examples')} "
          f"designer examples, final loss {loss}, made in {w.get('time_s') or 0:.0f} s"
          f"{' (cached)' if w.get('cached') else ''}; {w['spec']}"]


def _figure_table(workdir: str, columns: int = 2) -> list[str]:
  """Markdown lines: the figures present, `columns` per row, each with its caption below."""
  from spade_jax.selfplay import plots

  figs = plots.existing(workdir)
  if not figs:
    return []
  lines = ["## Figures", "", "|" + " |" * columns, "|" + ":-:|" * columns]
  for i in range(0, len(figs), columns):
    part = figs[i:i + columns] + [("", "")] * (columns - len(figs[i:i + columns]))
    lines.append("| " + " | ".join(f"![{c}]({p})" if p else "" for p, c in part) + " |")
    lines.append("| " + " | ".join(c for _, c in part) + " |")
  return lines + [""]


def _sum_frac(rows, key, total):
  return sum(r.get(key, 0.0) for r in rows) / total if total else None
