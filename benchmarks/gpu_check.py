"""One short run on a GPU host through every device path, records in one folder.

Exercises CUPTI kernel activity and CUDA events (clocks), NVML (throttling, per
sample) and the L2 flush (cold cache), each on a jitted JAX matmul or a cudart memset,
and writes one JSON summary plus a samples table per measurement to OUT.

    .venv/bin/python -m benchmarks.gpu_check results/gpu_check
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from casebook.measure import engine, gpu, noise, samples_file
from casebook.stages import timing
from kernels import contract
from kernels.contract import Runnable

QUICK = {"criterion": "median_precision", "target": 0.01, "timeout_s": 10.0, "repeats": 1}


def memset_workload(tools: gpu.Tools, nbytes: int = 256 * 2**20) -> engine.Workload:
    """A device memset on a stream of our own: CUDA events can be recorded on it."""
    cudart = tools.cudart
    stream = gpu.checked(cudart.cudaStreamCreate(), "cudaStreamCreate")
    buffer = gpu.checked(cudart.cudaMalloc(nbytes), "cudaMalloc")

    def call(value):
        gpu.checked(cudart.cudaMemsetAsync(buffer, int(value[0]) % 256, nbytes, stream),
                    "cudaMemsetAsync")
        return value

    runnable = Runnable(
        prepare=lambda d: (d["value"],), call=call,
        sync=lambda out: gpu.checked(cudart.cudaStreamSynchronize(stream),
                                     "cudaStreamSynchronize"),
        fetch=np.asarray, execution=contract.execution("cudart memset"),
        stream=stream, barrier=lambda: gpu.synchronize(tools))
    return engine.Workload(runnable, lambda rng: {"value": rng.integers(0, 256, 1)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    devices = engine.Devices.find()
    if devices.tools is None:
        raise SystemExit(f"gpu_check needs a GPU: {devices.no_gpu_reason}")
    runs = {
        "cupti_matmul_cold": (noise.matmul_workload(4096), "cupti_kernel", "cold"),
        "cupti_matmul_hot": (noise.matmul_workload(4096), "cupti_kernel", "hot"),
        "events_memset_cold": (memset_workload(devices.tools), "cuda_event", "cold"),
    }
    report = {"l2_cache_bytes": gpu.l2_cache_bytes(devices.tools)}
    for name, (workload, clock, mode) in runs.items():
        settings = timing.default_settings(clock=clock, **QUICK)
        try:
            m = engine.measure(workload, settings, mode, 0, devices)
        except (gpu.GpuUnavailable, RuntimeError) as error:
            report[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        samples_file.write(str(args.out / f"{name}.samples.csv"), m.rows)
        report[name] = m.summary(settings.confidence)
        print(name, report[name]["median_s"], report[name]["stop_reason"])
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
