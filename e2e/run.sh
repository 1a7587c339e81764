#!/usr/bin/env bash
# End-to-end suite on kind: creates a cluster, builds and loads the image,
# installs cert-manager and the chart (Metacontroller dependency fetched), then
# runs e2e/test_kind.py. Needs docker (a working engine), kind, kubectl, helm
# and internet access (sidecar, Metacontroller and cert-manager images, the
# Hugging Face model). Without them it says why and exits 0.
#
#   e2e/run.sh                 # create, test, delete the cluster
#   PRAESTO_E2E_KEEP=1 e2e/run.sh   # keep the cluster for debugging
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "e2e: SKIPPED: not installed: ${missing[*]}" >&2
  exit 0
fi
if ! docker info >/dev/null 2>&1; then
  echo "e2e: SKIPPED: docker is installed but no engine answers (docker info failed)" >&2
  exit 0
fi

PY=${PYTHON:-.venv/bin/python}
export PRAESTO_E2E=1
exec "$PY" -m pytest -m e2e -p no:xdist -v e2e/ "$@"
