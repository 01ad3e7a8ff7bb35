"""The grouped problem of CUTLASS example 69, described and checked, and its inputs (numpy
only): drawn as the example draws them, checked, and B dequantized as the kernel sees it.

Per group g: D_g = alpha · A_g @ dequant(B_g)ᵀ + beta · C_g, with A_g bf16 (M_g, K) row-major,
B_g fp8 e5m2 (N, K) K-major, scales bf16 (N, ceil(K/c)) stored N-contiguous, C_g and D_g
f16 (M_g, N) row-major. M varies per group; N, K, c, alpha and beta are shared, as on the
example's command line. Mode ``convert_only`` (the example's 0) converts B to bf16;
``scale_only`` (1) also multiplies each element by its chunk's scale.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

MODES = {"convert_only": 0, "scale_only": 1}  # name -> the example's --mode
# TMA moves 16-byte aligned rows: K and N of the 8-bit operand in multiples of 16 elements;
# the example draws M in multiples of the same alignment (128 bits / 8 bits).
ALIGNMENT = 16
# The example's M draw: alignment · (rand() % 64 + 1).
M_DRAW_STEPS = 64


class ProblemError(ValueError):
    """A grouped problem the kernels cannot run: ``key``, the field of a point's params
    (dotted as in a case file: ``m.1`` is group 1's M), and ``why``, what is wrong with
    its value; the message reads ``n=100 must be a multiple of 16 ...``."""

    def __init__(self, key: str, why: str):
        self.key, self.why = key, why
        name, _, index = key.partition(".")
        super().__init__(f"{name}[{index}]={why}" if index else f"{key}={why}")


@dataclasses.dataclass(frozen=True)
class GroupedProblem:
    m: tuple[int, ...]  # rows of A, C and D per group
    n: int
    k: int
    chunk: int  # c: K elements per scale
    mode: str
    alpha: float = 1.0
    beta: float = 0.0

    def __post_init__(self):
        if not self.m:
            raise ProblemError("m", "0 groups: at least one is needed")
        for g, m in enumerate(self.m):
            if not isinstance(m, int) or m < 0:
                raise ProblemError(f"m.{g}", f"{m!r} must be a non-negative integer")
        for name in ("n", "k", "chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ProblemError(name, f"{value!r} must be a positive integer")
        for name in ("n", "k"):
            if getattr(self, name) % ALIGNMENT:
                raise ProblemError(name, f"{getattr(self, name)} must be a multiple of "
                                   f"{ALIGNMENT} (16-byte TMA alignment of fp8 rows)")
        if self.mode not in MODES:
            raise ProblemError("mode", f"{self.mode!r} must be one of {sorted(MODES)}")
        for name in ("alpha", "beta"):
            if not np.isfinite(getattr(self, name)):
                raise ProblemError(name, f"{getattr(self, name)!r} must be finite")

    @property
    def groups(self) -> int:
        return len(self.m)

    @property
    def scale_k(self) -> int:
        """Scale columns per row of B: ceil(K / c)."""
        return -(-self.k // self.chunk)

    @property
    def row_offsets(self) -> np.ndarray:
        """First row of each group in the stacked A, C and D, then the total."""
        return np.concatenate([[0], np.cumsum(self.m)]).astype(np.int64)


def draw_m(groups: int, seed: int) -> tuple[int, ...]:
    """Per-group M as the example draws it (alignment · U{1..64}), from a numpy stream."""
    steps = np.random.default_rng(seed).integers(1, M_DRAW_STEPS + 1, size=groups)
    return tuple(int(ALIGNMENT * s) for s in steps)


def from_params(params: dict[str, Any]) -> GroupedProblem:
    """The problem of a point's ``params``; ``m`` is a list, ``{groups, rows}`` (the same
    M in every group) or ``{groups, seed}`` (M drawn as the example draws it)."""
    m = params["m"]
    if isinstance(m, list):
        rows = tuple(m)
    elif "rows" in m:
        rows = (m["rows"],) * m["groups"]
    else:
        rows = draw_m(m["groups"], m["seed"])
    return GroupedProblem(m=rows, n=params["n"], k=params["k"], chunk=params["chunk"],
                          mode=params["mode"], alpha=float(params.get("alpha", 1.0)),
                          beta=float(params.get("beta", 0.0)))


# The example's input distributions (initialize_tensor / initialize_scale): uniform, then
# rounded to the element type.
A_RANGE = (-5.0, 5.0)  # 16-bit operands: A (bf16) and C (f16)
B_RANGE = (-2.0, 2.0)  # 8-bit operand B
SCALE_RANGE = (0.1, 2.0)


def _uniform(rng: np.random.Generator, bounds: tuple[float, float], shape, dtype) -> np.ndarray:
    return rng.uniform(*bounds, size=shape).astype(np.float32).astype(dtype)


def make_inputs(problem: GroupedProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh A, B, scales and C; groups stacked along M (A, C), or leading (B, scales).

    In ConvertOnly mode the scales are all ones, as the example initialises them.
    """
    rows, n, k = sum(problem.m), problem.n, problem.k
    scale_shape = (problem.groups, problem.scale_k, n)  # N contiguous, as the example stores it
    if problem.mode == "scale_only":
        scale = _uniform(rng, SCALE_RANGE, scale_shape, ml_dtypes.bfloat16)
    else:
        scale = np.ones(scale_shape, ml_dtypes.bfloat16)
    return {
        "a": _uniform(rng, A_RANGE, (rows, k), ml_dtypes.bfloat16),
        "b": _uniform(rng, B_RANGE, (problem.groups, n, k), ml_dtypes.float8_e5m2),
        "scale": scale,
        "c": _uniform(rng, A_RANGE, (rows, n), np.float16),
    }


