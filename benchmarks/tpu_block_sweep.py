"""Upstream splash attention's block sizes on the TPU (lab tool, run on the TPU host): the
device time of its forward and backward at each block size that divides S, from the
chip's own trace (casebook's TraceClock, 8 samples a trace), at the case's publishable
problems (causal and local, 16 heads, d 128, bf16). Evidence for the block choice the
pipeline does not yet make on the TPU (docs/tpu.md); no correctness is judged here (the
pipeline verifies what it times).

    python3 benchmarks/tpu_block_sweep.py OUT [SECONDS]

Writes OUT/tpu_block_sweep.json, stopping cleanly before SECONDS (default 240) pass.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import jax
import numpy as np

import kernels.splash_attention as splash
from casebook.core import provenance
from casebook.measure import tpu
from kernels.splash_attention import upstream

OUT, BUDGET_S = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 240.0
BLOCKS = (128, 256, 512, 1024)
PROBLEMS = [{"heads_q": 16, "heads_kv": 16, "seq_len": s, "head_dim": 128, "dtype": "bfloat16",
             "mask": mask} for s in (4096, 16384, 32768)
            for mask in ({"kind": "causal"}, {"kind": "local", "window": [s // 4, 0]})]
SAMPLES = 8


def device_median(fn, args) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    clock = tpu.TraceClock()
    timed = clock.time_many([(lambda: None, lambda: fn(*args), jax.block_until_ready)
                             for _ in range(SAMPLES)])
    return statistics.median(t.seconds for _, t in timed)


def main() -> None:
    began = time.monotonic()
    found = {"commit": provenance.commit(), "device": jax.devices()[0].device_kind,
             "jax": jax.__version__, "samples_per_median": SAMPLES, "rows": []}
    rng = np.random.default_rng(20261206)
    for params in PROBLEMS:
        inputs = splash.make_inputs(params, rng)
        args = [jax.device_put(inputs[n]) for n in ("q", "k", "v", "do")]
        for block in BLOCKS:
            if params["seq_len"] % block or time.monotonic() - began > BUDGET_S:
                continue
            point = {**params, "block": block}
            row = {"params": point}
            for name, make, computed, used in (
                    ("forward", upstream.make, ("out",), args[:3]),
                    ("backward", upstream.make_backward, splash.GRADIENTS, args)):
                try:
                    seconds = device_median(jax.jit(make(point, interpret=False)), used)
                except Exception as error:  # a block the kernel refuses, or memory
                    row[name] = {"error": str(error).splitlines()[0][:200]}
                    continue
                flops = splash.work(point, computed)["flops"]
                row[name] = {"median_s": seconds, "tflops": flops / seconds / 1e12}
            found["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(os.path.join(OUT, "tpu_block_sweep.json"), "w") as out:
                json.dump({**found, "seconds": round(time.monotonic() - began, 1)}, out,
                          indent=1)


if __name__ == "__main__":
    main()
