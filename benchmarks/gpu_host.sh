#!/usr/bin/env bash
# On the offline GPU host, in the project folder carried there together with
# build/gpu-host/ (`make gpu-host`): install the wheelhouse into build/gpu-host/site with
# pip --no-index, unpack case 03's builds, then run the GPU window (gpu_run.sh) with the
# archive going to OUT. Extra arguments go to gpu_run.sh (e.g. --dry-run --target h200).
#
#   CASEBOOK_COMMIT=<sha> bash benchmarks/gpu_host.sh OUT     # CASEBOOK_COMMIT: no .git
#
# CASEBOOK_PYTHON: the host's interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/gpu_host.sh OUT [gpu_run.sh arguments]}
shift
python=${CASEBOOK_PYTHON:-python3}
PYTHONPATH=workflow "$python" -m casebook.wheelhouse install build/gpu-host build/gpu-host/site
tar -xJf build/gpu-host/case03-build.tar.xz
export CASEBOOK_SITE="$PWD/build/gpu-host/site" CASEBOOK_PYTHON="$python"
exec bash benchmarks/gpu_run.sh --out "$out" "$@"
