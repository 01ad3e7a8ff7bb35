"""Case 01's reference, compiled: FlashInfer's masked NVFP4 grouped GEMM (CuTe DSL) built
for sm_100a on this host, and the launch it makes read from the compile, not inferred
from its source.

The pinned wheel's kernel module is compiled with CuTe DSL in a child process (``python
-m kernels.moe_nvfp4.upstream``), at the point's GEMM1 and GEMM2 shapes, with the
tiles and cluster its entry ``grouped_gemm_nt_masked`` defaults to on sm_100 (read from
``_grouped_gemm_nt_masked_sm100``'s ``kwargs.pop`` defaults in the pinned source). The
child never imports torch: the module imports it (and flashinfer's package ``__init__``,
which needs torch and filelock) only for host-side wrappers, so it is given stand-in
modules that hold names and raise if called. CuTe DSL compiles with placeholder
pointers: the shapes are compile-time constants. What is recorded:

- the host-side launch (grid, block, cluster, dynamic shared memory), as the compiled
  program's launch call receives it during tracing;
- the kernel object's persistent tile schedule (tiles per dimension, tile clusters for the
  padded M: an upper bound, as the real count follows masked_m on the device), pipeline
  stages and tensor-memory columns;
- registers per thread, from ``cuobjdump -res-usage`` of the cubin, and the tcgen05 MMA
  kinds in its PTX.

One input is not the kernel's: the reference asks its device for the SM count and the
clusters that can be resident, which needs a GPU. The compile is given a B200's 148 SMs,
one cluster per SM group (``TARGET_SMS``): at 226,304 B of shared memory a CTA takes a whole
SM, so that is the occupancy the hardware would report. Compiled only, never run: the
kernel needs a Blackwell GPU, and its host wrapper torch.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from kernels import cuda_toolkit, mgpu_lowering

VARIANT = "reference_flashinfer"
ARCH = "sm_100a"
TARGET_SMS = 148  # SMs of an NVIDIA B200: the sm_count the reference reads from its device
MODULE = "flashinfer.gemm.kernels.grouped_gemm_masked_blackwell"
WRAPPER = "grouped_gemm_nt_masked"  # the public entry (flashinfer.gemm)
SM100_ENTRY = "_grouped_gemm_nt_masked_sm100"  # where it routes on sm_100: the defaults
KERNEL_CLASS = "Sm100BlockScaledPersistentDenseGemmKernel"
TIMEOUT_S = 300


@functools.cache
def package_dir() -> Path:
    """The installed flashinfer package (the pinned wheel, env/reference.lock)."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("flashinfer is not installed (env/reference.lock pins it)")
    return Path(next(iter(spec.submodule_search_locations)))


def source() -> Path:
    return package_dir() / "gemm" / "kernels" / "grouped_gemm_masked_blackwell.py"


def wrapper_defaults(path: Path) -> dict[str, Any]:
    """The defaults the sm_100 entry behind ``grouped_gemm_nt_masked`` gives its tuning
    keywords (``kwargs.pop(name, default)``), read from the pinned source."""
    tree = ast.parse(path.read_text())
    found = {}
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and function.name == SM100_ENTRY:
            for call in ast.walk(function):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "pop" and len(call.args) == 2
                        and isinstance(call.args[0], ast.Constant)):
                    found[call.args[0].value] = ast.literal_eval(call.args[1])
    if not {"mma_tiler_mn", "cluster_shape_mn"} <= set(found):
        raise ValueError(f"{path}: {SM100_ENTRY} no longer defaults mma_tiler_mn and "
                         f"cluster_shape_mn through kwargs.pop (found {sorted(found)})")
    return {"mma_tiler_mn": tuple(found["mma_tiler_mn"]),
            "cluster_shape_mn": tuple(found["cluster_shape_mn"])}


def build(params: dict[str, Any]) -> dict[str, Any]:
    """The reference compiled at the point's GEMM1 and GEMM2: one artifact each; none,
    with the reason, on a host without CuTe DSL (an offline GPU host is given only what
    it runs: the compile is a CPU host's record, the same from the same pins)."""
    if importlib.util.find_spec("cutlass") is None:
        return {"artifacts": [], "not_compiled_here": (
            "CuTe DSL is not installed on this host: the reference is compiled on a host "
            "with env/cpu.lock (target cpu's records)")}
    e, m, k, n = params["experts"], params["m"], params["hidden"], params["inter"]
    artifacts = []
    for stage, (cols, depth) in (("gemm1", (2 * n, k)), ("gemm2", (k, n))):
        start = time.perf_counter()
        facts = compile_launch(e, m, cols, depth)
        artifacts.append({
            "target": f"cuda {ARCH}",
            "kind": f"FlashInfer CuTe DSL kernel (the reference): {stage} (compiled on CPU, "
                    "not run)",
            "seconds": time.perf_counter() - start, "facts": {"kernel": stage, **facts}})
    return {"artifacts": artifacts}


