"""Shared fixtures: fresh randomness per test run, and sample records."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from kernels import mgpu_interpret

# Before any test starts JAX: enough XLA CPU workers for warp-specialised interpreting
# (in this process only; the workflow runs the tests start keep XLA's default).
mgpu_interpret.start_host_backend()


# Started first (`make test` runs a worker per core, a file per worker): the longest files,
# longest first. The SLURM run mostly waits on the scheduler; the others compute.
FIRST = ("test_slurm.py", "test_workflow.py", "test_browser.py",
         "test_grouped_gemm_reference.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return FIRST.index(name) if name in FIRST else len(FIRST)

    items.sort(key=rank)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator per test; its seed is printed so a failure can be replayed."""
    seed = secrets.randbits(63)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def interpreter():
    """The Mosaic GPU interpreter with race detection, reset before and after (a failed
    kernel leaves its state behind)."""
    mgpu_interpret.reset_interpreter()
    yield mgpu_interpret.interpret_params(race_detection=True)
    mgpu_interpret.reset_interpreter()
