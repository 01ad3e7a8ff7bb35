"""The GPU variants on a GPU host: the port through CuTe DSL, ex. 69 through its harness.

NOT YET RUN ON HARDWARE: no sm_90 GPU was available when this was written, so these
paths are exercised only up to ``sm90_device`` (which finds none on a CPU host). The
inputs go to the device as JAX arrays (jax[cuda13] is in the CUDA lock) and reach the
exported port and the reference's libex69.so as raw device pointers; D is
written in place into a zeroed JAX buffer that nothing else reads. The reference is
checked through its executable on input files (the route the bit-exact comparison
takes) and timed through the library, launched on the default stream like the port.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import tempfile
import weakref
from pathlib import Path

import numpy as np

from kernels import contract
from kernels.contract import Runnable
from kernels.grouped_gemm_fp8_bf16 import aot, compile_port, problems, schedule, upstream
from kernels.grouped_gemm_fp8_bf16.problems import MODES, GroupedProblem

HOPPER = (9, 0)  # compute capability the sm_90a binaries run on


def on_tpu() -> bool:
    """Whether this process's jax runs on a TPU."""
    import jax

    return jax.devices()[0].platform == "tpu"


def sm90_device() -> tuple[str, int] | None:
    """(name, SM count) of the first sm_90 GPU, or None. NVML answers first (it fails
    cleanly where no driver is installed); the CUDA driver then gives the SM count."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        hopper = [i for i in range(pynvml.nvmlDeviceGetCount())
                  if pynvml.nvmlDeviceGetCudaComputeCapability(
                      pynvml.nvmlDeviceGetHandleByIndex(i)) == HOPPER]
    finally:
        pynvml.nvmlShutdown()
    if not hopper:
        return None
    from cuda.bindings import driver

    driver.cuInit(0)
    _, device = driver.cuDeviceGet(hopper[0])
    _, sms = driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
    _, name = driver.cuDeviceGetName(256, device)
    return name.split(b"\0")[0].decode(), sms


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a compact row-major array of ``shape``."""
    return tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))


def port_runnable(problem: GroupedProblem, sms: int, build_dir: str) -> Runnable:
    """The port as exported ahead of time (``compile_port``, ``aot``): one compile serves
    every problem of a mode; a persistent grid of min(tiles, SMs) CTAs. Needs no CuTe DSL
    here: the library was linked with the DSL's and CUDA's static runtimes."""
    import cuda.bindings.driver as cuda
    import jax
    import jax.numpy as jnp
    from cuda.bindings import runtime as cudart

    facts = compile_port.build(problem.mode, build_dir)
    error, devices = cudart.cudaGetDeviceCount()
    if error != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaGetDeviceCount: {error}")
    launcher = aot.Launcher(facts["library"], facts["abi"], devices)
    offsets = {"row_offsets": problem.row_offsets.astype(np.int32),
               "tile_offsets": schedule.tile_offsets(problem.m, problem.n)}
    scalars = {"alpha": problem.alpha, "beta": problem.beta, "chunk": problem.chunk,
               "grid_ctas": max(1, min(int(offsets["tile_offsets"][-1]), sms)),
               "stream": 0}  # the legacy default stream, synchronised below
    stream = cuda.CUstream(0)

    def prepare(inputs):
        problems.check_inputs(problem, inputs)
        arrays = {name: jax.device_put(inputs[name]) for name in ("b", "a", "scale", "c")}
        arrays["d"] = jnp.zeros(inputs["c"].shape, jnp.float16)  # D, written in place
        arrays.update({name: jax.device_put(x) for name, x in offsets.items()})
        # JAX copies on its own streams: wait, so the kernel's stream sees the data.
        arrays = jax.block_until_ready(arrays)
        values = launcher.arguments([
            aot.tensor_value(arg, arrays[arg["name"]].unsafe_buffer_pointer(),
                             arrays[arg["name"]].shape,
                             row_major_strides(arrays[arg["name"]].shape))
            if arg["kind"] == "tensor" else scalars[arg["name"]]
            for arg in launcher.abi["arguments"]])
        return (values, arrays)

    def call(values, arrays):
        launcher(values)
        return arrays["d"]

    return _on_stream(prepare, call, stream, "CuTe DSL kernel on the GPU (sm_90a), exported "
                                             "ahead of time and launched through its library",
                      facts["library"])


