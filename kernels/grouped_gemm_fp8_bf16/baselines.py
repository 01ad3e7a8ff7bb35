"""Baseline without the work, on a GPU host: the grouped GEMM on B already in bf16.

``jax.lax.ragged_dot`` (XLA's grouped GEMM) on bf16 A and the dequantised bf16 B,
accumulating in fp32, with the same epilogue (alpha · acc + beta · C in fp32, f16 out).
The conversion happens in ``prepare``, outside the timed call: what remains is the cost
of the GEMM the port would be if B were stored in bf16. NOT YET RUN ON A GPU.
"""

from __future__ import annotations

import ml_dtypes

from kernels import contract
from kernels.contract import Runnable
from kernels.grouped_gemm_fp8_bf16 import problems
from kernels.grouped_gemm_fp8_bf16.problems import GroupedProblem
from kernels.runnable import from_jax


def ragged_dot_bf16(problem: GroupedProblem) -> Runnable:
    import jax
    import jax.numpy as jnp

    group_sizes = jnp.asarray(problem.m, jnp.int32)

    def grouped_gemm(a, b, c):
        acc = jax.lax.ragged_dot(a, jnp.swapaxes(b, 1, 2), group_sizes,
                                 preferred_element_type=jnp.float32)
        return (problem.alpha * acc + problem.beta * c.astype(jnp.float32)).astype(jnp.float16)

    runnable = from_jax(grouped_gemm, ("a", "b_bf16", "c"),
                        contract.execution("XLA ragged_dot on pre-converted bf16 B"))

    def prepare(inputs):
        problems.check_inputs(problem, inputs)
        converted = problems.dequantize(problem, inputs["b"], inputs["scale"])
        return runnable.prepare({**inputs, "b_bf16": converted.astype(ml_dtypes.bfloat16)})

    return runnable._replace(prepare=prepare)
