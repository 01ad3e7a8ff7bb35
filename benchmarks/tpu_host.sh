#!/usr/bin/env bash
# On the offline TPU host, in the project folder carried there together with
# build/tpu-host/ (`make tpu-host`): install the wheelhouse into build/tpu-host/site with
# pip --no-index, that folder appended to PYTHONPATH (the host's own jax, jaxlib, libtpu
# and numpy come first and are never replaced), then run the TPU window
# (configs/tpu-window.yaml) with the archive going to OUT. Extra arguments go to
# casebook.hosts.gpu_window (e.g. --dry-run).
#
#   bash benchmarks/tpu_host.sh OUT
#
# The records name the commit the bundle was made from (build/tpu-host/tree.json), marked
# -dirty where a tracked file differs from it (the window then refuses to run), unless
# CASEBOOK_COMMIT is set. CASEBOOK_PYTHON: the host's interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/tpu_host.sh OUT [casebook.hosts.gpu_window arguments]}
shift
python=${CASEBOOK_PYTHON:-python3}
site="$PWD/build/tpu-host/site"
"$python" -m casebook.hosts.host_install build/tpu-host "$site"
if [ -z "${CASEBOOK_COMMIT:-}" ]; then
  CASEBOOK_COMMIT=$("$python" -m casebook.hosts.wheelhouse commit build/tpu-host)
fi
export CASEBOOK_COMMIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site"
exec "$python" -m casebook.hosts.gpu_window --plan configs/tpu-window.yaml --out "$out" "$@"
