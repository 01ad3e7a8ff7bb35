"""The whole path's out (out_fused, out_unfused) checked stage by stage, through the
kernel's own intermediates, as the per-stage checks are.

A whole-path variant also returns what its stages wrote (``port.Variant.outputs``): the
fused path its a2, the unfused path its h. Each of those is checked on its own (codes tie
aware, h within GEMM1's bound); out is then held to what it must be given them:

- fused: GEMM2 of the kernel's own a2, within f32 accumulation and the bf16 rounding;
- unfused: the kernel's h (bf16) fixes act = bf16(SiLU(gate)·up) up to the float32
  SiLU·mul (2^-20 relative), which decides a bf16 rounding only near its midpoint. Where
  that reaches a rounding tie of the requantize, a2 may hold either rounding: a code, or a
  block's scale (its 16 codes then rounded at the other one). Each such choice is a *unit*
  Δ of the dequantized a2, moving out by alpha2·Δ·w2ᵀ; a correct out is GEMM2 of the
  model's a2 plus some subset of its row's units, within GEMM2's bound. The subset is
  found per row (least squares over the row's outputs, rounded, then improved a unit at a
  time) and the rest is held to the tight bound.

Summing every possible tie's worst case from the model's own path instead (stage 1's ties
moving h, h's error moving act, act's reaching stage 3's ties) gave a bound that let a 1%
bias and a skipped requantize through; following the path does not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.moe_nvfp4 import numerics, oracle_f64, oracle_planes
from kernels.moe_nvfp4.numerics import bf16

BF16_HALF_ULP = 2.0**-8
SILU_MUL_F32 = 2.0**-20  # float32 exp, division and products (oracle_f64.silu_mul_error)
MAX_PASSES = 3  # improvement passes over a row's units after rounding


def _valid(inputs: dict[str, np.ndarray], rows: int) -> np.ndarray:
    return oracle_f64.valid_rows(inputs["masked_m"], rows)


def _w2(inputs: dict[str, np.ndarray]) -> np.ndarray:
    return numerics.dequantize(inputs["w2_packed"], inputs["w2_scales"])


def _gemm2(a2: np.ndarray, w2: np.ndarray, alpha2: np.ndarray) -> np.ndarray:
    return oracle_f64.gemm_nt(a2, w2) * np.asarray(alpha2, np.float64)[:, None, None]


def _gemm2_bound(a2_abs: np.ndarray, w2: np.ndarray, alpha2: np.ndarray) -> np.ndarray:
    """GEMM2's f32 accumulation bound, grown by the bf16 rounding of its output."""
    alpha = np.abs(np.asarray(alpha2, np.float64))[:, None, None]
    return oracle_f64.f32_gemm_error(a2_abs * alpha, np.abs(w2)) * (1 + BF16_HALF_ULP)


