"""Checks a finished main-job workdir: `python .ci/check_run.py WORKDIR STEPS`.

The run must have left one metrics row per step, a report.md that names the warm start the run
began from, and at least one PNG plot that report.md shows, each a real PNG file.
"""

import json
import os
import re
import sys

workdir, steps = sys.argv[1], int(sys.argv[2])
with open(os.path.join(workdir, "metrics.jsonl")) as f:
  rows = [json.loads(line) for line in f if line.strip()]
assert [r["step"] for r in rows] == list(range(steps)), f"metrics steps {[r['step'] for r in rows]}"
with open(os.path.join(workdir, "report.md")) as f:
  report = f.read()
assert "- warm start: " in report, "report.md names no warm start"
images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", report)
assert images, "report.md shows no PNG"
for rel in images:
  with open(os.path.join(workdir, rel), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{rel} is not a PNG"
print(f"main job: {len(rows)} step(s), report.md with {len(images)} plots: {', '.join(images)}")
