"""Probe of what an early-return guard can rely on on a TPU (lab tool, run there by hand;
docs/tpu.md reads its record): how long fetching an output takes right after the wait,
after a pause, and after an explicit asynchronous copy; whether fetching runs programs on
the chip; whether a trace stopped before the work ends still holds that work; and whether
a marker program splits one trace into samples. Writes ``guard_probe.json`` to OUT.

    python3 benchmarks/tpu_guard_probe.py OUT
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from casebook.measure import tpu

OUT = sys.argv[1]
found: dict = {"jax": jax.__version__, "device": jax.devices()[0].device_kind}


def save() -> None:
    with open(os.path.join(OUT, "guard_probe.json"), "w") as f:
        json.dump(found, f, indent=1, default=str)


def traced(block) -> list[dict]:
    """The chip's programs while ``block`` runs inside one trace."""
    folder = tempfile.mkdtemp()
    try:
        jax.profiler.start_trace(folder, profiler_options=tpu._options())
        try:
            block()
        finally:
            jax.profiler.stop_trace()
        [path] = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
        return [{"name": m.name.split("(")[0], "start_ns": m.start_ns, "ms": m.seconds * 1e3}
                for m in tpu.read(path)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def fetches(call, arms: dict, repeats: int = 5) -> dict:
    """Fetch time (ms) of a fresh output under each arm, interleaved, medians and all."""
    times = {name: [] for name in arms}
    for _ in range(repeats):
        for name, before in arms.items():
            out = call()
            out.block_until_ready()
            before(out)
            times[name].append(seconds(lambda out=out: np.asarray(out)) * 1e3)
            del out
    return {name: {"median_ms": statistics.median(t), "all_ms": [round(x, 3) for x in t]}
            for name, t in times.items()}


def main() -> None:
    key = jax.random.key(0)
    for n in (8192, 2048, 256):
        a = jax.random.normal(key, (n, n), jnp.bfloat16)
        matmul = jax.jit(lambda x, y: x @ y)
        call = lambda a=a, matmul=matmul: matmul(a, a)  # noqa: E731
        call().block_until_ready()
        arms = {"after_wait": lambda out: None,
                "after_pause": lambda out: time.sleep(0.05),
                "after_async_copy": lambda out: out.copy_to_host_async(),
                "after_async_copy_and_pause": lambda out: (out.copy_to_host_async(),
                                                           time.sleep(0.05))}
        found[f"fetch_{n}"] = fetches(call, arms)
        save()
        found[f"programs_call_wait_fetch_{n}"] = traced(
            lambda call=call: np.asarray(jax.block_until_ready(call())))
        found[f"programs_call_wait_{n}"] = traced(lambda call=call: call().block_until_ready())
        held = []
        found[f"programs_call_no_wait_{n}"] = traced(
            lambda call=call, held=held: held.append(call()))
        held[0].block_until_ready()
        save()
    marker = jax.jit(lambda x: x + 1)
    one = jnp.zeros((), jnp.int32)
    marker(one).block_until_ready()

    def marked() -> None:
        for _ in range(4):
            marker(one).block_until_ready()
            call().block_until_ready()
    found["programs_marked_4_samples"] = traced(marked)
    save()


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # the record keeps what was seen before a failure
        found["error"] = repr(error)
        save()
        raise
