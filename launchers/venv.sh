#!/usr/bin/env bash
# Creates ./.venv (Python 3.11) and installs the pinned requirements; `venv.sh test` adds the
# test-only ones (torch CPU, for parity tests against transformers). Re-running is cheap: the
# install is skipped while the requirements files are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

py="${PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      py="$cand"; break
    fi
  done
fi
[ -n "$py" ] || { echo "venv.sh: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

[ -x .venv/bin/python ] || "$py" -m venv .venv
files="requirements.txt requirements-nodeps.txt"
[ "${1:-}" = test ] && files="$files requirements-test.txt"
stamp=".venv/.installed-$(cat $files | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  .venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
  if [ "${1:-}" = test ]; then .venv/bin/python -m pip install -q -r requirements-test.txt; fi
  touch "$stamp"
fi
