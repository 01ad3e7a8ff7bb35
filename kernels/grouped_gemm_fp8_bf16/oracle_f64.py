"""The float64 oracle of CUTLASS example 69's grouped GEMM (numpy only).

D_g = alpha · A_g @ B'_gᵀ + beta · C_g in float64, on the same rounded inputs and the
same dequantized bf16 operand B' the kernel multiplies (``problems.dequantize``): the
numerics model's error against it is then the kernel's own arithmetic only.
"""

from __future__ import annotations

import numpy as np

from kernels.grouped_gemm_fp8_bf16 import problems
from kernels.grouped_gemm_fp8_bf16.problems import GroupedProblem


def oracle(problem: GroupedProblem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """D in float64 on the same (rounded) inputs and the same dequantized operand."""
    problems.check_inputs(problem, inputs)
    operand = problems.dequantize(problem, inputs["b"], inputs["scale"]).astype(np.float64)
    a, c = inputs["a"].astype(np.float64), inputs["c"].astype(np.float64)
    out = np.empty(c.shape, np.float64)
    for g, rows in problems.group_rows(problem):
        out[rows] = problem.alpha * (a[rows] @ operand[g].T) + problem.beta * c[rows]
    return out
