"""The workdir's pictures: valid PNGs from any mix of rows, written atomically, and a report that
links exactly the figures present."""

import json
import os
import re

import pytest

from spade_jax.selfplay import outputs, plots

PNG = b"\x89PNG\r\n\x1a\n"

REGEN = {"step": 0, "regen": True, "designer_attempts": 2, "designer_admitted": 1,
         "designer_admission_rate": 0.5, "designer_rejections": {"reference": 1},
         "agent_return_mean": -0.25, "agent_win_rate": 0.0, "loss": 0.1, "pg_loss": 0.1,
         "clip_frac_low": 0.0, "clip_frac_high": 0.02, "is_weight_mean": 1.0,
         "is_weight_max": 1.4, "ratio_mean": 1.0, "skipped": 0.0, "time_total_s": 100.0,
         "time_sample_s": 40.0, "time_env_wait_s": 5.0, "time_learner_s": 30.0,
         "time_regen_s": 20.0}
PLAIN = {"step": 1, "regen": False, "agent_return_mean": 0.5, "agent_win_rate": 0.5,
         "loss": -0.05, "clip_frac_low": 0.01, "clip_frac_high": 0.0, "is_weight_mean": 0.9,
         "is_weight_max": 2.0, "time_total_s": 60.0, "time_sample_s": 30.0,
         "designer_reward_mean": 0.3, "designer_regret_mean": 0.1, "designer_anchor_mean": 0.4}
SKIPPED = {"step": 2, "regen": False, "learner_skipped": "no trained tokens", "episodes": 0,
           "time_total_s": 3.0}


def _check_pngs(workdir):
  import matplotlib.image

  names = sorted(os.listdir(os.path.join(workdir, "plots")))
  for n in names:
    path = os.path.join(workdir, "plots", n)
    with open(path, "rb") as f:
      assert f.read(8) == PNG, n
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 0 and img.shape[1] > 0, n
  return names


@pytest.mark.parametrize("rows, want", [
    ([REGEN], {"agent.png", "designer_admission.png", "learner.png", "time.png"}),
    ([REGEN, PLAIN, SKIPPED], {n for n, _, _ in plots.FIGURES}),
    ([SKIPPED], {"learner.png", "time.png"}),  # a skipped step is marked on the learner plot
    ([{"step": 0}, {"step": 1, "agent_win_rate": float("nan")}], set()),  # keys missing/NaN
    ([], set()),
])
def test_figures_are_pngs_and_the_report_links_exactly_them(tmp_path, rows, want):
  workdir = str(tmp_path)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  assert plots.write_all(workdir, rows) == {}
  names = _check_pngs(workdir)
  assert set(names) == want  # no temporary file left beside them
  text = outputs.report(workdir, "config")
  assert sorted(re.findall(r"\]\((plots/[^)]+)\)", text)) == sorted(f"plots/{n}" for n in names)
  assert ("## Figures" in text) == bool(names)
  assert "- steps: " in text and "config" in text  # the summary lines stay
  assert not [n for n in os.listdir(workdir) if n.endswith(".tmp")]


def test_a_figure_that_loses_its_data_is_removed_and_unlinked(tmp_path):
  workdir = str(tmp_path)
  plots.write_all(workdir, [REGEN, PLAIN])
  assert os.path.exists(os.path.join(workdir, "plots", "designer_reward.png"))
  plots.write_all(workdir, [REGEN])  # a resume cut the rows back
  assert not os.path.exists(os.path.join(workdir, "plots", "designer_reward.png"))
  assert "designer_reward" not in outputs.report(workdir, "")


def test_one_failing_figure_costs_only_itself(tmp_path, monkeypatch):
  def boom(rows):
    raise RuntimeError("bad data")
  figs = list(plots.FIGURES)
  figs[0] = (figs[0][0], figs[0][1], boom)
  monkeypatch.setattr(plots, "FIGURES", tuple(figs))
  failed = plots.write_all(str(tmp_path), [REGEN])
  assert list(failed) == [figs[0][0]] and "bad data" in failed[figs[0][0]]
  assert set(_check_pngs(str(tmp_path))) == {"designer_admission.png", "learner.png", "time.png"}


def test_atomic_replacement_keeps_the_old_file_when_a_write_fails(tmp_path):
  path = str(tmp_path / "x.png")
  with open(path, "wb") as f:
    f.write(PNG + b"old")

  class Broken:
    def savefig(self, f, format):
      f.write(b"half a picture")
      raise OSError("disk full")

  with pytest.raises(OSError):
    plots.save_png(Broken(), path)
  assert open(path, "rb").read() == PNG + b"old"
  assert os.listdir(tmp_path) == ["x.png"]


def test_series_skip_missing_and_non_finite_values():
  rows = [{"step": 0, "a": 1.0}, {"step": 1}, {"step": 2, "a": float("inf")},
          {"step": 3, "a": True}, {"step": 4, "a": 2}]
  assert plots.series(rows, "a") == ([0, 4], [1.0, 2.0])
  steps, parts = plots.rejections([REGEN, PLAIN])
  assert steps == [0] and parts == {"admitted": [1], "rejected: reference": [1]}
