#!/usr/bin/env bash
# The one prepared run on an sm_90 GPU host (H100/H200): for each case named (default:
# every case), its GPU-only tests, its autotune rule (cases that tune tiles), then its
# build, verify, time and baseline rules for this host's target; the records (and tile
# tables) are left under results/<target>/ to commit. Not yet run: no sm_90 GPU was
# available when it was written.
#
#   bash benchmarks/gpu_run.sh [case ...]      # then: git add results/<target>/
#
# It installs env/cuda.lock first (make env LOCK=cuda). On a host that cannot install it
# (offline, a preinstalled jax), CASEBOOK_VENV=<dir> names an existing environment with
# snakemake; the environment record then shows the drift from the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | grep -q ", 9.0" || {
  echo "gpu_run.sh: needs an sm_90 GPU (nvidia-smi finds none)" >&2; exit 1; }
if [ -n "${CASEBOOK_VENV:-}" ]; then BIN="$CASEBOOK_VENV/bin"; else make env LOCK=cuda; BIN=.venv/bin; fi
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(moe_nvfp4 splash_attention grouped_gemm_fp8_bf16)
for case in "${cases[@]}"; do
  # GPU-only tests of the case, where it has them (e.g. the port bit-exact against the
  # C++ reference on every configuration of case 03).
  for test in tests/test_*"${case%%_*}"*_gpu.py; do
    if [ -e "$test" ]; then PYTHONPATH=workflow:. "$BIN/python" -m pytest "$test" -q; fi
  done
done
# Autotune first (cases with `autotune` variants, e.g. splash_attention): each point's tile
# candidates verified and timed, the pick written to results/<target>/<case>/tiles.yaml,
# which the build, verify and time rules below then apply. A case whose autotune fails
# keeps its config/budget tiles for this run, and the script still exits non-zero.
untuned=()
for case in "${cases[@]}"; do
  if grep -q '^autotune:' "configs/cases/$case.yaml"; then
    "$BIN/snakemake" --cores all --config "cases=[$case]" -- autotune || untuned+=("$case")
  fi
done
"$BIN/snakemake" --cores all "${cases[@]}"
git status --short results/
if [ ${#untuned[@]} -gt 0 ]; then
  echo "gpu_run.sh: autotune FAILED for ${untuned[*]} (see logs/autotune/); their records" \
       "use the config/budget tiles" >&2
  exit 1
fi
