"""Synthetic CPU workloads of known relative cost, and a minimal sampling loop."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from casebook.core import files, paths, records
from casebook.measure import clocks, engine, stats, stopping
from kernels import contract
from kernels.contract import Runnable

RESULTS = paths.BENCHMARK_RESULTS
# One unit of work: a 64×64 float64 matmul (~10 µs on one core); a workload of cost c
# repeats it c times, so costs 20 and 21 differ by exactly 5% of the work.
SIDE = 64


def repeated_matmul(reps: int) -> engine.Workload:
    def call(a, b):
        out = a
        for _ in range(reps):
            out = a @ b
        return out

    runnable = Runnable(prepare=lambda d: (d["a"], d["b"]), call=call, sync=lambda out: None,
                        fetch=np.asarray, execution=contract.execution("numpy"))
    return engine.Workload(runnable, lambda rng: {
        "a": rng.standard_normal((SIDE, SIDE)), "b": rng.standard_normal((SIDE, SIDE))})


def sample(workload: engine.Workload, criterion: stopping.Criterion, warmup_calls: int = 0,
           warmup_s: float = 0.0) -> dict[str, Any]:
    """Warm-up then host-clock samples until ``criterion`` stops; wall time of it all."""
    r, clock = workload.runnable, clocks.HostClock()
    args = r.prepare(workload.make_inputs(np.random.default_rng()))
    start = time.perf_counter()
    calls = 0
    while calls < warmup_calls or time.perf_counter() - start < warmup_s:
        r.sync(r.call(*args))
        calls += 1
    began = time.perf_counter()
    while not criterion.finished:
        _, timing = clock.time(lambda: r.call(*args), r.sync)
        criterion.add(timing.seconds, time.perf_counter() - began)
    samples = criterion.samples
    return {"wall_s": time.perf_counter() - start, "samples": len(samples),
            "median_s": float(np.median(samples)),
            "precision": stats.relative_half_width(samples, 0.95), "reason": criterion.reason}


def write(name: str, data: dict[str, Any]) -> Path:
    path = RESULTS / f"{name}.json"
    host = {"machine": platform.machine(), "processor": platform.processor(),
            "python": platform.python_version(), "node": platform.node()}
    files.atomic_write_text(path, json.dumps({"host": host, **records.made(), **data},
                                               indent=2) + "\n")
    return path
