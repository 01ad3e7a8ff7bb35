"""Probe of the TPU host's device clock (lab tool, run there by hand): what a jax.profiler
trace costs per sample, what it holds, and how its device times compare with the wall
clock around ``block_until_ready``. Writes ``probe.json`` and a small trace to OUT.

    python3 benchmarks/tpu_probe.py OUT
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

import jax
import jax.numpy as jnp

OUT = sys.argv[1]
found: dict = {}


def save() -> None:
    with open(os.path.join(OUT, "probe.json"), "w") as f:
        json.dump(found, f, indent=1, default=str)


def options():
    opts = jax.profiler.ProfileOptions()
    opts.host_tracer_level = 0
    opts.python_tracer_level = 0
    return opts


def traced(fn, calls: int, opts=True):
    """Run ``fn`` ``calls`` times inside one trace; the xplane path and wall times."""
    folder = tempfile.mkdtemp()
    start = time.perf_counter()
    jax.profiler.start_trace(folder, profiler_options=options() if opts else None)
    started = time.perf_counter()
    walls = []
    for _ in range(calls):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        walls.append(time.perf_counter() - t)
    before_stop = time.perf_counter()
    jax.profiler.stop_trace()
    stopped = time.perf_counter()
    [path] = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
    return path, walls, {"start_s": started - start, "stop_s": stopped - before_stop}


def describe(path: str) -> dict:
    t = time.perf_counter()
    data = jax.profiler.ProfileData.from_file(path)
    out = {"parse_s": None, "bytes": os.path.getsize(path), "planes": []}
    for plane in list(data.planes):
        p = {"name": plane.name, "lines": []}
        for line in list(plane.lines):
            events = list(line.events)
            entry = {"name": line.name, "events": len(events)}
            if plane.name.startswith("/device:TPU") and line.name in (
                    "XLA Modules", "XLA Ops", "Steps", "XLA TraceMe"):
                entry["first"] = [
                    {"name": e.name, "start_ns": e.start_ns, "duration_ns": e.duration_ns,
                     "stats": {k: str(v) for k, v in list(e.stats)}}
                    for e in events[:40]]
            p["lines"].append(entry)
        out["planes"].append(p)
    out["parse_s"] = time.perf_counter() - t
    return out


def module_durations(path: str) -> list[tuple[str, float]]:
    data = jax.profiler.ProfileData.from_file(path)
    for plane in list(data.planes):
        if plane.name.startswith("/device:TPU"):
            for line in list(plane.lines):
                if line.name == "XLA Modules":
                    return [(e.name, e.duration_ns * 1e-9) for e in list(line.events)]
    return []


def section(name):
    def wrap(fn):
        t = time.perf_counter()
        try:
            found[name] = fn()
        except Exception:  # a lab probe records every failure and goes on
            found[name] = {"error": traceback.format_exc()[-3000:]}
        found.setdefault("section_s", {})[name] = time.perf_counter() - t
        save()
        return fn
    return wrap


t0 = time.perf_counter()
dev = jax.devices()[0]
found["facts"] = {"jax": jax.__version__, "device_kind": dev.device_kind,
                  "platform": dev.platform, "open_s": time.perf_counter() - t0,
                  "memory": str(getattr(dev, "memory_stats", lambda: None)())[:400],
                  "python": sys.version}
save()
key = jax.random.key(0)
small = jax.jit(lambda a: a @ a)
a32 = jax.random.normal(key, (1024, 1024), jnp.float32)
big = jax.jit(lambda a, b: a @ b)
a16 = jax.random.normal(key, (8192, 8192), jnp.bfloat16)
jax.block_until_ready(small(a32))
jax.block_until_ready(big(a16, a16))


@section("fixture")
def _fixture():
    path, walls, cost = traced(lambda: small(a32), 3)
    shutil.copy(path, os.path.join(OUT, "matmul1024_x3.xplane.pb"))
    return {"walls": walls, **cost, "described": describe(path)}


@section("per_sample_trace_cost")
def _cost():
    costs = []
    for _ in range(8):
        _, _, cost = traced(lambda: small(a32), 1)
        costs.append(cost)
    return costs


@section("big_matmul")
def _big():
    path, walls, cost = traced(lambda: big(a16, a16), 10)
    mods = module_durations(path)
    return {"walls": walls, "modules": mods, **cost,
            "tflops_device": [2 * 8192**3 / d / 1e12 for _, d in mods]}


@section("splash")
def _splash():
    from jax.experimental.pallas.ops.tpu import splash_attention as splash
    out = {}
    for s in (4096, 16384):
        h, d = 16, 128
        mask = splash.MultiHeadMask([splash.CausalMask((s, s))] * h)
        bs = splash.BlockSizes(block_q=512, block_kv=512, block_kv_compute=512,
                               block_q_dkv=512, block_kv_dkv=512,
                               block_kv_dkv_compute=512, block_q_dq=512, block_kv_dq=512)
        kernel = splash.make_splash_mha_single_device(mask, block_sizes=bs)
        q, k, v = (jax.random.normal(jax.random.key(i), (h, s, d), jnp.bfloat16)
                   for i in range(3))
        fwd = jax.jit(kernel)

        def loss(q, k, v, kernel=kernel):
            return kernel(q, k, v).astype(jnp.float32).sum()

        bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        flops = 4 * h * s * s * d / 2
        for name, fn, mult in (("fwd", fwd, 1), ("bwd", bwd, 2.5)):
            jax.block_until_ready(fn(q, k, v))
            path, walls, cost = traced(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v), 5)
            mods = module_durations(path)
            if s == 4096 and name == "fwd":
                shutil.copy(path, os.path.join(OUT, "splash4096_fwd_x5.xplane.pb"))
                out["fixture_describe"] = describe(path)
            out[f"{name}_{s}"] = {"walls": walls, "modules": mods, **cost,
                                  "frac_peak": [flops * mult / dd / 1.97e14 for _, dd in mods]}
    return out


@section("batched_fori")
def _fori():
    n = 20
    loop = jax.jit(lambda a: jax.lax.fori_loop(0, n, lambda i, x: (x @ a) * 1e-3, a))
    jax.block_until_ready(loop(a32))
    t = time.perf_counter()
    jax.block_until_ready(loop(a32))
    return {"loop_of_20_wall_s": time.perf_counter() - t}


found["total_s"] = time.perf_counter() - t0
save()
print(json.dumps({k: v for k, v in found.items() if k != "fixture"}, default=str)[:6000])
