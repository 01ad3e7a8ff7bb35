"""The case's own checks of its outputs against the oracle's planes (``oracle_planes``).

Rows the oracle marks NaN (past masked_m) are not compared: the kernels never write
them (the interpreter's poison there is checked by the tests).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.moe_nvfp4 import numerics, oracle_f64, oracle_planes, whole_path


def _ratio(error, allowed):
    """error / allowed, 0 where both are 0, inf where only ``allowed`` is."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(error == 0, 0.0, error / allowed)
    return np.where(np.isfinite(ratio), ratio, np.inf)


def _excess(got, nearest, bounds, exact):
    """The error of ``got`` beyond the nearest rounding's, over the most any accepted
    rounding (between ``bounds``) may add: 0 for the nearest, <= 1 when accepted."""
    floor = np.abs(nearest - exact)
    room = np.maximum(np.abs(bounds[0] - exact), np.abs(bounds[1] - exact)) - floor
    return _ratio(np.maximum(np.abs(got - exact) - floor, 0.0), np.maximum(room, 0.0))


def codes(got: np.ndarray, want: np.ndarray, window: float) -> dict[str, Any]:
    """A kernel's codes and scales ([2, ...]: e2m1 values, e4m3 scale per element) against
    [x·gs, exact scale, their slacks]: each scale must be a rounding of the exact scale
    moved by at most its slack plus ``window`` (relative), each code likewise a rounding
    of x·gs / (the kernel's own scale). worst_error_over_tolerance: how much of the tie
    window the kernel used (0: every code the nearest; <= 1: within the window);
    either_way_fraction: the share of elements whose code or scale may round either way."""
    valid = np.isfinite(want[0])
    value, scale = got[0][valid], got[1][valid]
    xgs, exact, x_slack, scale_slack = (w[valid] for w in want)
    nan_count = int(np.count_nonzero(~np.isfinite(value) | ~np.isfinite(scale)))
    scale_room = scale_slack + exact * window
    low = numerics.round_e4m3(np.maximum(exact - scale_room, 0))
    high = numerics.round_e4m3(exact + scale_room)
    scale_ok = (low <= scale) & (scale <= high)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(scale > 0, xgs / scale, 0.0)
        y_room = np.where(scale > 0, x_slack / scale, 0.0) + np.abs(y) * window
    a, b = numerics.e2m1_value(numerics.e2m1_code(y - y_room)), numerics.e2m1_value(
        numerics.e2m1_code(y + y_room))
    code_ok = np.where(scale > 0, (np.minimum(a, b) <= value) & (value <= np.maximum(a, b)),
                       value == 0)
    nearest = numerics.e2m1_value(numerics.e2m1_code(y))
    code_ratio = np.where(scale > 0, _excess(value, nearest, (a, b), np.clip(y, -6, 6)),
                          np.where(value == 0, 0.0, np.inf))
    scale_ratio = _excess(scale, numerics.round_e4m3(exact), (low, high),
                          np.minimum(exact, numerics.E4M3_MAX))
    worst = float(np.concatenate([code_ratio.ravel(), scale_ratio.ravel()]).max(initial=0.0))
    return {
        "passed": nan_count == 0 and bool(code_ok.all() and scale_ok.all()),
        "nan_count": nan_count,
        "max_abs_error": float(np.nan_to_num(np.abs(value * scale - xgs)).max(initial=0.0)),
        "worst_error_over_tolerance": worst if nan_count == 0 else None,
        "code_mismatches": int(np.count_nonzero(~code_ok)),
        "scale_mismatches": int(np.count_nonzero(~scale_ok)),
        "codes_at_ties": int(np.count_nonzero(value != numerics.e2m1_value(
            numerics.e2m1_code(y)))),
        "either_way_fraction": float(np.mean((a != b) | (low != high))) if value.size else 0.0,
    }


