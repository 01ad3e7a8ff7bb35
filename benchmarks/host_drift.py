"""How far this host drifts on its own: the floor no sequential protocol can beat.

One process, pinned to one CPU before jax starts (as a measuring job is), samples a
workload back to back for ``--seconds``, then cuts the samples into consecutive windows
of 0.05, 0.2 and 1 s. Per window length: the spread of the window medians (relative
MAD) and an A/A floor of consecutive windows, each pair read as A then A' (the 0.95
quantile of |ln ratio|, as ``casebook.measure.noise``). A measurement that is a window,
compared with one made later, cannot resolve less than that floor, however many samples
it takes. Hypervisor steal and idle time (``/proc/stat``) during the run tell whether
the drift is CPU time taken away (steal) or the same CPU time buying less work.

Workloads: ``jax_matmul_256`` (the noise floor's: one jitted 256x256 float32 matmul)
and ``numpy_matmul_128`` (a 128x128 float64 numpy matmul, no XLA).

    .venv/bin/python -m benchmarks.host_drift [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.workloads import write
from casebook.measure import pinning

WINDOWS_S = (0.05, 0.2, 1.0)
QUANTILE = 0.95


def cpu_ticks() -> dict[str, int] | None:
    """The aggregate /proc/stat CPU counters (USER_HZ ticks), or None off Linux."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return None
    fields = stat.read_text().splitlines()[0].split()[1:]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return dict(zip(names, map(int, fields), strict=False))


def workloads(rng) -> dict[str, Any]:
    """name -> a call that does one unit of work and waits for it."""
    import jax
    import jax.numpy as jnp

    matmul = jax.jit(jnp.matmul)
    a32, b32 = (jax.device_put(rng.standard_normal((256, 256), dtype="float32"))
                for _ in range(2))
    a64, b64 = (rng.standard_normal((128, 128)) for _ in range(2))
    return {"jax_matmul_256": lambda: matmul(a32, b32).block_until_ready(),
            "numpy_matmul_128": lambda: a64 @ b64}


def windows(times, seconds, width: float) -> dict[str, Any]:
    """Window medians of ``seconds`` cut by their sample ``times`` into ``width`` windows."""
    import numpy as np

    index = ((times - times[0]) // width).astype(int)
    medians = np.array([np.median(seconds[index == i]) for i in range(index.max())
                        if (index == i).sum() >= 5])
    ratios = medians[1::2][:len(medians) // 2] / medians[0::2][:len(medians) // 2]
    spread = np.median(np.abs(medians - np.median(medians))) / np.median(medians)
    return {"window_s": width, "windows": len(medians),
            "relative_mad_of_medians": float(spread),
            "a_a_floor": float(np.expm1(np.quantile(np.abs(np.log(ratios)), QUANTILE))),
            "ratio_min": float(ratios.min()), "ratio_max": float(ratios.max())}


def drift(call, duration_s: float) -> dict[str, Any]:
    import numpy as np

    for _ in range(50):  # compiled, caches warm
        call()
    before, stamps, seconds = cpu_ticks(), [], []
    end = time.perf_counter() + duration_s
    while (now := time.perf_counter()) < end:
        call()
        stamps.append(now)
        seconds.append(time.perf_counter() - now)
    after = cpu_ticks()
    times, seconds = np.array(stamps), np.array(seconds)
    ticks = None if before is None else {k: after[k] - before[k] for k in before}
    hz = os.sysconf("SC_CLK_TCK")
    return {"samples": len(seconds), "median_s": float(np.median(seconds)),
            "steal_s": None if ticks is None else ticks["steal"] / hz,
            "idle_s": None if ticks is None else ticks["idle"] / hz,
            "windows": [windows(times, seconds, w) for w in WINDOWS_S]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    cpu = pinning.pin_process()  # before jax: XLA sizes its pool on the CPUs it finds
    import numpy as np

    found = {name: drift(call, args.seconds)
             for name, call in workloads(np.random.default_rng()).items()}
    path = write("host_drift", {"pinned_cpu": cpu, "seconds": args.seconds,
                                "cpus": os.cpu_count(), "workloads": found})
    for name, result in found.items():
        for w in result["windows"]:
            print(f"{name}: {w['window_s']} s windows: median spread ±"
                  f"{w['relative_mad_of_medians']:.1%}, A/A floor {w['a_a_floor']:.1%}")
        print(f"{name}: steal {result['steal_s']} s during {args.seconds} s")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
