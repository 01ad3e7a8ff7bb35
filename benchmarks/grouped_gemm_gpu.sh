#!/usr/bin/env bash
# Case 03 on an sm_90 GPU host (H100/H200): the one prepared run that verifies and times
# the CuTe DSL port and CUTLASS example 69 (and the baselines) and leaves the records to
# commit. Not yet run: no sm_90 GPU was available when it was written.
#
#   bash benchmarks/grouped_gemm_gpu.sh        # then: git add results/<target>/grouped_gemm_fp8_bf16
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | grep -q ", 9.0" || {
  echo "grouped_gemm_gpu.sh: needs an sm_90 GPU (nvidia-smi finds none)" >&2; exit 1; }
make env LOCK=cuda
# Bit-exact port against the C++ reference on every configuration of the case.
.venv/bin/python -m pytest tests/test_grouped_gemm_gpu.py -q
# Build, verify, time and baseline rules for this case (target detected from the host).
.venv/bin/snakemake --cores all grouped_gemm_fp8_bf16
git status --short results/
