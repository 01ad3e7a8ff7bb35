"""Jobs that need no device stay off it: lowering for CUDA and the check's power run on
the host. On a GPU host every process that starts an XLA client on the device takes a
share of its memory, so such a job, run beside the one that measures, could starve it.
A TPU is held by one process at a time: there every job that does not hold the device
(no ``gpu`` resource) stays off it (``off_the_chip``, from ``worker.fork_from_server``).

Call these before anything imports jax.
"""

from __future__ import annotations

import os

from kernels import contract


def stay_on_host() -> None:
    """Give this process's jax the CPU backend only."""
    os.environ["JAX_PLATFORMS"] = "cpu"


TPU_TARGETS = ("tpu-v5e",)


def _target(job) -> str | None:
    return getattr(getattr(job, "wildcards", None), "target", None)


def holds_the_chip(job) -> bool:
    """Whether ``job`` (a script's ``snakemake`` object) is a TPU target's job that holds
    the device (its ``gpu`` resource)."""
    return _target(job) in TPU_TARGETS and bool(
        getattr(getattr(job, "resources", None), "gpu", 0))


def off_the_chip(job) -> bool:
    """Keep a job of a TPU target that does not hold the device (no ``gpu`` resource: a
    lowering, a figure) on the host, and tell every job of a TPU target so
    (``contract.TARGET_PLATFORM``): a GPU kernel there is refused without opening the
    chip. ``job``: a script's ``snakemake`` object. True if this moved it."""
    if _target(job) not in TPU_TARGETS:
        return False
    os.environ[contract.TARGET_PLATFORM] = "tpu"
    if holds_the_chip(job):
        return False
    stay_on_host()
    return True
