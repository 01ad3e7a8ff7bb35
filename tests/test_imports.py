"""Every module of the project imports in this environment, and so does every package the
GPU path loads lazily. Run in the rehearsal of the offline GPU host (`make rehearse`), it
proves the host's packages plus the wheelhouse are all that the pipeline needs."""

from __future__ import annotations

import importlib
import os

import pytest

from casebook import paths
from kernels.grouped_gemm_fp8_bf16 import compile_port

OWN = sorted(
    ".".join(path.relative_to(paths.SOURCE_ROOT).with_suffix("").parts)
    for package in ("casebook", "kernels")
    for path in (paths.SOURCE_ROOT / package).rglob("*.py")
    if path.name != "__init__.py" or path.parent != paths.SOURCE_ROOT / package
)
# Imported inside functions on the GPU path (clocks, throttling, the host record, case 03,
# the Mosaic GPU lowering) or by Snakemake's own start.
LAZY = ["pynvml", "cuda.bindings.driver", "cuda.bindings.runtime", "snakemake",
        "jax.experimental.mosaic.gpu", "jax.experimental.pallas.mosaic_gpu", "absl",
        "cutlass.cute", "psutil", "jsonschema"]
# In env/cuda.lock and the wheelhouse, not in env/cpu.lock.
CUDA_ONLY = ["cupti.cupti"]
REHEARSAL = "CASEBOOK_HOST_REHEARSAL"
# The compile side of case 03: CuTe DSL compiles and exports the port where the wheelhouse
# is built; a GPU host runs the exported library without the DSL (compile_port, aot).
DSL = ["kernels.grouped_gemm_fp8_bf16.port", "cutlass.cute"]


@pytest.mark.parametrize("module", [m for m in [*OWN, *LAZY] if m not in DSL])
def test_module_imports(module):
    importlib.import_module(module)


@pytest.mark.skipif(os.environ.get(REHEARSAL) and not compile_port.dsl_installed(),
                    reason="the rehearsed GPU host has no CuTe DSL: it runs the exported port")
@pytest.mark.parametrize("module", DSL)
def test_dsl_module_imports(module):
    importlib.import_module(module)


@pytest.mark.skipif(not os.environ.get(REHEARSAL),
                    reason=f"cupti-python is in env/cuda.lock only ({REHEARSAL} unset)")
@pytest.mark.parametrize("module", CUDA_ONLY)
def test_cuda_lock_module_imports(module):
    importlib.import_module(module)