def compile_launch(experts: int, m: int, n: int, k: int) -> dict[str, Any]:
    """Compile the reference for one GEMM in a child process; its launch facts."""
    with tempfile.TemporaryDirectory(prefix="casebook-reference-") as dump:
        env = {**os.environ, "CUTE_DSL_ARCH": ARCH, "CUTE_DSL_KEEP": "cubin,ptx",
               "CUTE_DSL_DUMP_DIR": dump, "CUTE_DSL_NO_CACHE": "1"}
        done = subprocess.run(
            [sys.executable, "-m", __name__, json.dumps([experts, m, n, k]), dump],
            capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    if done.returncode:
        raise ValueError(f"compiling {MODULE} for {ARCH} at (groups, m, n, k) = "
                         f"({experts}, {m}, {n}, {k}) failed: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _stand_ins() -> None:
    """Modules the kernel's file imports for its host wrappers, standing in (this child
    process only): torch and cutlass.torch, flashinfer's packages without their
    ``__init__``, its device query and its wrapper module."""
    import cuda.bindings.driver as cuda

    class Absent:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("torch is not installed: a stand-in was called")

    def module(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
        made = types.ModuleType(name)
        if path is not None:
            made.__path__ = [str(path)]
        made.__dict__.update(attrs)
        sys.modules[name] = made
        return made

    torch = module("torch")
    torch.__getattr__ = lambda name: type(name, (Absent,), {})
    module("cutlass.torch", current_stream=lambda: cuda.CUstream(0))
    root = package_dir()
    module("flashinfer", root)
    module("flashinfer.utils", get_compute_capability=lambda device=None: (10, 0))
    module("flashinfer.cute_dsl", root / "cute_dsl")
    module("flashinfer.gemm", root / "gemm")
    module("flashinfer.gemm.kernels", root / "gemm" / "kernels")
    module("flashinfer.gemm.kernels.grouped_gemm_masked_wrapper", **{WRAPPER: None})


def _int(value):
    if isinstance(value, tuple | list):
        return [_int(v) for v in value]
    return int(value)


def _compile_here(experts: int, m: int, n: int, k: int, dump: str) -> dict[str, Any]:
    """In the child: compile, capturing the launch while the compiler's context lives."""
    _stand_ins()
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cutlass_dsl.cutlass import KernelLauncher

    reference = importlib.import_module(MODULE)
    from flashinfer.cute_dsl.utils import get_cutlass_dtype, make_ptr

    defaults = wrapper_defaults(source())
    tiler, cluster = defaults["mma_tiler_mn"], defaults["cluster_shape_mn"]
    reference.get_max_active_clusters = lambda size: TARGET_SMS // size
    captured: dict[str, Any] = {}
    kernel_class = getattr(reference, KERNEL_CLASS)
    init, launch = kernel_class.__init__, KernelLauncher.launch

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        captured["kernel"] = self

    def observe(self, *args, **kwargs):
        kernel = captured["kernel"]
        schedule = kernel.tile_sched_params
        captured["facts"] = {
            "grid": _int(kwargs["grid"]), "block": _int(kwargs["block"]),
            "cluster": _int(kwargs["cluster"]), "dynamic_smem_bytes": int(kwargs["smem"]),
            "smem_limit_bytes": int(kernel.smem_capacity),
            "tmem_columns": int(kernel.num_tmem_alloc_cols),
            "tmem_limit_columns": mgpu_lowering.TMEM_COLUMNS,
            "tile_schedule": {
                "persistent_ctas": int(cute.size(kwargs["grid"])),
                "cta_tile": _int(schedule.c_tiler),
                "tiles_per_dim_mnl": _int(schedule.problem_shape_ntile_mnl),
                "tile_clusters_at_capacity": int(cute.size(
                    schedule.problem_layout_ncluster_mnl))},
            "tuning": {"mma_tiler_mn": "x".join(map(str, tiler)),
                       "cluster_shape_mn": "x".join(map(str, cluster)),
                       "stages_ab_acc_c": f"{kernel.num_ab_stage}/{kernel.num_acc_stage}/"
                                          f"{kernel.num_c_stage}",
                       "sm_count": TARGET_SMS}}
        return launch(self, *args, **kwargs)

    kernel_class.__init__, KernelLauncher.launch = keep, observe
    ab, sf, c, f32 = (get_cutlass_dtype(name) for name in
                      ("float4_e2m1fn", "float8_e4m3fn", "bfloat16", "float32"))
    gemm = reference.MaskedBatchedMatmulCuteDSL(
        m=m, n=n, k=k, l=experts, a_major="k", b_major="k", c_major="n", ab_dtype=ab,
        sf_dtype=sf, c_dtype=c, alpha_dtype=f32, sf_vec_size=16, mma_tiler_mn=tiler,
        cluster_shape_mn=cluster, sm_count=TARGET_SMS, sm_version="sm_100")
    gmem = cute.AddressSpace.gmem
    pointers = [make_ptr(t, 16, gmem, 16) for t in (ab, ab, sf, sf, c, cutlass.Int32)]
    pointers += [None, make_ptr(f32, 16, gmem, 16)] + [None] * 6  # alpha; no fusions
    compiled = cute.compile(gemm, *pointers, cuda.CUstream(0))
    facts = captured["facts"]
    (cubin,) = Path(dump).rglob("*.cubin")
    (resources,) = cuda_toolkit.kernel_resources(cubin, "")
    facts["registers_per_thread"] = resources["registers_per_thread"]
    ptx = compiled.artifacts.PTX or ""
    facts["tcgen05_mma"] = sorted(set(mgpu_lowering.TCGEN05_MMA.findall(ptx)))
    facts["compiled_with"] = f"CuTe DSL {cutlass.__version__}"
    return facts


if __name__ == "__main__":
    print(json.dumps(_compile_here(*json.loads(sys.argv[1]), sys.argv[2])))
