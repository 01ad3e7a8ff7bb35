"""The one interpreter gap of jax 0.10.2 the forward kernel meets, closed without
changing the kernel.

``plgpu.broadcasted_iota(..., layout=...)`` binds ``layout_cast``, a pure layout
annotation for the Mosaic GPU compiler (its abstract evaluation returns its operand
unchanged). The Mosaic GPU interpreter runs kernels through XLA on the host, which has
no rule for it. Registering the identity as its CPU lowering lets the interpreter run
the very jaxpr that is lowered for sm_90a; on a GPU the Mosaic lowering rule is used
as before (this registers nothing for CUDA).
"""

from __future__ import annotations

import functools

from jax._src.interpreters import mlir
from jax._src.pallas.mosaic_gpu import core as mosaic_gpu_core


@functools.cache
def enable_layout_cast_on_host() -> None:
    """Idempotent: the identity CPU lowering of ``layout_cast``."""
    mlir.register_lowering(mosaic_gpu_core.layout_cast_p,
                           lambda ctx, x, new_layout: [x], platform="cpu")
