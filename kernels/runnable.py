"""What a case hands the pipeline to run: a framework-neutral callable with its facts.

The pipeline never imports a framework for a case; it calls ``prepare`` once per input
set (host arrays -> device arrays), ``call`` to launch, ``sync`` to wait for completion
and ``fetch`` to bring the output back: one numpy array, or ``{name: array}`` for a
kernel with several named outputs. Two optional facts help the timer: ``stream``, the
device stream handle the work is enqueued on (CUDA events are recorded there), and
``barrier``, a wait for all work on every stream of the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np


class Runnable(NamedTuple):
    prepare: Callable[[dict[str, np.ndarray]], tuple[Any, ...]]
    call: Callable[..., Any]
    sync: Callable[[Any], None]
    fetch: Callable[[Any], np.ndarray | dict[str, np.ndarray]]
    execution: dict[str, Any]  # how it runs: mode, interpret, poisoned, race_detection
    stream: Any = None  # the stream ``call`` enqueues on; None: the framework chooses
    barrier: Callable[[], None] | None = None  # drains every stream, not just the output's


def _to_numpy(out: Any) -> np.ndarray | dict[str, np.ndarray]:
    import jax

    host = jax.device_get(out)
    if isinstance(host, dict):
        return {name: np.asarray(value) for name, value in host.items()}
    return np.asarray(host)


def from_jax(fn: Callable[..., Any], names: tuple[str, ...], execution: dict[str, Any]) -> Runnable:
    """A Runnable for a JAX function of the inputs ``names``, jit-compiled once."""
    import jax

    compiled = jax.jit(fn)

    def prepare(inputs: dict[str, np.ndarray]) -> tuple[Any, ...]:
        return tuple(jax.device_put(inputs[name]) for name in names)

    return Runnable(
        prepare=prepare,
        call=compiled,
        sync=jax.block_until_ready,
        fetch=_to_numpy,
        execution={"framework": f"jax {jax.__version__}",
                   "device": str(jax.devices()[0].platform), **execution},
    )