def bounded(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> dict[str, Any]:
    """|got − value| <= atol + rtol·|value| + the oracle's derived bound, elementwise."""
    valid = np.isfinite(want[0])
    value, bound = want[0][valid], want[1][valid]
    out = np.asarray(got, np.float64)[valid]
    nan_count = int(np.count_nonzero(~np.isfinite(out)))
    error = np.abs(out - value)
    worst = float(_ratio(error, atol + rtol * np.abs(value) + bound).max(initial=0.0))
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
        scales = numerics.unswizzle(scales, packed.shape[1], packed.shape[2] // 8)
    values = numerics.e2m1_value(numerics.unpack(packed))
    per_element = np.repeat(numerics.e4m3_value(scales), numerics.BLOCK, axis=-1)
    return np.stack([values, per_element])


def tie_aware(x, gs, packed, scales, valid, x_slack=None) -> dict[str, Any]:
    """``codes`` of a kernel's quantization of x on the rows ``valid`` [E, M], with x's
    own error bound ``x_slack`` when x is a computed value."""
    slack = np.zeros(np.shape(x)) if x_slack is None else x_slack
    return codes(kernel_planes(packed, scales),
                 oracle_planes.code_planes(x, gs, valid, slack), numerics.TIE_WINDOW)


def written_past_masked_m(got: np.ndarray, want: np.ndarray) -> int:
    """Elements of a value output on rows past masked_m (NaN in the oracle) that are not
    NaN: written by a kernel whose outputs were poisoned."""
    return int(np.count_nonzero(np.isnan(want[0]) & ~np.isnan(got)))


# A whole path's out, and the intermediate of the same kernel it is checked through.
THROUGH = {"out_fused": "a2", "out_unfused": "h"}


def _whole_path(output: str, got: np.ndarray, inputs: dict[str, np.ndarray],
                outputs: dict[str, np.ndarray], tolerance: dict[str, Any]) -> dict[str, Any]:
    given = outputs.get(THROUGH[output])
    if given is None:
        return {"passed": False, "error": f"{output} is checked through the same kernel's "
                f"{THROUGH[output]}, which it did not return", "nan_count": 0,
                "max_abs_error": None, "worst_error_over_tolerance": None}
    check = whole_path.fused if output == "out_fused" else whole_path.unfused
    return check(got, np.asarray(given, np.float64), inputs, tolerance["atol"],
                 tolerance["rtol"])


def _a2_through_a1(got: np.ndarray, a1: np.ndarray, inputs: dict[str, np.ndarray],
                   window: float) -> dict[str, Any]:
    """A whole path's a2 against the planes of the same kernel's a1 (planes [code value,
    scale] per element, itself checked as a1), not the model's."""
    valid = oracle_f64.valid_rows(inputs["masked_m"], a1.shape[2])
    a1_values = a1[0] * a1[1]
    if not np.isfinite(a1_values[valid]).all():
        return {"passed": False, "error": "a2 is checked through the same kernel's a1, "
                "which is not finite on rows it computes", "nan_count": 0,
                "max_abs_error": None, "worst_error_over_tolerance": None}
    return codes(got, oracle_planes.a2_planes(a1_values, inputs, valid), window)


def compare(output: str, got: np.ndarray, want: np.ndarray, tolerance: dict[str, Any],
            poisoned: bool = False, inputs: dict[str, np.ndarray] | None = None,
            outputs: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """The check of one named output (codes tie-aware, a2 through the kernel's own a1
    where ``outputs`` holds it, values against their bound, a whole path's out through
    the kernel's own intermediate in ``outputs``: ``whole_path``);
    where the outputs were poisoned, a value written on a row past masked_m fails. (Codes
    are not held to it: the 128x4 scale layout writes whole 128-row atoms.)"""
    is_codes = output in CODE_OUTPUTS
    if (got.shape[1:] if is_codes else got.shape) != want.shape[1:]:
        return {"passed": False, "error": f"shape {got.shape} does not match the oracle's "
                f"planes {want.shape}", "nan_count": 0, "max_abs_error": None,
                "worst_error_over_tolerance": None}
    if output == "a2" and outputs and "a1" in outputs:
        return _a2_through_a1(got, np.asarray(outputs["a1"], np.float64), inputs or {},
                              tolerance["rtol"])
    if is_codes:
        return codes(got, want, tolerance["rtol"])
    found = (_whole_path(output, got, inputs or {}, outputs or {}, tolerance)
             if output in THROUGH else bounded(got, want, tolerance["atol"], tolerance["rtol"]))
    written = written_past_masked_m(got, want) if poisoned else 0
    if not written:
        return found
    return {**found, "passed": False, "written_past_masked_m": written,
            "error": f"{written} elements written on rows past masked_m"}
