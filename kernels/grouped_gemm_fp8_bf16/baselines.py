"""Baselines without the work, on a GPU or a TPU: the grouped GEMM on B already in bf16.

Two ways XLA computes it on bf16 A and the dequantised bf16 B, accumulating in fp32, with
the same epilogue (alpha · acc + beta · C in fp32, f16 out): ``jax.lax.ragged_dot`` (XLA's
grouped GEMM) and a dense matmul per group (static row slices, what a JAX user writes
without ragged_dot). The conversion happens in ``prepare``, outside the timed call: what
remains is the cost of the GEMM the port would be if B were stored in bf16 (a TPU v5e has
no fp8 unit, so there the conversion in XLA is all it could do). NOT YET RUN ON A GPU.
"""

from __future__ import annotations

from collections.abc import Callable

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

    def gemm(a, b):
        return jax.lax.ragged_dot(a, jnp.swapaxes(b, 1, 2), group_sizes,
                                  preferred_element_type=jnp.float32)

    return _on_converted_b(problem, gemm, "XLA ragged_dot on pre-converted bf16 B")


def dense_per_group_bf16(problem: GroupedProblem) -> Runnable:
    """One dense matmul per group (``a[rows] @ b[g]ᵀ``), the groups' rows concatenated:
    no ragged op, each group's shape known when XLA compiles."""
    import jax.numpy as jnp

    def gemm(a, b):
        return jnp.concatenate(
            [jnp.matmul(a[rows], b[g].T, preferred_element_type=jnp.float32)
             for g, rows in problems.group_rows(problem)], axis=0)

    return _on_converted_b(problem, gemm, "XLA dense matmul per group on pre-converted bf16 B")


def _on_converted_b(problem: GroupedProblem, gemm: Callable, mode: str) -> Runnable:
    """``gemm(a, b_bf16)`` (fp32, every row) with the example's epilogue, B converted (and
    scaled) to bf16 in ``prepare``."""
    import jax.numpy as jnp

    def grouped_gemm(a, b, c):
        acc = gemm(a, b)
        return (problem.alpha * acc + problem.beta * c.astype(jnp.float32)).astype(jnp.float16)

    runnable = from_jax(grouped_gemm, ("a", "b_bf16", "c"), contract.execution(mode))

    def prepare(inputs):
        problems.check_inputs(problem, inputs)
        converted = problems.dequantize(problem, inputs["b"], inputs["scale"])
        return runnable.prepare({**inputs, "b_bf16": converted.astype(ml_dtypes.bfloat16)})

    return runnable._replace(prepare=prepare)


XLA = {"xla_ragged_dot_bf16": ragged_dot_bf16, "xla_dense_per_group_bf16": dense_per_group_bf16}
