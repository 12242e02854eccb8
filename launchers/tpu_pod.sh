#!/usr/bin/env bash
# Runs one spade_jax entry point on every host of a Cloud TPU VM slice (the same program on every
# host; JAX discovers the slice itself). Flags after the module are forwarded unchanged.
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a bash launchers/tpu_pod.sh spade_jax.generate \
#       --model /gcs-fuse/Qwen3-8B --config.mesh.fsdp=-1 --config.mesh.data=1 --prompt "..."
#
# The repository must already be at the same path on every host (e.g. a shared disk or a
# `gcloud compute tpus tpu-vm scp --worker=all`); `launchers/venv.sh` is run there first.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
module="$1"; shift
repo="${REPO_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
args=$(printf '%q ' "$@")
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command \
  "cd $repo && bash launchers/venv.sh && SPADE_DISTRIBUTED=1 .venv/bin/python -m $module $args"
