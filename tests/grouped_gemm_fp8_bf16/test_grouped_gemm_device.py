"""Case 03's GPU runnables, checked on a CPU where that needs no GPU: what their arguments
keep alive for the raw pointers they hand to a library."""

from __future__ import annotations

import gc

import jax

from casebook.measure import guards
from kernels.grouped_gemm_fp8_bf16 import device, problems


class FakeLibrary:
    """libex69.so's C API, recording the device pointers each handle was given."""

    def __init__(self):
        self.pointers: list[int] = []

    def ex69_create(self, *args):
        self.pointers += args[-5:]  # a, b, scale, c, d
        return 1

    def ex69_run(self, handle, stream):
        return 0

    def ex69_destroy(self, handle):
        """Nothing held."""


def test_the_example_69_library_arguments_hold_every_buffer_its_handle_points_to(
        monkeypatch, rng):
    """On an H200 the arguments held D alone: the next set's A, B, scales and C took the
    freed buffers, and every handle computed the newest set."""
    lib = FakeLibrary()
    monkeypatch.setattr(device, "_built", lambda build_dir: {"library": "libex69.so"})
    monkeypatch.setattr(device, "_library", lambda path: lib)
    grouped = problems.from_params({"m": [128, 64], "n": 256, "k": 256, "mode": "scale_only",
                                    "chunk": 128, "alpha": 1.0, "beta": 0.5,
                                    "dtype": "e5m2_bf16"})
    runnable = device.reference_library_runnable(grouped, "unused")
    args = runnable.prepare(problems.make_inputs(grouped, rng))
    gc.collect()
    held = {leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(args)
            if isinstance(leaf, jax.Array)}
    assert len(lib.pointers) == 5 and set(lib.pointers) <= held
    assert isinstance(runnable.call(*args), jax.Array)
    # D, written by every call, is no top-level argument: the inputs-intact guard hashes
    # those as inputs
    assert guards.digests(args) == [None, None]
