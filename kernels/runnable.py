"""A :class:`~kernels.contract.Runnable` for a JAX function: the helper the cases share."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels.contract import Execution, Runnable


def _to_numpy(out: Any) -> np.ndarray | dict[str, np.ndarray]:
    import jax

    host = jax.device_get(out)
    if isinstance(host, dict):
        return {name: np.asarray(value) for name, value in host.items()}
    return np.asarray(host)


def from_jax(fn: Callable[..., Any], names: tuple[str, ...], execution: Execution) -> Runnable:
    """A Runnable for a JAX function of the inputs ``names``, jit-compiled once; its
    execution facts gain the framework and the device."""
    import jax

    compiled = jax.jit(fn)

    def prepare(inputs: dict[str, np.ndarray]) -> tuple[Any, ...]:
        return tuple(jax.device_put(inputs[name]) for name in names)

    def binary(args: tuple[Any, ...]) -> str:
        """The module jit lowers for ``args`` (cached once called), with the jax version
        and the device it compiles for."""
        device = jax.devices()[0]
        digest = hashlib.sha256(f"jax {jax.__version__} {device.platform} "
                                f"{device.device_kind}\n".encode())
        digest.update(compiled.lower(*args).as_text().encode())
        return digest.hexdigest()

    return Runnable(
        prepare=prepare,
        call=compiled,
        sync=jax.block_until_ready,
        fetch=_to_numpy,
        binary=binary,
        execution=Execution(**execution, framework=f"jax {jax.__version__}",
                            device=str(jax.devices()[0].platform)),
    )
