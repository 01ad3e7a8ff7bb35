"""Shared fixtures: fresh randomness per test run, and sample records."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from kernels import mgpu_interpret

# Before any test starts JAX: enough XLA CPU workers for warp-specialised interpreting.
mgpu_interpret.configure_host_pool()


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator per test; its seed is printed so a failure can be replayed."""
    seed = secrets.randbits(63)
    print(f"seed={seed}")
    return np.random.default_rng(seed)
