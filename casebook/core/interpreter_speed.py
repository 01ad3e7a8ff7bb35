"""jax 0.10.2's Mosaic GPU interpreter without the jax arrays its host callbacks make.

Its host callbacks wrap plain host values in jax arrays: each TMA copy makes two
``jnp.int32`` scalars for a device and a thread id that the function it calls turns
straight back into ints, and each shared- or global-memory read returns ``jnp.array`` of
a numpy buffer, which the next callback (or ``mgpu_interpret.numpy_callback_arguments``)
turns back into numpy. Each is an eager jax dispatch: about a third of an interpreted
call on a 2-core host. ``host_values_in_callbacks`` gives that module numpy's ``array``
and ``int32`` in their place: the same values, bit-identical outputs and the same race
reports, calls 1.4-2x faster (tests/library/test_interpreter_callbacks.py). jax
0.11's interpreter is left as it is.

It lives here, not in ``kernels/mgpu_interpret.py``, because it is not a kernel source
(``provenance.kernel_sources``): it changes how a host runs the interpreter, never what
a kernel computes, and no accelerator's record runs the interpreter, so a change here
has no record to rerun. ``cases.load`` installs it for every job that loads a case, the
tests' conftest for the tests.
"""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np


class HostNumpy(types.ModuleType):
    """``jax.numpy`` with numpy's ``array`` and ``int32``: host values stay numpy."""

    array = staticmethod(np.array)
    int32 = np.int32

    def __init__(self, jnp: types.ModuleType):
        super().__init__(f"{jnp.__name__} (host values)")
        self.jnp = jnp

    def __getattr__(self, name: str):
        return getattr(self.jnp, name)


PALLAS_MOSAIC_GPU = "jax._src.pallas.mosaic_gpu"  # what a case whose kernels it runs imports
CALLBACKS = "jax._src.pallas.mosaic_gpu.interpret.gpu_callbacks"  # imported when first run


def host_values_in_callbacks(load: bool = False) -> bool:
    """Idempotent: install it where Pallas Mosaic GPU is imported (a case whose kernels
    the interpreter runs has imported it; no other case pays for importing the
    interpreter), or anywhere when ``load``; whether it is installed (never under jax
    0.11, whose interpreter wants jax arrays in places)."""
    if not load and PALLAS_MOSAIC_GPU not in sys.modules:
        return False
    import jax

    if jax.__version_info__ >= (0, 11):
        return False
    callbacks = importlib.import_module(CALLBACKS)
    if not isinstance(callbacks.jnp, HostNumpy):
        callbacks.jnp = HostNumpy(callbacks.jnp)
    return True
