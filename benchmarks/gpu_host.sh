#!/usr/bin/env bash
# On the offline GPU host, in the project folder carried there together with
# build/gpu-host/ (`make gpu-host`): install the wheelhouse into build/gpu-host/site with
# pip --no-index, unpack case 03's builds, then run the GPU window (gpu_run.sh) with the
# archive going to OUT. Extra arguments go to gpu_run.sh (e.g. --dry-run --target h200).
#
#   bash benchmarks/gpu_host.sh OUT
#
# The records name the commit the bundle was made from (build/gpu-host/tree.json), marked
# -dirty where a tracked file differs from it (the window then refuses to run), unless
# CASEBOOK_COMMIT is set; a .git that came with the tree is not asked.
# CASEBOOK_PYTHON: the host's interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/gpu_host.sh OUT [gpu_run.sh arguments]}
shift
python=${CASEBOOK_PYTHON:-python3}
"$python" -m casebook.hosts.host_install build/gpu-host build/gpu-host/site
tar -xJf build/gpu-host/case03-build.tar.xz
if [ -z "${CASEBOOK_COMMIT:-}" ]; then
  CASEBOOK_COMMIT=$("$python" -m casebook.hosts.wheelhouse commit build/gpu-host)
fi
export CASEBOOK_COMMIT CASEBOOK_SITE="$PWD/build/gpu-host/site" CASEBOOK_PYTHON="$python"
exec bash benchmarks/gpu_run.sh --out "$out" "$@"
