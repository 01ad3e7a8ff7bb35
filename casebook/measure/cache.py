"""Cache state between samples: hot (the same inputs every sample) or cold.

Cold on a CPU rotates through enough fresh input sets that together they exceed the
last-level cache twice over, so no sample finds its inputs cached by the previous one.
Cold on a GPU memsets a buffer the size of the device's L2 on the timed stream before
every sample (as NVBench and do_bench do), outside the timed window.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from casebook.measure import gpu

MODES = ("hot", "cold")
# Input sets kept in memory for rotation at most; tiny problems then say they are not
# fully cold instead of allocating millions of sets.
MAX_SETS = 512
# Sets drawn fresh for a rotation at most; set i beyond them is a copy of set
# i mod FRESH_DRAWS in memory of its own. A set is cold because no sample touched its
# memory since, whatever its values, and a draw can cost far more than a call (case 01's
# quantised operands: 0.15 s a set, 26 s of a 35 s baseline job for 173 sets).
FRESH_DRAWS = 8


def last_level_cache_bytes(cpu_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Size of the highest cache level the kernel reports (0 when it reports none)."""
    best_level, best_size = 0, 0
    for index in cpu_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", size)
        if match and level >= best_level:
            scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match[2]]
            best_level, best_size = level, int(match[1]) * scale
    return best_size


class Hot:
    mode = "hot"

    def __init__(self, args: tuple[Any, ...]):
        self.args = args
        self.description = "hot: the same prepared inputs every sample"

    def before_sample(self, index: int) -> tuple[tuple[Any, ...], int]:
        return self.args, 0

    def close(self) -> None:
        """Nothing to release."""


class Rotation:
    """Cold on a CPU: sample i uses input set i mod n."""

    mode = "cold"

    def __init__(self, sets: Sequence[tuple[Any, ...]], set_bytes: int, llc_bytes: int):
        self.sets = list(sets)
        total = set_bytes * len(self.sets)
        enough = total >= 2 * llc_bytes
        copies = len(self.sets) - min(len(self.sets), FRESH_DRAWS)
        self.description = (
            f"cold: {len(self.sets)} input sets rotated"
            + (f" ({FRESH_DRAWS} drawn, {copies} copies of them in memory of their own)"
               if copies else "")
            + f", {total / 2**20:.1f} MiB in all "
            + (f"(≥ 2× the {llc_bytes / 2**20:.0f} MiB last-level cache)" if enough else
               f"— NOT fully cold: less than 2× the {llc_bytes / 2**20:.0f} MiB "
               f"last-level cache (capped at {MAX_SETS} sets)"))

    def before_sample(self, index: int) -> tuple[tuple[Any, ...], int]:
        which = index % len(self.sets)
        return self.sets[which], which

    def close(self) -> None:
        self.sets.clear()


def sets_for_rotation(set_bytes: int, llc_bytes: int) -> int:
    return max(2, min(MAX_SETS, math.ceil(2 * llc_bytes / max(set_bytes, 1))))


class L2Flush:
    """Cold on a GPU: before each sample, no L2 set aside for persisting lines and none
    left persisting, then an L2-sized memset on the timed stream, then wait. A memset does
    not evict lines a kernel's access-policy window made persisting (llm.c measured 3,530
    GB/s on an 864 GB/s card so: github.com/karpathy/llm.c/pull/851), nor does a reset
    while the carve-out stays reserved (github.com/gpu-mode/pygpubench/pull/49)."""

    mode = "cold"

    def __init__(self, tools: gpu.Tools, stream: Any, args: tuple[Any, ...]):
        self.tools, self.stream, self.args = tools, stream, args
        self.bytes = gpu.l2_cache_bytes(tools)
        self.buffer = gpu.checked(tools.cudart.cudaMalloc(self.bytes), "cudaMalloc")
        self.description = (f"cold: L2 flushed before every sample by a "
                            f"{self.bytes / 2**20:.0f} MiB memset (the device's L2 size), "
                            f"its persisting carve-out set to 0 and reset first")

    def before_sample(self, index: int) -> tuple[tuple[Any, ...], int]:
        cudart = self.tools.cudart
        gpu.checked(cudart.cudaDeviceSetLimit(cudart.cudaLimit.cudaLimitPersistingL2CacheSize,
                                              0), "cudaDeviceSetLimit(PersistingL2CacheSize)")
        gpu.checked(cudart.cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache")
        gpu.checked(cudart.cudaMemsetAsync(self.buffer, index % 256, self.bytes, self.stream),
                    "cudaMemsetAsync")
        gpu.synchronize(self.tools)  # the flush is finished before the timed window opens
        return self.args, 0

    def close(self) -> None:
        gpu.checked(self.tools.cudart.cudaFree(self.buffer), "cudaFree")


def plan(mode: str, prepare_set: Callable[[int], tuple[Any, ...]], set_bytes: int,
         tools: gpu.Tools | None, stream: Any,
         llc_bytes: Callable[[], int] = last_level_cache_bytes):
    """The cache state for ``mode``; ``prepare_set(i)`` makes prepared input set i: drawn
    fresh for i < FRESH_DRAWS (and i < 0), else set i mod FRESH_DRAWS copied into new
    memory."""
    if mode not in MODES:
        raise ValueError(f"{mode=} must be one of {MODES}")
    if mode == "hot":
        return Hot(prepare_set(0))
    if tools is not None:
        return L2Flush(tools, stream, prepare_set(0))
    llc = llc_bytes()
    count = sets_for_rotation(set_bytes, llc)
    return Rotation([prepare_set(i) for i in range(count)], set_bytes, llc)
