"""The port against example 69, bit for bit, on identical inputs at every configuration.

For each point (verified and build-only) one draw of inputs from ``seed`` goes to both
kernels on the GPU (the port through its exported library, the example through its
harness on files, the route its checks take); the f16 outputs are compared as 16-bit
patterns. Where no sm_90 GPU is found, ``NotRunnable`` says so. ``gpu`` is the module
that finds the device and makes the runnables (``device``; a test passes a fake).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from kernels.contract import NotRunnable
from kernels.grouped_gemm_fp8_bf16 import device, problems


def _run(runnable, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(runnable.fetch(runnable.call(*runnable.prepare(inputs))))


def differing(port: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    """How many f16 elements differ in their bits, and the first that does (row, column)."""
    if port.shape != reference.shape or {port.dtype, reference.dtype} != {np.dtype(np.float16)}:
        raise ValueError(
            f"outputs {port.dtype}{port.shape} and {reference.dtype}"
            f"{reference.shape}: both must be f16 of one shape"
        )
    bits = port.view(np.uint16) != reference.view(np.uint16)
    first = np.argwhere(bits)[:1].tolist()
    return {
        "elements": int(bits.size),
        "differing": int(bits.sum()),
        "first_differing": first[0] if first else None,
    }


def compare(
    points: list[dict[str, Any]], build_dir: str, seed: int, gpu: ModuleType = device
) -> list[dict[str, Any]]:
    """Per point: its name, the elements of D and how many differ between the kernels."""
    found = gpu.sm90_device()
    if found is None:
        raise NotRunnable("bit-exact comparison needs an sm_90 GPU; this host has none")
    rng = np.random.default_rng(seed)
    out = []
    for point in points:
        grouped = problems.from_params(point["params"])
        inputs = problems.make_inputs(grouped, rng)
        port = _run(gpu.port_runnable(grouped, sms=found[1], build_dir=build_dir), inputs)
        reference = _run(gpu.reference_runnable(grouped, build_dir), inputs)
        out.append({"point": point["name"], **differing(port, reference)})
    return out
