"""Console progress: rate-limited plain lines off a terminal, done/total counts, heartbeats that
stop with their phase, silence on request, and the ETA."""

import io
import threading
import time

from spade_jax.selfplay import progress as progress_lib


class Clock:
  def __init__(self):
    self.t = 0.0

  def __call__(self):
    return self.t


def test_plain_lines_are_rate_limited_and_end_with_the_count():
  lines, clock = [], Clock()
  p = progress_lib.Progress(log=lines.append, interval_s=10.0, heartbeat_s=1e6, clock=clock)
  with p.phase("unhinted plays", "4 environments", total=100, unit="episodes") as ph:
    for _ in range(100):
      clock.t += 1.0  # 100 s of work, one episode a second
      ph.update()
    ph.note = "won 3"
  assert lines[0] == "unhinted plays: 4 environments (0/100 episodes) ..."
  assert lines[-1] == "  unhinted plays: done (100/100 episodes, 100 s, won 3)"
  middle = lines[1:-1]
  assert 5 <= len(middle) <= 10  # one line per 10 s at most, never one per update
  assert "  unhinted plays: 10/100 episodes (10 s)" in middle


def test_a_stream_that_is_not_a_terminal_gets_whole_lines_only():
  out = io.StringIO()
  p = progress_lib.Progress(stream=out, interval_s=0.0, heartbeat_s=1e6)
  assert not p.tty
  with p.phase("admission", total=3, unit="programs") as ph:
    for _ in range(3):
      ph.update()
  text = out.getvalue()
  assert "\r" not in text and text.endswith("admission: done (3/3 programs, 0 s)\n")


def test_a_terminal_gets_a_bar_and_the_final_line():
  out = io.StringIO()
  p = progress_lib.Progress(stream=out, tty=True, heartbeat_s=1e6)
  with p.phase("unhinted plays", total=4, unit="episodes") as ph:
    ph.update(4)
  assert "4/4" in out.getvalue() and "unhinted plays: done (4/4 episodes" in out.getvalue()


def test_heartbeat_prints_while_a_phase_is_open_and_stops_after():
  lines = []
  p = progress_lib.Progress(log=lines.append, heartbeat_s=0.05)
  before = set(threading.enumerate())
  with p.phase("learner step", "16 rows"):
    assert len(set(threading.enumerate()) - before) == 1  # the heartbeat
    time.sleep(0.4)
  assert set(threading.enumerate()) <= before  # joined, not left running
  beats = [x for x in lines if x.startswith("  still learner step (")]
  assert len(beats) >= 3
  n = len(lines)
  time.sleep(0.25)
  assert len(lines) == n  # nothing after the phase closed


def test_only_the_innermost_phase_heartbeats():
  lines = []
  p = progress_lib.Progress(log=lines.append, heartbeat_s=0.05)
  with p.phase("designer sampling"):
    with p.compiling("sampler (designer)"):
      time.sleep(0.3)
  beats = [x for x in lines if x.startswith("  still")]
  assert beats and all(x.startswith("  still compiling sampler (designer)") for x in beats)


def test_compiling_announces_only_the_first_call_of_each_kind():
  lines = []
  p = progress_lib.Progress(log=lines.append, heartbeat_s=1e6)
  for kind in ("learner step", "learner step", "sampler (hints)"):
    with p.compiling(kind):
      pass
  assert [x for x in lines if x.startswith("compiling")] == [
      "compiling learner step: first call, XLA compiles it ...",
      "compiling sampler (hints): first call, XLA compiles it ..."]


def test_quiet_prints_nothing_and_starts_no_thread():
  out = io.StringIO()
  p = progress_lib.Progress(stream=out, quiet=True, heartbeat_s=0.01)
  before = threading.active_count()
  with p.phase("x", total=2) as ph:
    assert threading.active_count() == before
    ph.update(2)
    time.sleep(0.05)
  p.line("hello")
  assert out.getvalue() == ""


def test_eta_leaves_out_the_first_step_of_each_kind():
  # regen steps 100 (compiles) then 40; plain steps 30 then 20: means 40 and 20.
  done = [(True, 100.0), (False, 30.0), (True, 40.0), (False, 20.0)]
  assert progress_lib.eta_s(done, [True, False, False]) == 40.0 + 20.0 + 20.0
  assert progress_lib.eta_s([(True, 90.0)], [False, True]) == 180.0  # unseen kind: overall mean
  assert progress_lib.eta_s([], [True]) is None


def test_step_line_starts_with_the_step_and_survives_a_skipped_learner():
  row = {"agent_return_mean": 0.5, "agent_win_rate": 0.25, "designer_attempts": 2,
         "designer_admitted": 0, "loss": 0.01, "clip_frac_low": 0.1, "clip_frac_high": 0.05,
         "time_total_s": 100.0, "time_sample_s": 60.0, "time_learner_s": 30.0}
  line = progress_lib.step_line(1, 4, row, 120.0)
  assert line.startswith("step 2/4  return +0.500  win 0.25  admitted 0/2  loss +0.0100  "
                         "clip 0.150  100 s (sampling 60 learner 30 other 10)")
  assert line.endswith("eta 2.0 min")
  line = progress_lib.step_line(0, 1, {"learner_skipped": "no trained tokens"}, None)
  assert "learner skipped" in line and "return -" in line and line.endswith("eta -")