def expected_inputs(problem: GroupedProblem) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Each input's (shape, dtype) as ``make_inputs`` lays them out."""
    rows = sum(problem.m)
    return {"a": ((rows, problem.k), ml_dtypes.bfloat16),
            "b": ((problem.groups, problem.n, problem.k), ml_dtypes.float8_e5m2),
            "scale": ((problem.groups, problem.scale_k, problem.n), ml_dtypes.bfloat16),
            "c": ((rows, problem.n), np.float16)}


def check_inputs(problem: GroupedProblem, inputs: dict[str, np.ndarray]) -> None:
    """A ValueError naming the input, what it got and what it needs (shape, dtype)."""
    for name, (shape, dtype) in expected_inputs(problem).items():
        if name not in inputs:
            raise ValueError(f"{name}: missing; needs {shape} {np.dtype(dtype).name}")
        got = inputs[name]
        if np.dtype(got.dtype) != np.dtype(dtype):
            raise ValueError(f"{name}: dtype {np.dtype(got.dtype).name}; needs "
                             f"{np.dtype(dtype).name}")
        if tuple(got.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(got.shape)}; needs {shape}"
                             + (" (groups, ceil(K/c), N), N contiguous" if name == "scale"
                                else ""))


def dequantize(problem: GroupedProblem, b: np.ndarray, scale: np.ndarray,
               rounded: bool = True) -> np.ndarray:
    """The bf16 operand the MMA sees, (groups, N, K), as float32 values (``rounded``
    False: the scaled product left unrounded, as a near-miss kernel would use it)."""
    converted = b.astype(np.float32)
    if problem.mode == "convert_only":
        return converted
    per_k = np.repeat(scale.astype(np.float32), problem.chunk, axis=1)[:, : problem.k, :]
    scaled = converted * per_k.transpose(0, 2, 1)
    return scaled.astype(ml_dtypes.bfloat16).astype(np.float32) if rounded else scaled


def group_rows(problem: GroupedProblem) -> list[tuple[int, slice]]:
    """Each group's index and its rows of A, C and D."""
    offsets = problem.row_offsets
    return [(g, slice(offsets[g], offsets[g + 1])) for g in range(problem.groups)]
