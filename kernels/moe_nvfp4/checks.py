"""The case's own checks of its outputs against the oracle's planes (``oracle_planes``).

Rows the oracle marks NaN (past masked_m) are not compared: the kernels never write
them (the interpreter's poison there is checked by the tests).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.moe_nvfp4 import nvfp4, oracle_planes


def _half_step(y):
    """Half the e2m1 grid spacing around |y| (saturating at 6)."""
    a = np.minimum(np.abs(y), nvfp4.E2M1_MAX)
    return np.where(a < 2, 0.25, np.where(a < 4, 0.5, 1.0))


def _half_quantum(v):
    _, exp = np.frexp(v)
    return np.exp2(np.maximum(exp - 1, -6) - 3.0) / 2


def codes(got: np.ndarray, want: np.ndarray, window: float) -> dict[str, Any]:
    """A kernel's codes and scales ([2, ...]: e2m1 values, e4m3 scale per element) against
    [x·gs, exact scale, their slacks]: each scale must be a rounding of the exact scale
    moved by at most its slack plus ``window`` (relative), each code likewise a rounding
    of x·gs / (the kernel's own scale). worst_error_over_tolerance: the largest
    |rounding error| over the largest a correct rounding may make (<= 1 passes)."""
    valid = np.isfinite(want[0])
    value, scale = got[0][valid], got[1][valid]
    xgs, exact, x_slack, scale_slack = (w[valid] for w in want)
    nan_count = int(np.count_nonzero(~np.isfinite(value) | ~np.isfinite(scale)))
    scale_room = scale_slack + exact * window
    low = nvfp4.round_e4m3(np.maximum(exact - scale_room, 0))
    high = nvfp4.round_e4m3(exact + scale_room)
    scale_ok = (low <= scale) & (scale <= high)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(scale > 0, xgs / scale, 0.0)
        y_room = np.where(scale > 0, x_slack / scale, 0.0) + np.abs(y) * window
    a, b = nvfp4.e2m1_value(nvfp4.e2m1_code(y - y_room)), nvfp4.e2m1_value(
        nvfp4.e2m1_code(y + y_room))
    code_ok = np.where(scale > 0, (np.minimum(a, b) <= value) & (value <= np.maximum(a, b)),
                       value == 0)
    code_ratio = (np.abs(value - np.clip(y, -6, 6)) / (_half_step(y) + y_room))
    scale_ratio = np.abs(scale - np.minimum(exact, nvfp4.E4M3_MAX)) / (
        _half_quantum(exact) + scale_room)
    ratios = np.concatenate([code_ratio.ravel(), scale_ratio.ravel()])
    ratios = np.where(np.isfinite(ratios), ratios, np.inf)
    worst = float(ratios.max(initial=0.0))
    return {
        "passed": nan_count == 0 and bool(code_ok.all() and scale_ok.all()),
        "nan_count": nan_count,
        "max_abs_error": float(np.nan_to_num(np.abs(value * scale - xgs)).max(initial=0.0)),
        "worst_error_over_tolerance": worst if nan_count == 0 else None,
        "code_mismatches": int(np.count_nonzero(~code_ok)),
        "scale_mismatches": int(np.count_nonzero(~scale_ok)),
        "codes_at_ties": int(np.count_nonzero(value != nvfp4.e2m1_value(
            nvfp4.e2m1_code(y)))),
    }


def bounded(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> dict[str, Any]:
    """|got − value| <= atol + rtol·|value| + the oracle's derived bound, elementwise."""
    valid = np.isfinite(want[0])
    value, bound = want[0][valid], want[1][valid]
    out = np.asarray(got, np.float64)[valid]
    nan_count = int(np.count_nonzero(~np.isfinite(out)))
    error = np.abs(out - value)
    allowed = atol + rtol * np.abs(value) + bound
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(error == 0, 0.0, error / allowed)
    ratio = np.where(np.isfinite(ratio), ratio, np.inf)
    worst = float(ratio.max(initial=0.0))
    return {
        "passed": nan_count == 0 and worst <= 1,
        "nan_count": nan_count,
        "max_abs_error": float(np.nan_to_num(error).max(initial=0.0)),
        "max_rel_error": float(np.nan_to_num(error / np.maximum(np.abs(value), 1e-30))
                               .max(initial=0.0)),
        "worst_error_over_tolerance": worst if nan_count == 0 else None,
    }


CODE_OUTPUTS = ("a1", "a2")


def kernel_planes(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Packed codes and scale bytes (row-major, or flat in the 128x4 layout) -> [2, E, M,
    K]: code values, scale per element."""
    if scales.ndim == 2:
        scales = nvfp4.unswizzle(scales, packed.shape[1], packed.shape[2] // 8)
    values = nvfp4.e2m1_value(nvfp4.unpack(packed))
    per_element = np.repeat(nvfp4.e4m3_value(scales), nvfp4.BLOCK, axis=-1)
    return np.stack([values, per_element])


def tie_aware(x, gs, packed, scales, valid, x_slack=None) -> dict[str, Any]:
    """``codes`` of a kernel's quantization of x on the rows ``valid`` [E, M], with x's
    own error bound ``x_slack`` when x is a computed value."""
    slack = np.zeros(np.shape(x)) if x_slack is None else x_slack
    return codes(kernel_planes(packed, scales),
                 oracle_planes.code_planes(x, gs, valid, slack), nvfp4.TIE_WINDOW)


def compare(output: str, got: np.ndarray, want: np.ndarray, tolerance: dict[str, Any]
            ) -> dict[str, Any]:
    """The check of one named output (codes tie-aware, values against their bound)."""
    is_codes = output in CODE_OUTPUTS
    if (got.shape[1:] if is_codes else got.shape) != want.shape[1:]:
        return {"passed": False, "error": f"shape {got.shape} does not match the oracle's "
                f"planes {want.shape}", "nan_count": 0, "max_abs_error": None,
                "worst_error_over_tolerance": None}
    if is_codes:
        return codes(got, want, tolerance["rtol"])
    return bounded(got, want, tolerance["atol"], tolerance["rtol"])
