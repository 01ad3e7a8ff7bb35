"""The Mosaic GPU interpreter as every case uses it: NaN memory, race detection, and the
one interpreter gap of jax 0.10.2 the kernels meet, closed without changing a kernel.

``plgpu.layout_cast`` (also bound by ``plgpu.broadcasted_iota(..., layout=...)``) is a
pure layout annotation for the Mosaic GPU compiler (its abstract evaluation returns its
operand unchanged). The interpreter runs kernels through XLA on the host, which has no
rule for it. Registering the identity as its CPU lowering lets the interpreter run the
very jaxpr that is lowered for sm_90a; on a GPU the Mosaic lowering rule is used as
before (this registers nothing for CUDA).
"""

from __future__ import annotations

import functools
import importlib

from jax._src.interpreters import mlir
from jax._src.pallas.mosaic_gpu import core as mosaic_gpu_core


@functools.cache
def enable_layout_cast_on_host() -> None:
    """Idempotent: the identity CPU lowering of ``layout_cast``."""
    mlir.register_lowering(mosaic_gpu_core.layout_cast_p,
                           lambda ctx, x, new_layout: [x], platform="cpu")


def interpret_params(race_detection: bool = True):
    """The Mosaic GPU interpreter: uninitialised SMEM is NaN, races detected."""
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams(detect_races=race_detection, uninitialized_memory="nan")


def races_found() -> bool:
    """Whether the Mosaic GPU interpreter's race detector saw a race since the last reset
    (its state is read directly: ``get_races()`` asserts before any kernel has run)."""
    state = importlib.import_module("jax._src.pallas.mosaic_gpu.interpret.gpu_callbacks")
    return bool(state._races is not None and state._races.races_found)


def reset_interpreter() -> None:
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

    interpret_pallas_call.reset_gpu_interpret_mode_state()
