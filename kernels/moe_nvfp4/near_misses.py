"""Case 01's mutants: stage outputs a subtly wrong kernel would write (numpy only).

Correct outputs are the float64 model's (``oracle_f64``), rounded as the kernels round:
codes and scales as planes (``checks.kernel_planes``), values to bf16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.moe_nvfp4 import checks, numerics, oracle_f64, whole_path
from kernels.moe_nvfp4.numerics import bf16
from kernels.mutants import Mutant, bias

K_TILE = 64  # K elements of the smallest GEMM K tile (32 packed bytes)
GRID = np.unique(np.abs(numerics.E2M1_VALUES))  # the e2m1 magnitudes, ascending
GEMMS = {"h": ("a1", "w1", "alpha1"), "out": ("a2", "w2", "alpha2")}  # A, B, alpha inputs


def model_outputs(inputs: dict[str, np.ndarray], want: dict[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """What correct kernels write: the model's codes and scales, its h and out in bf16;
    the unfused path's out from that h (bf16 h and act on the way: ``whole_path``)."""
    out, h = bf16(want["out"][0]), bf16(want["h"][0])
    return {"a1": checks.kernel_planes(inputs["a1_packed"], inputs["a1_scales"]),
            "h": h, "a2": checks.kernel_planes(inputs["a2_packed"], inputs["a2_scales"]),
            "out": out, "out_fused": out, "out_unfused": bf16(whole_path.unfused_out(h, inputs))}


def _scale_shifted(params, inputs, want, correct):
    planes = correct.copy()
    planes[1] = np.roll(planes[1], numerics.BLOCK, axis=-1)  # the next block's scale
    return planes


def _truncated(stage):
    def make(params, inputs, want, correct):
        scale = correct[1]
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(scale > 0, want[stage][0] / scale, 0.0)  # x·gs / sf, exact
        magnitude = np.minimum(np.nan_to_num(np.abs(y)), numerics.E2M1_MAX)
        below = GRID[np.searchsorted(GRID, magnitude, side="right") - 1]  # toward zero
        return np.stack([np.where(np.isnan(y), np.nan, np.copysign(below, y)), scale])
    return make


def _k_tile_dropped(stage):
    """The GEMM of ``stage`` ("h" or "out") without its operand's last K_TILE of K."""
    a, w, alpha = GEMMS[stage]

    def make(params, inputs, want, correct):
        packed = inputs[f"{a}_packed"].copy()
        packed[..., -K_TILE // 2:] = 0
        return bf16(oracle_f64.masked_gemm(packed, inputs[f"{a}_scales"], inputs[f"{w}_packed"],
                                        inputs[f"{w}_scales"], inputs[alpha],
                                        inputs["masked_m"]))
    return make


def _row_past_masked_m(stage):
    """The GEMM of ``stage`` ("h" or "out") also computed on the first row past an
    expert's masked_m."""
    a, w, alpha = GEMMS[stage]

    def make(params, inputs, want, correct):
        masked, rows = inputs["masked_m"], correct.shape[1]
        expert = next((e for e, m in enumerate(masked) if m < rows), None)
        if expert is None:
            return None  # every expert uses every row
        full = oracle_f64.masked_gemm(inputs[f"{a}_packed"], inputs[f"{a}_scales"],
                                   inputs[f"{w}_packed"], inputs[f"{w}_scales"], inputs[alpha],
                                   np.full_like(masked, rows))
        out = correct.copy()
        out[expert, masked[expert]] = bf16(full[expert, masked[expert]])
        return out
    return make


def _act_not_requantized(params, inputs, want, correct):
    """GEMM2 on act itself (bf16), skipping the NVFP4 requantize of stage 3."""
    act = bf16(oracle_f64.silu_mul(np.nan_to_num(want["h"][0])))
    w2 = numerics.dequantize(inputs["w2_packed"], inputs["w2_scales"])
    scale = (inputs["alpha2"].astype(np.float64) * inputs["a2_gs"])[:, None, None]
    out = oracle_f64.gemm_nt(act, w2) * scale
    valid = oracle_f64.valid_rows(inputs["masked_m"], act.shape[1])[..., None]
    return bf16(np.where(valid, out, np.nan))


def mutants(params: dict[str, Any]) -> list[Mutant]:
    return [
        *(Mutant("scale_off_by_one_block", stage, f"{stage}'s scales shifted by one block of "
                 f"{numerics.BLOCK} along K", _scale_shifted) for stage in ("a1", "a2")),
        *(Mutant("codes_truncated", stage, f"{stage}'s e2m1 codes rounded toward zero, not "
                 "to nearest", _truncated(stage)) for stage in ("a1", "a2")),
        bias("h"),
        Mutant("last_k_tile_dropped", "h", f"GEMM1 without the last {K_TILE} of K",
               _k_tile_dropped("h")),
        *(Mutant("row_past_masked_m", stage, f"{stage} also written on one row past an "
                 "expert's masked_m", _row_past_masked_m(gemm))
          for stage, gemm in (("h", "h"), ("out", "out"), ("out_fused", "out"))),
        bias("out"),
        Mutant("last_k_tile_dropped", "out", f"GEMM2 without the last {K_TILE} of K",
               _k_tile_dropped("out")),
        *(bias(path) for path in ("out_fused", "out_unfused")),
        *(Mutant("act_not_requantized", path, "GEMM2 on act in bf16, the NVFP4 requantize "
                 "of stage 3 skipped", _act_not_requantized)
          for path in ("out_fused", "out_unfused")),
    ]
