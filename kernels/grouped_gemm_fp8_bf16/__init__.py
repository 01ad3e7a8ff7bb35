"""Case 03, CUTLASS example 69 (Hopper fp8 e5m2 × bf16 grouped GEMM): the plug-in surface.

Variants: ``model``, the kernel's arithmetic in numpy (runs on any host); ``cute_dsl``, the
CuTe DSL port (``port``), compiled for sm_90a on any host; ``cutlass_ex69``, the example's
own kernels through our harness, compiled by nvcc on any host. The two GPU variants run
only on an sm_90 GPU (``device``). Baselines: XLA's bf16 ragged_dot and a dense matmul per
group on pre-converted B (without the work: on a GPU or a TPU) and the C++ reference (the
best alternative, GPU-only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from kernels import contract
from kernels.contract import SINGLE_OUTPUT, NotRunnable, Runnable
from kernels.grouped_gemm_fp8_bf16 import (
    baselines,
    bitwise,
    builds,
    device,
    near_misses,
    numerics,
    oracle_f64,
    problems,
    upstream,
)

CASE = "grouped_gemm_fp8_bf16"
VARIANTS = ("model", "cute_dsl", "cutlass_ex69")
BASELINES = (*baselines.XLA, "cutlass_ex69")
NO_GPU = "kernel verification needs an sm_90 GPU; this host has none"
# Why each GPU-only variant or baseline cannot run where the target is a TPU.
NOT_ON_A_TPU = {
    "cute_dsl": "the CuTe DSL port is an sm_90a kernel (TMA, wgmma fed from registers) and "
                "needs an sm_90 GPU",
    "cutlass_ex69": "CUTLASS example 69 is compiled by nvcc for sm_90a and needs an sm_90 GPU",
}


def make_inputs(params: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return problems.make_inputs(problems.from_params(params), rng)


def oracle(params: dict[str, Any], inputs: dict[str, np.ndarray]) -> np.ndarray:
    return oracle_f64.oracle(problems.from_params(params), inputs)


def check_params(params: dict[str, Any]) -> tuple[str, str] | None:
    """Why the grouped problem is invalid (shape, alignment, mode): the field and what is
    wrong with it; or None."""
    try:
        problems.from_params(params)
    except problems.ProblemError as error:
        return error.key, error.why
    return None


def outputs(variant: str) -> tuple[str, ...]:
    """Every variant computes D, fetched as one array (``kernel``): the oracle's one
    output."""
    _check_variant(variant)
    return (SINGLE_OUTPUT,)


def baseline_outputs(name: str) -> tuple[str, ...]:
    """Both baselines compute D, fetched as one array, as the variants do."""
    if name not in BASELINES:
        raise ValueError(f"unknown {CASE} baseline {name!r}; known: {BASELINES}")
    return (SINGLE_OUTPUT,)


def build(variant: str, params: dict[str, Any], build_dir: Path | None = None
          ) -> dict[str, Any]:
    _check_variant(variant)
    return builds.build(variant, problems.from_params(params), _kept_in(build_dir))


def compare(params: dict[str, Any], inputs: dict[str, np.ndarray], output: str,
            got: np.ndarray, want: np.ndarray, tolerance: dict[str, Any],
            poisoned: bool = False, outputs: dict[str, np.ndarray] | None = None
            ) -> dict[str, Any]:
    """The per-element fp32 bound (numerics.compare), with the example's rule beside it;
    every element of D is written, so poison changes nothing (D is the only output)."""
    return numerics.compare(problems.from_params(params), inputs, got, want, tolerance)


def model_outputs(params: dict[str, Any], inputs: dict[str, np.ndarray],
                  want: np.ndarray) -> dict[str, np.ndarray]:
    """What a correct kernel writes: the numerics model's D."""
    return {"out": numerics.model(problems.from_params(params), inputs)}


def mutants(params: dict[str, Any]):
    """Near misses of D (``near_misses``) that the check must catch."""
    return near_misses.mutants(params)


