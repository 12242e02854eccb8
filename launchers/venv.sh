#!/usr/bin/env bash
# Creates ./.venv (Python 3.11), installs the pinned requirements and the project itself (editable,
# so that `spade_jax.sandbox` / `spade_jax.eval` resolve as they do in an installed package);
# `venv.sh test` adds the test-only ones (torch CPU, for parity tests against transformers).
# Re-running is cheap: when the requirements files are unchanged and launchers/check_venv.py finds
# every pin installed and intact, nothing is installed; a damaged venv is rebuilt.
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

files="requirements.txt requirements-nodeps.txt"
resolved="-r requirements.txt"
if [ "${1:-}" = test ]; then files="$files requirements-test.txt"; resolved="$resolved -r requirements-test.txt"; fi
stamp=".venv/.installed-$(cat $files pyproject.toml | sha256sum | cut -c1-16)"

if [ -f "$stamp" ] && ! .venv/bin/python launchers/check_venv.py $files; then
  echo "venv.sh: .venv is damaged; rebuilding it" >&2
  rm -rf .venv
fi
if [ -e .venv ] && ! .venv/bin/python -c '' 2>/dev/null; then
  echo "venv.sh: .venv/bin/python does not run; rebuilding .venv" >&2
  rm -rf .venv
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
if [ ! -f "$stamp" ]; then
  echo "venv.sh: installing the pinned requirements into .venv (a few minutes the first time)" >&2
  pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
  "${pip[@]}" --upgrade pip
  # One resolver pass over everything with dependencies, then the data-only packages without
  # theirs (their metadata asks for API clients and an old numpy we never import), so pip never
  # reports conflicts against them.
  "${pip[@]}" $resolved
  "${pip[@]}" --no-deps -r requirements-nodeps.txt
  PYTHONWARNINGS=ignore "${pip[@]}" --no-deps -e .  # quiet about setuptools' editable notes
  .venv/bin/python launchers/check_venv.py $files
  rm -f .venv/.installed-*
  touch "$stamp"
fi
