"""The port's persistent grouped tile schedule, in numpy (the kernel's rule is port.locate_tile).

Each group's output Dᵀ (N × M_g) is cut into TILE_N × TILE_M tiles, numbered group after
group and, inside a group, N-tile fastest (consecutive CTAs share one tile of A and read
neighbouring tiles of the group's B). CTA ``b`` of a persistent grid of ``G`` CTAs works on
tiles b, b + G, b + 2G, ...; ``locate`` maps a linear tile number to (group, n tile,
m tile) from the exclusive prefix sum of tiles per group.
"""

from __future__ import annotations

import numpy as np

from kernels.grouped_gemm_fp8_bf16.problems import GroupedProblem, ProblemError

SMEM_LIMIT_BYTES = 232_448  # sm_90 dynamic shared memory per block (227 KiB)
# The CTA tile of example 69 in its swapped coordinates: 128 rows of N (two consumer
# warpgroups of 64), 16 rows of M, 64 of K (1024 bits / 16-bit MMA type).
TILE_N, TILE_M, TILE_K = 128, 16, 64


def ceil_div(a, b):
    return (a + b - 1) // b


def tile_offsets(m: tuple[int, ...], n: int) -> np.ndarray:
    """Exclusive prefix sum of tiles per group, then the total: (groups + 1,) int32."""
    per_group = [ceil_div(n, TILE_N) * ceil_div(rows, TILE_M) for rows in m]
    return np.concatenate([[0], np.cumsum(per_group)]).astype(np.int32)


def locate(tile, offsets, groups, n_tiles):
    """(group, n tile, m tile) of linear tile ``tile``; ``offsets`` as ``tile_offsets``.

    The kernel's ``port.locate_tile`` is the same rule in CuTe DSL; tests run both on
    every tile. Empty groups (M = 0) own no tiles: the ``<=`` test skips them.
    """
    group = 0
    for g in range(groups):
        if offsets[g] <= tile:
            group = g
    local = tile - offsets[group]
    return group, local % n_tiles, local // n_tiles


def table(m: tuple[int, ...], n: int) -> np.ndarray:
    """Every tile's (group, n tile, m tile), in numpy: (tiles, 3)."""
    offsets = tile_offsets(m, n)
    n_tiles = ceil_div(n, TILE_N)
    return np.array([locate(t, offsets, len(m), n_tiles) for t in range(int(offsets[-1]))],
                    dtype=np.int32).reshape(-1, 3)



def check(problem: GroupedProblem) -> None:
    """Raise ProblemError naming the field when the port cannot tile ``problem``."""
    if problem.k % TILE_K:
        raise ProblemError("k", f"{problem.k} must be a multiple of {TILE_K} for the port "
                           "(its K tile)")
    if problem.chunk % TILE_K:
        raise ProblemError("chunk", f"{problem.chunk} must be a multiple of {TILE_K} for "
                           "the port (one scale per row of a K tile)")
