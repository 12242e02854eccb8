#!/usr/bin/env bash
# Runs one spade_jax entry point on a single GPU node (all local GPUs in one mesh).
# jax[cuda] replaces the CPU jaxlib in the venv on first use.
#
#   bash launchers/gpu_node.sh spade_jax.generate --model /data/Qwen3-4B --chat --prompt "..."
set -euo pipefail
cd "$(dirname "$0")/.."
bash launchers/venv.sh
.venv/bin/python -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null \
  || .venv/bin/python -m pip install -q "jax[cuda12]==$(.venv/bin/python -c 'import jax; print(jax.__version__)')"
module="$1"; shift
exec .venv/bin/python -m "$module" "$@"
