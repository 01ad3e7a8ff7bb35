"""Jobs that need no GPU stay off it: lowering for CUDA and the check's power run on the
host. On a GPU host every process that starts an XLA client on the device takes a share
of its memory, so such a job, run beside the one that measures, could starve it.

Call ``stay_on_host()`` before anything imports jax.
"""

from __future__ import annotations

import os


def stay_on_host() -> None:
    """Give this process's jax the CPU backend only."""
    os.environ["JAX_PLATFORMS"] = "cpu"