def kernel(variant: str, params: dict[str, Any], purpose: str,
           build_dir: Path | None = None) -> Runnable:
    _check_variant(variant)
    grouped = problems.from_params(params)
    if variant == "model":
        return model_runnable(grouped)
    return _on_gpu(variant, grouped, purpose, build_dir)


def _on_gpu(name: str, grouped: problems.GroupedProblem, purpose: str,
            build_dir: Path | None) -> Runnable:
    """A GPU variant or baseline; NotRunnable where no sm_90 GPU is found. Example 69 is
    checked through its harness on files and timed through its library. The XLA baselines
    also run on a TPU; where the job's target is one, the GPU kernels refuse, saying why,
    before anything opens the chip."""
    if name in NOT_ON_A_TPU and os.environ.get(contract.TARGET_PLATFORM) == "tpu":
        raise NotRunnable(f"not runnable on a TPU: {NOT_ON_A_TPU[name]}")
    if name in baselines.XLA and device.on_tpu():
        return baselines.XLA[name](grouped)
    found = device.sm90_device()
    if found is None:
        raise NotRunnable(NO_GPU)
    if name == "cute_dsl":
        return device.port_runnable(grouped, sms=found[1], build_dir=_kept_in(build_dir))
    if name == "cutlass_ex69":
        make = device.reference_runnable if purpose == "check" else \
            device.reference_library_runnable
        return make(grouped, _kept_in(build_dir))
    return baselines.XLA[name](grouped)


def _kept_in(build_dir: Path | str | None) -> str:
    """The folder the builds live in: the compiled port and example 69 are kept there."""
    if build_dir is None:
        raise ValueError(f"{CASE} keeps its builds in a folder: pass build_dir")
    return str(build_dir)


def model_runnable(grouped: problems.GroupedProblem) -> Runnable:
    """The numerics model as a Runnable: numpy on the host."""
    return Runnable(prepare=lambda inputs: (inputs,),
                    call=lambda inputs: numerics.model(grouped, inputs),
                    sync=lambda out: None, fetch=np.asarray,
                    execution=contract.execution(
                        "numpy model of the kernel's arithmetic on the host CPU (not a "
                        "kernel)", subject="numerics model", device="cpu"))


def baseline(name: str, params: dict[str, Any], build_dir: Path | None = None
             ) -> Runnable:
    if name not in BASELINES:
        raise ValueError(f"unknown {CASE} baseline {name!r}; known: {BASELINES}")
    return _on_gpu(name, problems.from_params(params), "time", build_dir)


def bit_exact(points: list[dict[str, Any]], build_dir: Path | str, seed: int
              ) -> list[dict[str, Any]]:
    """The port against example 69 bit for bit at ``points`` (``bitwise``); NotRunnable
    without an sm_90 GPU."""
    return bitwise.compare(points, _kept_in(build_dir), seed)


def reference_file() -> str:
    """Example 69's source in the pinned nvidia-cutlass wheel (hashed into build records)."""
    return str(upstream.EXAMPLE)


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown {CASE} variant {variant!r}; known: {VARIANTS}")


def work(params: dict[str, Any], computed: tuple[str, ...]) -> dict[str, Any]:
    """The least work of D = alpha·A·scale(B) + beta·C (``casebook.core.speed_of_light``):
    2·ΣM·N·K FLOPs in bf16 (e5m2 B converts to bf16 exactly; no faster tensor core takes
    bf16 A), A, B, its scales and (beta nonzero) C read once, D (f16) written once."""
    problem = problems.from_params(params)
    rows = sum(problem.m)
    moved = (rows * problem.k * 2 + problem.groups * problem.n * problem.k
             + problem.groups * problem.scale_k * problem.n * 2
             + (rows * problem.n * 2 if problem.beta else 0) + rows * problem.n * 2)
    return {"flops": 2 * rows * problem.n * problem.k, "bytes": moved, "math": "bf16",
            "basis": f"one grouped GEMM of {rows:,} rows, N {problem.n}, K {problem.k} in "
                     f"{problem.groups} groups; inputs read and D written once"}
