"""This host's own peaks, measured with its noise floor (``timing.noise_floor``): a large
jitted matmul's FLOP rate and a jitted copy's bytes per second (each element read and
written once), each from the fastest of SAMPLES samples (a peak is the best the host
did, as STREAM reports its best), measured by the engine with the noise floor's clock
and every guard. On an accelerator (a GPU or a TPU) the matmul is bfloat16 (the precision
of a bound's bf16 tensor rate), on a CPU float32 (which it computes natively).

A GPU's speed-of-light bound uses the higher of its datasheet's rate and the measured one
(``speed_of_light.with_measured``): a measured rate above the datasheet's says the
datasheet is not this GPU's, and a bound must never refuse what the host did. The
measurement condition states the measured rates beside the datasheet's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from casebook.measure import engine

# Large enough to reach the peak, small enough for a noise-floor job, which the time jobs
# wait for: a 8192³ bf16 matmul is ~1 ms on an H200, 512 MiB copied ten L2s of it; on
# the 2-core CPU host a 1024³ float32 matmul is ~10 ms and 64 MiB two last-level caches
# (the two measurements take about 2 s there); on a TPU v5e the matmul is ~6 ms.
SIDE = {"accelerator": 8192, "cpu": 1024}
COPY_BYTES = {"accelerator": 512 * 2**20, "cpu": 64 * 2**20}
SAMPLES = 10


def matmul_workload(side: int, on_accelerator: bool) -> engine.Workload:
    """A jitted ``side``³ matmul, bfloat16 on an accelerator, float32 on a CPU."""
    import jax.numpy as jnp
    import ml_dtypes

    from kernels import contract
    from kernels.runnable import from_jax

    dtype = ml_dtypes.bfloat16 if on_accelerator else np.float32
    runnable = from_jax(jnp.matmul, ("a", "b"), contract.execution("XLA"))

    def make_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {name: rng.standard_normal((side, side), dtype=np.float32).astype(dtype)
                for name in ("a", "b")}

    return engine.Workload(runnable, make_inputs)


def copy_workload(nbytes: int) -> engine.Workload:
    """A jitted x + 1 over ``nbytes`` of float32: every element read and written once."""
    from kernels import contract
    from kernels.runnable import from_jax

    runnable = from_jax(lambda x: x + 1, ("x",), contract.execution("XLA"))
    return engine.Workload(runnable, lambda rng: {
        "x": rng.random(nbytes // 4, dtype=np.float32)})


def measure(settings: engine.Settings, seed: int, devices: engine.Devices) -> dict[str, Any]:
    """This host's matmul and copy rates, each from the fastest sample of a measurement
    with ``settings``' clock and warm-up."""
    kind = "cpu" if devices.tools is None and devices.tpu is None else "accelerator"
    side, nbytes = SIDE[kind], COPY_BYTES[kind]
    math = "bf16" if kind == "accelerator" else "f32"
    fixed = dataclasses.replace(settings, criterion="fixed_count", count=SAMPLES, repeats=1)
    matmul = engine.measure(matmul_workload(side, kind == "accelerator"), fixed, "hot", seed,
                            devices)
    copy = engine.measure(copy_workload(nbytes), fixed, "hot", seed + 1, devices)
    matmul_s, copy_s = (min(m.kept) for m in (matmul, copy))
    return {"matmul_flops": 2 * side**3 / matmul_s, "matmul_math": math,
            "copy_bytes_per_s": 2 * nbytes / copy_s, "clock_kind": matmul.clock_kind,
            "basis": f"jitted {math} matmul {side}×{side}×{side} (fastest of {SAMPLES}: "
                     f"{matmul_s * 1e6:.4g} µs) and x + 1 over {nbytes / 2**20:.0f} MiB of "
                     f"float32, read and written once (fastest of {SAMPLES}: "
                     f"{copy_s * 1e6:.4g} µs)"}
