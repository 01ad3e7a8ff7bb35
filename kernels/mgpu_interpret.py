"""The Mosaic GPU interpreter as every case uses it: NaN memory, race detection, the
two interpreter gaps of jax 0.10.2 the kernels meet (closed without changing a kernel),
and the host thread pool that warp-specialised kernels need.

``plgpu.layout_cast`` (also bound by ``plgpu.broadcasted_iota(..., layout=...)``) is a
pure layout annotation for the Mosaic GPU compiler (its abstract evaluation returns its
operand unchanged). The interpreter runs kernels through XLA on the host, which has no
rule for it. Registering the identity as its CPU lowering lets the interpreter run the
very jaxpr that is lowered for sm_90a; on a GPU the Mosaic lowering rule is used as
before (this registers nothing for CUDA).

jax 0.10.2's interpreter runs each warpgroup of a CTA by jitting a function it defines
anew on every call (``thread_map._run_jaxpr``), so JAX's caches never hit: every
warpgroup of every CTA of every call was traced and compiled by XLA again (12
compilations of 1.3–1.8 s for one call of a 4-CTA, 3-warpgroup forward). jax 0.11
defines that function once, at module level, "so that caching works properly";
``cache_thread_bodies`` gives 0.10.2 the same: the same jaxpr evaluated the same way,
compiled once per kernel. Where the module already has it, nothing changes.

Each memory access, barrier and MMA of an interpreted kernel is a host callback
(``io_callback``), thousands per call. jax hands every callback its arguments as jax
arrays, device_put one by one, and jax 0.10.2's interpreter turns them straight back into
Python ints and numpy (reading each allocation request element by element through jax,
which 0.11 reads with numpy): on a 2-core host about two thirds of every interpreted
call. ``numpy_callback_arguments`` gives 0.10.2's interpreters numpy copies instead: the
same values, the same code, bit-identical outputs and the same race reports, about 3x
faster (tests/test_interpreter_callbacks.py). jax 0.11's interpreter checks for jax
arrays in places, so there nothing changes.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

from kernels import contract

# The interpreter runs each warpgroup of a CTA as its own XLA computation, and a
# warpgroup's barrier wait blocks the XLA CPU worker thread it runs on. XLA sizes that
# pool to the usable cores unless PJRT_NPROC says otherwise (read once, when the CPU
# backend starts). With fewer workers than warpgroups a CTA can starve: two warpgroups
# wait at a barrier for the third, which is queued behind them (seen on a 2-core host:
# a producer + 2 consumer kernel hung every time with 2 workers, never with 3 or more).
# Only the interpreting process gets the larger pool: the variable is set while its
# backend starts and then restored, so other processes (measurements of XLA baselines,
# the noise floor) keep XLA's default.
POOL_VARIABLE = "PJRT_NPROC"
MIN_POOL_WORKERS = 4  # the most warpgroups a kernel here uses (3), plus one
_pool_workers: int | None = None  # this process's pool, when start_host_backend sized it


def host_pool_workers() -> int:
    """The XLA CPU pool's worker count this process has (or will have)."""
    if _pool_workers is not None:
        return _pool_workers
    return int(os.environ.get(POOL_VARIABLE) or len(os.sched_getaffinity(0)))


def start_host_backend() -> None:
    """Start JAX's CPU backend with at least ``MIN_POOL_WORKERS`` pool workers (an explicit
    ``PJRT_NPROC`` is kept), leaving the environment as it was. Too late once the backend
    has started: ``check_host_pool`` then refuses a kernel that could starve."""
    global _pool_workers
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():  # the pool is sized already
        return
    workers = max(host_pool_workers(), MIN_POOL_WORKERS)
    before = os.environ.get(POOL_VARIABLE)
    os.environ[POOL_VARIABLE] = str(workers)
    try:
        jax.devices("cpu")
    finally:
        if before is None:
            del os.environ[POOL_VARIABLE]
    _pool_workers = workers


def check_host_pool(warpgroups: int) -> None:
    """Refuse to interpret a ``warpgroups``-thread kernel that could hang on this host."""
    if host_pool_workers() < warpgroups:
        raise RuntimeError(
            f"the Mosaic GPU interpreter needs {warpgroups} XLA CPU workers for a "
            f"{warpgroups}-warpgroup kernel; this process has {host_pool_workers()}: call "
            "kernels.mgpu_interpret.start_host_backend() before JAX starts, or set "
            f"{POOL_VARIABLE}={MIN_POOL_WORKERS}")


@functools.cache
def prepare_host_interpreter() -> None:
    """Idempotent: the identity CPU lowering of ``layout_cast``, warpgroup bodies compiled
    once (``cache_thread_bodies``), numpy arguments to the interpreter's callbacks
    (``numpy_callback_arguments``)."""
    from jax._src.interpreters import mlir
    from jax._src.pallas.mosaic_gpu import core as mosaic_gpu_core

    mlir.register_lowering(mosaic_gpu_core.layout_cast_p,
                           lambda ctx, x, new_layout: [x], platform="cpu")
    cache_thread_bodies()
    numpy_callback_arguments()


