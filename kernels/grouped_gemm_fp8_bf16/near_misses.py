"""Case 03's mutants: grouped GEMMs a subtly wrong kernel would compute (numpy only)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kernels.grouped_gemm_fp8_bf16 import numerics, problems
from kernels.mutants import Mutant, bias

K_TILE = 64  # the CTA tile's K (port and example)


def _model(params, inputs, operand):
    return numerics.model(problems.from_params(params), inputs, operand)


def _unrounded(params, inputs, want, correct):
    p = problems.from_params(params)
    if p.mode == "convert_only":
        return None  # nothing is rounded: B converts to bf16 exactly
    return _model(params, inputs,
                  problems.dequantize(p, inputs["b"], inputs["scale"], rounded=False))


def _scale_shifted(params, inputs, want, correct):
    p = problems.from_params(params)
    if p.mode == "convert_only" or p.scale_k == 1:
        return None  # one scale per row of B (or none): there is no other block to use
    return _model(params, inputs,
                  problems.dequantize(p, inputs["b"], np.roll(inputs["scale"], 1, axis=1)))


def _last_k_tile_dropped(params, inputs, want, correct):
    p = problems.from_params(params)
    operand = problems.dequantize(p, inputs["b"], inputs["scale"]).copy()
    operand[:, :, -K_TILE:] = 0
    return _model(params, inputs, operand)


def _plus(amount):
    def make(params, inputs, want, correct):
        return (correct.astype(np.float32) + np.float32(amount)).astype(np.float16)
    return make


def _source_in_f16(params, inputs, want, correct):
    p = problems.from_params(params)
    if p.beta == 0:
        return None  # no source term
    # alpha·acc rounded to f16 before beta·C is added: one rounding too many.
    product = numerics.model(dataclasses.replace(p, beta=0.0), inputs)
    source = (np.float32(p.beta) * inputs["c"].astype(np.float32))
    return (product.astype(np.float32) + source).astype(np.float16)


def _row_zeroed(params, inputs, want, correct):
    p = problems.from_params(params)
    last = next((int(end) - 1 for end, m in zip(p.row_offsets[1:], p.m, strict=True)
                 if m), None)
    if last is None:
        return None
    out = correct.copy()
    out[last] = 0  # the first non-empty group's last row, left unwritten
    return out


def mutants(params: dict[str, Any]) -> list[Mutant]:
    return [
        bias("out"),
        Mutant("plus_0.1", "out", "0.1 added to every output", _plus(0.1)),
        Mutant("bf16_rounding_skipped", "out",
               "B·scale used unrounded, not rounded to bf16 as HMUL2.BF16 does", _unrounded),
        Mutant("scale_off_by_one_block", "out",
               "each K chunk multiplied by the previous chunk's scale", _scale_shifted),
        Mutant("last_k_tile_dropped", "out",
               f"the last {K_TILE} K of every dot product left out", _last_k_tile_dropped),
        Mutant("source_after_f16_rounding", "out",
               "alpha·acc rounded to f16 before beta·C is added", _source_in_f16),
        Mutant("one_row_unwritten", "out",
               "the last row of the first non-empty group left at 0", _row_zeroed),
    ]
