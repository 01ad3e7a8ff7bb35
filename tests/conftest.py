"""Shared fixtures: fresh randomness per test run, and sample records."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from casebook.core import interpreter_speed
from kernels import mgpu_interpret

# Before any test starts JAX: enough XLA CPU workers for warp-specialised interpreting
# (in this process only; the workflow runs the tests start keep XLA's default).
mgpu_interpret.start_host_backend()
# The interpreter as every job runs it (cases.load installs it there).
interpreter_speed.host_values_in_callbacks(load=True)


# Started first (`make test` runs a worker per core, a file per worker): the longest files,
# longest first. The SLURM run mostly waits on the scheduler; the others compute.
FIRST = ("test_slurm.py", "test_workflow.py", "test_browser.py",
         "test_grouped_gemm_reference.py")


REHEARSED = "host_rehearsal"


def pytest_ignore_collect(collection_path, config) -> bool | None:
    """Run as ``-m host_rehearsal`` (`make rehearse`), a test file that marks no test for
    the rehearsal is not imported: it may need packages the offline host has not got
    (playwright, the SLURM plug-in, CuTe DSL)."""
    if (config.getoption("markexpr") == REHEARSED and collection_path.is_file()
            and collection_path.name.startswith("test_")):
        return REHEARSED not in collection_path.read_text()
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return FIRST.index(name) if name in FIRST else len(FIRST)

    items.sort(key=rank)


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A fresh generator per test; its seed is printed so a failure can be replayed. A
    test marked ``seed(n)`` (a statistical claim with no bound tight enough to fail less
    than once in a million runs: docs/testing.md lists them) draws from seed n."""
    marked = request.node.get_closest_marker("seed")
    seed = marked.args[0] if marked else secrets.randbits(63)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def interpreter():
    """The Mosaic GPU interpreter with race detection, reset before and after (a failed
    kernel leaves its state behind)."""
    mgpu_interpret.reset_interpreter()
    yield mgpu_interpret.interpret_params(race_detection=True)
    mgpu_interpret.reset_interpreter()