def _eval_thread_body(jaxpr, consts, *args):
    """One warpgroup's body: a module-level function, so its jit is cached."""
    from jax import core as jax_core

    jax_core.eval_jaxpr(jaxpr, consts, *args)


def _run_thread_body(jaxpr, consts, *args):
    """What jax 0.11's ``thread_map._run_jaxpr`` does: trace, lower, compile (all cached
    after the first warpgroup) and run."""
    import jax

    traced = jax.jit(_eval_thread_body, static_argnums=(0,)).trace(jaxpr, consts, *args)
    traced.lower().compile()(consts, *args)


def cache_thread_bodies() -> bool:
    """Give jax 0.10.2's interpreter jax 0.11's cached warpgroup bodies; whether the
    module needed it (jax 0.11 has its own module-level ``_run``)."""
    from jax._src.pallas.mosaic.interpret import thread_map

    if hasattr(thread_map, "_run"):
        return False
    thread_map._run_jaxpr = _run_thread_body
    return True


# Whose host callbacks take numpy arguments: the Mosaic GPU and the Pallas TPU
# interpreters (upstream splash is checked in the latter).
INTERPRETER_MODULES = ("jax._src.pallas.mosaic_gpu.interpret.",
                       "jax._src.pallas.mosaic.interpret.")


def _module_of(flat_callback) -> str:
    """The module of the function an ``io_callback`` calls (through any partials)."""
    function = flat_callback.callback_func
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(function, "__module__", None) or ""


@functools.cache
def numpy_callback_arguments() -> bool:
    """Idempotent: under jax 0.10 the interpreters' io_callbacks get each argument as a
    numpy copy (the buffer XLA passes lives only for the call) instead of a device_put jax
    array; every other io_callback goes through jax's own ``io_callback_impl`` as before.
    jax looks the function up when a callback runs, so compiled kernels take it too.
    Whether it was installed (not under jax 0.11, whose interpreter wants jax arrays)."""
    import jax
    import numpy as np
    from jax._src import callback as jax_callback
    from jax._src import config as jax_config
    from jax._src import tree_util, xla_bridge

    if jax.__version_info__ >= (0, 11):
        return False
    device_put_arguments = jax_callback.io_callback_impl

    def io_callback_impl(*args, callback, **params):
        if not _module_of(callback).startswith(INTERPRETER_MODULES):
            return device_put_arguments(*args, callback=callback, **params)
        cpu, *_ = xla_bridge.local_devices(backend="cpu")
        with jax_config.default_device(cpu):
            return tree_util.tree_map(
                np.asarray, callback(*(np.array(a, copy=True) for a in args)))

    io_callback_impl.device_put_arguments = device_put_arguments
    jax_callback.io_callback_impl = io_callback_impl
    return True


# The GPU each kernel architecture runs on: compute capability, and what it is called.
ARCHITECTURES = {"sm_90a": ("9.0", "Hopper"), "sm_100a": ("10.0", "Blackwell")}


def placement(purpose: str, arch: str = "sm_90a") -> tuple[Any, dict[str, Any]]:
    """Where a Mosaic GPU kernel for ``arch`` runs on this host, for ``purpose`` ("check"
    or "time"): ``(interpret, execution)``. A GPU of the kernel's architecture: the real
    kernel (``interpret=None``); another GPU or a TPU: refused (``NotRunnable``). No
    accelerator: an sm_90a
    kernel runs in the interpreter (NaN memory; race detection when checking); an
    sm_100a kernel is refused, as no interpreter runs tcgen05 or tensor memory."""
    import jax

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {sorted(ARCHITECTURES)}")
    capability, family = ARCHITECTURES[arch]
    if os.environ.get(contract.TARGET_PLATFORM) == "tpu":
        raise contract.NotRunnable(f"not runnable on a TPU: a Mosaic GPU ({arch}) kernel needs "
                                   f"an NVIDIA GPU of compute capability {capability}; this "
                                   f"job's target is a TPU (the chip left unopened)")
    start_host_backend()
    device = jax.devices()[0]
    if device.platform == "cpu":
        if arch != "sm_90a":
            raise contract.NotRunnable(
                f"lowered only, never run: a {family} ({arch}) kernel needs a GPU of compute "
                f"capability {capability}, and the Mosaic GPU interpreter runs no tcgen05 "
                "or tensor-memory operation")
        races = purpose == "check"
        return interpret_params(race_detection=races), contract.execution(
            "Pallas Mosaic GPU interpret mode on the host CPU (uninitialised shared memory "
            "= NaN" + (", race detection on)" if races else ")"),
            interpret=True, poisoned=True, race_detection=races,
            xla_cpu_pool_workers=host_pool_workers())
    if device.platform == "tpu":
        raise contract.NotRunnable(f"not runnable on a TPU: a Mosaic GPU ({arch}) kernel needs "
                                   f"an NVIDIA GPU of compute capability {capability}; this "
                                   f"host's jax runs on a {device.device_kind}")
    found = getattr(device, "compute_capability", None)
    if found != capability:
        raise contract.NotRunnable(f"a {family} ({arch}) kernel; this host's "
                                   f"{device.device_kind} has compute capability {found}")
    return None, contract.execution(f"Pallas Mosaic GPU kernel on {device.device_kind} "
                                    f"({arch})")


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
