"""Case 01, the masked NVFP4 MoE: the surface the pipeline calls (kernels.contract).

Variants (``port.VARIANTS``) run single stages or the whole path as Pallas Mosaic
GPU kernels for Hopper, in the Mosaic GPU interpreter on a CPU host, and are lowered
for sm_90a. The oracle answers every stage by name (``oracle``): a1 and a2 (NVFP4 codes
and scales, checked tie-aware), h (GEMM1), out (GEMM2), out_dense (the bf16 baselines').
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

from kernels import contract, mgpu_interpret, mgpu_lowering
from kernels.contract import Runnable
from kernels.moe_nvfp4 import (
    ablations,
    baselines,
    checks,
    inputs,
    near_misses,
    oracle_planes,
    port,
    upstream,
)
from kernels.moe_nvfp4.mgpu_mainloop import SMEM_LIMIT_BYTES
from kernels.runnable import from_jax

REFERENCE = ("flashinfer", "gemm/kernels/grouped_gemm_masked_blackwell.py")
MULTIPLES = {"m": 128, "hidden": 256, "inter": 256}  # every variant's tiles divide these


def make_inputs(params: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return inputs.make(params, rng)


def oracle(params: dict[str, Any], given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every stage's float64 answer and bound, by output name (see ``oracle``)."""
    return oracle_planes.oracle(given)


def compare(params: dict[str, Any], inputs: dict[str, np.ndarray], output: str,
            got: np.ndarray, want: np.ndarray, tolerance: dict[str, Any],
            poisoned: bool = False, outputs: dict[str, np.ndarray] | None = None
            ) -> dict[str, Any]:
    """``checks.compare``: codes tie-aware, values within their bound, a whole path's out
    through the kernel's own a2 or h (``whole_path``); where the outputs were poisoned,
    rows past masked_m must still be NaN."""
    return checks.compare(output, got, want, tolerance, poisoned, inputs, outputs)