def _ratio(residual: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(residual == 0, 0.0, np.abs(residual) / allowed)
    return np.where(np.isfinite(ratio), ratio, np.inf)


def _result(out: np.ndarray, reference: np.ndarray, valid: np.ndarray, worst: float,
            **extra: Any) -> dict[str, Any]:
    nan_count = int(np.count_nonzero(~np.isfinite(out[valid])))
    error = np.abs(out[valid] - reference[valid])
    return {"passed": nan_count == 0 and worst <= 1, "nan_count": nan_count,
            "max_abs_error": float(np.nan_to_num(error).max(initial=0.0)),
            "worst_error_over_tolerance": worst if nan_count == 0 else None, **extra}


def fused(got: np.ndarray, a2: np.ndarray, inputs: dict[str, np.ndarray], atol: float,
          rtol: float) -> dict[str, Any]:
    """out_fused against GEMM2 of the kernel's own a2 (planes [code value, scale] per
    element, as ``checks.kernel_planes``)."""
    out = np.asarray(got, np.float64)
    valid = _valid(inputs, out.shape[1])
    a2_values = np.where(valid[..., None], np.nan_to_num(a2[0] * a2[1]), 0.0)
    w2 = _w2(inputs)
    reference = _gemm2(a2_values, w2, inputs["alpha2"])
    allowed = atol + rtol * np.abs(reference) + _gemm2_bound(np.abs(a2_values), w2,
                                                             inputs["alpha2"])
    worst = float(_ratio(out - reference, allowed)[valid].max(initial=0.0))
    return _result(out, reference, valid, worst)


def _unfused_a2(h: np.ndarray, inputs: dict[str, np.ndarray], valid: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From h (bf16): act = bf16(SiLU(gate)·up), how far the float32 SiLU·mul may move
    it (0 unless at a bf16 rounding midpoint), and its a2 dequantized."""
    exact = oracle_f64.silu_mul(np.where(valid[..., None], np.nan_to_num(h), 0.0))
    act = bf16(exact)
    low, high = bf16(exact * (1 - SILU_MUL_F32)), bf16(exact * (1 + SILU_MUL_F32))
    slack = np.maximum(np.abs(low - act), np.abs(high - act))
    gs = np.asarray(inputs["a2_gs"], np.float64)
    return act, slack, _dequantized(act, gs, numerics.round_e4m3(numerics.block_scale(act, gs)))


def unfused_out(h: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The unfused path's out from h (bf16) at every tie the model's way, before its bf16
    rounding; NaN on rows past masked_m."""
    valid = _valid(inputs, h.shape[1])
    a2_values = _unfused_a2(h, inputs, valid)[2]
    out = _gemm2(a2_values, _w2(inputs), inputs["alpha2"])
    return np.where(valid[..., None], out, np.nan)


def unfused(got: np.ndarray, h: np.ndarray, inputs: dict[str, np.ndarray], atol: float,
            rtol: float) -> dict[str, Any]:
    """out_unfused given the kernel's own h (bf16), its requantize's ties resolved."""
    out = np.asarray(got, np.float64)
    valid = _valid(inputs, out.shape[1])
    act, slack, a2_values = _unfused_a2(h, inputs, valid)
    gs, w2, alpha2 = inputs["a2_gs"], _w2(inputs), inputs["alpha2"]
    reference = _gemm2(a2_values, w2, alpha2)
    # a2 as the kernel may hold it: each code at a tie moved by oracle_planes.flip_bound
    moved = oracle_planes.flip_bound(act, gs, slack) * np.asarray(gs, np.float64)[:, None, None]
    bound = _gemm2_bound(np.abs(a2_values) + moved, w2, alpha2)
    effects, count = units(act, slack, gs, w2, alpha2, valid)
    worst, taken = 0.0, 0
    for e, m in zip(*np.nonzero(valid), strict=True):
        residual = out[e, m] - reference[e, m]
        effect = effects.get((int(e), int(m)))
        if effect is None:
            worst = max(worst, float(_ratio(residual, atol + rtol * np.abs(reference[e, m])
                                            + bound[e, m]).max(initial=0.0)))
            continue

        def allowed(delta, e=e, m=m, effect=effect):
            return atol + rtol * np.abs(reference[e, m] + delta @ effect) + bound[e, m]

        delta, ratio = resolve(residual, effect, allowed)
        worst, taken = max(worst, ratio), taken + int(delta.sum())
    return _result(out, reference, valid, worst, ties_possible=count, ties_taken=taken)


def units(act: np.ndarray, act_slack: np.ndarray, gs: np.ndarray, w2: np.ndarray,
          alpha2: np.ndarray, valid: np.ndarray) -> tuple[dict[tuple[int, int], np.ndarray],
                                                          int]:
    """Each row's units for act [E, M, N] known within ``act_slack``, quantized with
    global scales ``gs`` [E]: row (e, m) -> [U, K] effects on out (alpha2·Δ·w2ᵀ, w2
    [E, K, N] dequantized), and their count."""
    window = numerics.TIE_WINDOW
    gs64 = np.asarray(gs, np.float64)
    exact = numerics.block_scale(act, gs64)
    room = numerics.block_scale(act_slack, gs64) + exact * window
    sf = numerics.round_e4m3(exact)
    scales = [sf, numerics.round_e4m3(np.maximum(exact - room, 0)),
              numerics.round_e4m3(exact + room)]
    model = _dequantized(act, gs64, sf)
    effects: dict[tuple[int, int], np.ndarray] = {}
    count = 0
    for e, m in zip(*np.nonzero(valid), strict=True):
        deltas = _row_deltas(act[e, m], act_slack[e, m], gs64[e], [s[e, m] for s in scales],
                             model[e, m])
        if deltas:
            effects[int(e), int(m)] = (np.stack(deltas) @ w2[e].T) * float(alpha2[e])
            count += len(deltas)
    return effects, count


def _row_deltas(act, slack, gs, scales, model) -> list[np.ndarray]:
    """One row's units as changes of its dequantized a2: each code that may round either
    way at the model's block scales, each block whose scale may round either way (its
    codes at the other scale), and each code that may then round either way."""
    sf = scales[0]
    deltas = []
    for which, scale in enumerate(scales):
        changed = scale != sf
        if which and not changed.any():
            continue
        s = np.repeat(scale, numerics.BLOCK)
        safe = np.where(s > 0, s, 1.0)
        y = np.where(s > 0, act * gs / safe, 0.0)
        y_slack = np.where(s > 0, slack * gs / safe, 0.0) + np.abs(y) * numerics.TIE_WINDOW
        nearest = numerics.e2m1_value(numerics.e2m1_code(y)) * s
        if which:
            for block in np.nonzero(changed)[0]:
                part = slice(block * numerics.BLOCK, (block + 1) * numerics.BLOCK)
                delta = np.zeros_like(model)
                delta[part] = nearest[part] - model[part]
                deltas.append(delta)
            base, inside = nearest, np.repeat(changed, numerics.BLOCK)
        else:
            base, inside = model, np.ones_like(y, bool)
        for end in (y - y_slack, y + y_slack):
            value = numerics.e2m1_value(numerics.e2m1_code(end)) * s
            for n in np.nonzero((value != base) & inside)[0]:
                delta = np.zeros_like(model)
                delta[n] = value[n] - base[n]
                deltas.append(delta)
    return deltas


def _dequantized(x: np.ndarray, gs: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """x's codes at block scales sf, dequantized (codes times scales, no gs)."""
    codes = numerics.codes_for_scales(x, gs, sf)
    return numerics.e2m1_value(codes) * np.repeat(sf, numerics.BLOCK, axis=-1)


def resolve(residual: np.ndarray, effects: np.ndarray, allowed) -> tuple[np.ndarray, float]:
    """The δ ∈ {0, 1}^U whose units best explain ``residual`` [K] (got − reference), and
    the worst |residual − δ·effects| / allowed(δ) it leaves; ``allowed``: δ -> [K]."""
    def worst(delta: np.ndarray) -> float:
        return float(_ratio(residual - delta @ effects, allowed(delta)).max(initial=0.0))

    fitted, *_ = np.linalg.lstsq(effects.T, residual, rcond=None)
    delta = (np.clip(fitted, 0, 1) > 0.5).astype(np.float64)
    best = worst(delta)
    for _ in range(MAX_PASSES):
        if best <= 1:
            break
        improved = False
        for u in range(len(delta)):
            trial = delta.copy()
            trial[u] = 1 - trial[u]
            if (score := worst(trial)) < best:
                delta, best, improved = trial, score, True
        if not improved:
            break
    return delta, best