def _on_stream(prepare, call, stream, mode: str, library: str) -> Runnable:
    """A runnable whose kernel launches on ``stream``: synchronised there, D read back;
    what runs is ``library``'s code (its sha256 is the runnable's binary)."""
    import cuda.bindings.driver as cuda

    return Runnable(prepare=prepare, call=call,
                    sync=lambda out: cuda.cuStreamSynchronize(stream), fetch=np.asarray,
                    binary=lambda args: _sha256(library), execution=contract.execution(mode),
                    stream=stream)


def _sha256(path: str) -> str:
    """What a runnable runs, named: the sha256 of the compiled file that holds it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _built(build_dir: str) -> dict:
    built = upstream.build(build_dir)
    if not built["built"]:
        raise RuntimeError(built["reason"])
    return built


def reference_runnable(problem: GroupedProblem, build_dir: str) -> Runnable:
    """Example 69's kernels through our harness: inputs to files, D back from a file."""
    binary = _built(build_dir)["binary"]

    def prepare(inputs):
        problems.check_inputs(problem, inputs)
        folder = Path(tempfile.mkdtemp(prefix="ex69-", dir=build_dir))
        header = (f"{problem.groups} {MODES[problem.mode]} {problem.n} {problem.k} "
                  f"{problem.chunk} {problem.alpha!r} {problem.beta!r}\n")
        (folder / "problem.txt").write_text(header + " ".join(map(str, problem.m)) + "\n")
        for name in ("a", "b", "scale", "c"):
            inputs[name].tofile(folder / f"{name}.bin")
        return (folder,)

    def call(folder):
        subprocess.run([binary, str(folder)], check=True, capture_output=True, timeout=600)
        return folder

    return Runnable(prepare=prepare, call=call, sync=lambda folder: None,
                    fetch=lambda folder: np.fromfile(folder / "d.bin", np.float16).reshape(
                        sum(problem.m), problem.n), binary=lambda args: _sha256(binary),
                    execution=contract.execution(
                        "CUTLASS example 69 kernel, run by our harness process on input "
                        "files (GPU)"))


def _library(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.ex69_create.restype = ctypes.c_void_p
    lib.ex69_create.argtypes = [*[ctypes.c_int] * 5, ctypes.c_float, ctypes.c_float,
                                ctypes.POINTER(ctypes.c_int), *[ctypes.c_void_p] * 5]
    lib.ex69_run.argtypes, lib.ex69_run.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    lib.ex69_destroy.argtypes = [ctypes.c_void_p]
    lib.ex69_last_error.restype = ctypes.c_char_p
    return lib


def reference_library_runnable(problem: GroupedProblem, build_dir: str) -> Runnable:
    """Example 69's kernels through libex69.so on device buffers: set up in ``prepare``
    (pointer arrays, workspace, can_implement), one launch per ``call``. The handle holds
    raw pointers, so the arguments hold every buffer it points to: an H200 run that kept
    only D let the allocator give the next input set the freed A, B, scales and C, and
    every handle then computed the newest set (the reuse guard refused it)."""
    import cuda.bindings.driver as cuda
    import jax
    import jax.numpy as jnp

    library = _built(build_dir)["library"]
    lib = _library(library)
    rows = (ctypes.c_int * problem.groups)(*problem.m)
    stream = cuda.CUstream(0)  # the legacy default stream; the library launches there

    def prepare(inputs):
        problems.check_inputs(problem, inputs)
        arrays = jax.block_until_ready([
            *(jax.device_put(inputs[name]) for name in ("a", "b", "scale", "c")),
            jnp.zeros(inputs["c"].shape, jnp.float16)])  # D, written in place
        handle = lib.ex69_create(problem.groups, MODES[problem.mode], problem.n, problem.k,
                                 problem.chunk, problem.alpha, problem.beta, rows,
                                 *(x.unsafe_buffer_pointer() for x in arrays))
        if not handle:
            raise RuntimeError(f"ex69_create: {lib.ex69_last_error().decode()}")
        weakref.finalize(arrays[4], lib.ex69_destroy, handle)
        # D is written in place: inside a tuple, not an argument the inputs-intact guard
        # hashes (an argument ``call`` writes would read as an input it changed).
        return (handle, tuple(arrays))

    def call(handle, buffers):
        if lib.ex69_run(handle, None):
            raise RuntimeError(f"ex69_run: {lib.ex69_last_error().decode()}")
        return buffers[4]

    return _on_stream(prepare, call, stream,
                      "CUTLASS example 69 kernel through libex69.so (GPU)", library)