def model_outputs(params: dict[str, Any], given: dict[str, np.ndarray],
                  want: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What correct kernels write at every stage (``near_misses.model_outputs``)."""
    return near_misses.model_outputs(given, want)


def mutants(params: dict[str, Any]):
    """Near misses of every stage (``near_misses``) that the checks must catch."""
    return near_misses.mutants(params)


def check_params(params: dict[str, Any]) -> tuple[str, str] | None:
    """The first size that some variant's tiles do not divide, and why; or None."""
    for key, multiple in MULTIPLES.items():
        if params[key] % multiple:
            return key, f"{params[key]} is not a multiple of {multiple}"
    return None


def outputs(variant: str) -> tuple[str, ...]:
    """The stages' outputs the variant returns (``port.Variant.outputs``, the names
    its function writes; the compiled reference: its GEMM1 and GEMM2)."""
    if variant == upstream.VARIANT:
        return ("h", "out")
    return _variant(variant).outputs()


def baseline_outputs(name: str) -> tuple[str, ...]:
    """Both baselines answer the oracle's bf16 dense path (``baselines.OUTPUT``)."""
    _baseline(name)
    return (baselines.OUTPUT,)


def _variant(name: str) -> port.Variant:
    if name not in port.VARIANTS:
        raise ValueError(f"unknown moe_nvfp4 variant {name!r}; known: {sorted(port.VARIANTS)}")
    return port.VARIANTS[name]


def _configured(name: str, params: dict[str, Any]) -> port.Variant:
    """A variant's configuration at ``params`` (a point's tile row applied), or an
    ablation's, derived from its variant's (``ablations``)."""
    if name in ablations.ABLATIONS:
        return ablations.configured(name, _ablated(name, params))
    return port.with_tiles(_variant(name), params.get("tiles"))


def _ablated(name: str, params: dict[str, Any]) -> port.Variant:
    """The configuration at ``params`` of the variant ablation ``name`` ablates."""
    return port.with_tiles(_variant(ablations.find(name).of), params.get("tiles"))


WHOLE_PATH = ("out_fused", "out_unfused", baselines.OUTPUT)  # hidden -> out, every stage


def work(params: dict[str, Any], computed: tuple[str, ...]) -> dict[str, Any]:
    """The least work of computing ``computed`` at ``params`` (``casebook.core.speed_of_light``)
    over the fewest rows a draw can have (``inputs.masked_m``: 0.7 · expected_m per
    expert, or one row in all but one expert): GEMM1 (2·rows·2N·K) and GEMM2 (2·rows·K·N)
    where the outputs need them, in NVFP4 (half a byte per value and a scale byte per 16),
    each input read and each output written once, the weights of experts with rows."""
    e, m, k, n = inputs.sizes(params)
    if "expected_m" in params:
        experts = e
        rows = e * min(m, round(0.7 * params["expected_m"]))
    else:
        experts = max(e - 1, 1)
        rows = experts
    computed = set(computed)
    whole = bool(computed & set(WHOLE_PATH))
    gemm1 = whole or bool(computed & {"h", "a2"})
    gemm2 = whole or "out" in computed

    def nvfp4(count: int) -> int:
        return count // 2 + count // 16

    quantized = whole or "a1" in computed  # the path starts from bf16 hidden states
    read = rows * k * 2 if quantized else 0  # hidden, bf16
    read += nvfp4(rows * k) if gemm1 and not quantized else 0  # a1, given
    read += nvfp4(rows * n) if gemm2 and not gemm1 else 0  # a2, given
    read += (experts * nvfp4(2 * n * k) if gemm1 else 0) + (experts * nvfp4(k * n)
                                                           if gemm2 else 0)
    written = {"a1": nvfp4(rows * k), "h": rows * 2 * n * 2, "a2": nvfp4(rows * n),
               **dict.fromkeys(("out", *WHOLE_PATH), rows * k * 2)}
    flops = (2 * rows * 2 * n * k if gemm1 else 0) + (2 * rows * k * n if gemm2 else 0)
    return {"flops": flops, "bytes": read + sum(written[o] for o in computed),
            "math": "fp4",
            "basis": f"{', '.join(sorted(computed))} over at least {rows:,} rows "
                     f"({experts} experts with rows): "
                     + (" and ".join(g for g, on in (("GEMM1", gemm1), ("GEMM2", gemm2)) if on)
                        or "no matmul") + "; inputs read and outputs written once"}


def ablates(name: str) -> str:
    """The variant ablation ``name`` switches a part of off (``ablations``)."""
    return ablations.find(name).of


def ablation_refusal(name: str, params: dict[str, Any]) -> str | None:
    """Why ablation ``name`` changes nothing at ``params`` (None: it applies)."""
    return ablations.find(name).refuse(_ablated(name, params))


def _baseline(name: str):
    if name not in baselines.BASELINES:
        raise ValueError(f"unknown moe_nvfp4 baseline {name!r}; known: "
                         f"{sorted(baselines.BASELINES)}")
    return baselines.BASELINES[name]


def build(variant: str, params: dict[str, Any], build_dir: Path | None = None
          ) -> dict[str, Any]:
    """Lower every kernel of the variant for its architecture (sm_90a or sm_100a): grid,
    block, shared memory and, on sm_100a, tensor-memory columns and the MMA's kind. A
    configuration over a budget fails naming its stage and configuration. The reference
    (``upstream``) is compiled with CuTe DSL, its launch recorded."""
    if variant == upstream.VARIANT:
        return upstream.build(params)
    e, m, k, n = inputs.sizes(params)
    chosen = _configured(variant, params)
    artifacts = []
    for stage, (fn, config, shapes) in port.kernels(chosen, e, m, k, n).items():
        try:
            lowered = mgpu_lowering.lower_for_cuda(fn, shapes)
        except ValueError as error:
            raise ValueError(f"{variant} {stage} ({config!r}): {error}") from error
        (launch,) = lowered["launches"]
        artifacts.append({
            "target": f"cuda {chosen.arch}",
            "kind": f"Pallas Mosaic GPU kernel: {stage} (lowered on CPU, not run)",
            "seconds": lowered["seconds"],
            "facts": {**launch, "smem_limit_bytes": SMEM_LIMIT_BYTES, "config": repr(config)}})
    return {"artifacts": artifacts}


def _fetch(raw: dict[str, Any]) -> dict[str, np.ndarray]:
    import jax

    host = jax.device_get(raw)
    return {name: (checks.kernel_planes(*map(np.asarray, value)) if name in checks.CODE_OUTPUTS
                   else np.asarray(value, np.float64))
            for name, value in host.items()}


def kernel(variant: str, params: dict[str, Any], purpose: str,
           build_dir: Path | None = None) -> Runnable:
    """The variant on a GPU of its architecture, or (sm_90a only) in the Mosaic GPU
    interpreter on a host without a GPU (``check``: with race detection); where the target
    is a TPU, not runnable (``mgpu_interpret.placement`` says why). The compiled reference
    runs nowhere here."""
    if variant == upstream.VARIANT:
        on_a_tpu = os.environ.get(contract.TARGET_PLATFORM) == "tpu"
        raise contract.NotRunnable(
            ("not runnable on a TPU: " if on_a_tpu else "")
            + f"FlashInfer's kernel (the reference): compiled for {upstream.ARCH} "
            "on a CPU host, its launch recorded, never run (it needs a Blackwell GPU, and "
            "torch for its host wrapper)")
    e, m, k, n = inputs.sizes(params)
    chosen = _configured(variant, params)
    interpret, execution = mgpu_interpret.placement(purpose, chosen.arch)
    fn = port.function(chosen, e, m, k, n, interpret=interpret)
    return from_jax(fn, port.INPUTS, execution)._replace(fetch=_fetch)


def baseline(name: str, params: dict[str, Any], build_dir: Path | None = None
             ) -> Runnable:
    return from_jax(_baseline(name)(), baselines.INPUTS,
                    contract.execution("XLA"))


def races_found() -> bool:
    return mgpu_interpret.races_found()


def reset() -> None:
    mgpu_interpret.reset_interpreter()


def reference_file() -> str | None:
    """FlashInfer's kernel source where FlashInfer is installed (found, not imported:
    importing it needs torch and a GPU); None on a host without it."""
    spec = importlib.util.find_spec(REFERENCE[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / REFERENCE[1]
    return str(path) if path.exists() else None


def tile_candidates(variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """The GEMM's tile rows the autotune rule measures for ``variant`` (``autotune``)."""
    from kernels.moe_nvfp4 import autotune

    return autotune.tile_candidates(variant, params)


def intermediates(variant: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """What the variant's kernels hand each other through memory (``port.intermediates``)."""
    e, m, k, n = inputs.sizes(params)
    if variant == upstream.VARIANT:
        return []
    return port.intermediates(_variant(variant), e, m, k, n)
