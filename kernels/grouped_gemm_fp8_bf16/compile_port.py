"""Compile the port ahead of time for sm_90a, without a GPU: fake tensors, --keep-cubin,
and export it with its host launcher as a self-contained shared library (``aot``).

``build`` runs ``python -m kernels.grouped_gemm_fp8_bf16.compile_port MODE OUT_DIR`` in its
own process: CuTe DSL reads its environment (architecture, dump and cache folders) at
import, and a GPU intrinsic reached on the host aborts the whole process. The child
writes OUT_DIR/port.json: compile seconds, the cubin's path, the dynamic shared memory
(the size of the kernel's shared-storage struct; cuobjdump sees only static shared
memory), the exported library and its launch ABI, and the hash of the sources compiled;
the parent adds what cuobjdump reads from the cubin.

Where CuTe DSL is not installed (an offline GPU host, given only what it must run), the
build is the export made elsewhere and carried in ``OUT_DIR``, taken only when it was
compiled from these very sources.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kernels import cuda_toolkit as toolkit
from kernels.grouped_gemm_fp8_bf16 import aot
from kernels.grouped_gemm_fp8_bf16.problems import ALIGNMENT

KERNEL_NAME = "GroupedMixedGemm"  # in the kernel's generated (mangled) name
TIMEOUT_S = 600
HERE = Path(__file__).resolve().parent
# What the exported library is made from: a carried export is used only for these.
SOURCES = ("port.py", "schedule.py", "problems.py", "compile_port.py", "aot.py")


def sources_sha256() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    return digest.hexdigest()


def dsl_installed() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def compile_port(mode: str, out_dir: Path) -> dict:
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    from kernels.grouped_gemm_fp8_bf16 import port

    def row_major(dtype, shape, **kwargs):
        return make_fake_compact_tensor(dtype, shape, stride_order=tuple(
            reversed(range(len(shape)))), **kwargs)

    # Symbolic extents, so one compile serves every problem of a mode: N and K multiples
    # of 16 (problems.ALIGNMENT), the rest any size.
    n, k = (cute.sym_int(divisibility=ALIGNMENT) for _ in range(2))
    g, rows, sk, offs = (cute.sym_int() for _ in range(4))
    b = row_major(cutlass.Float8E5M2, (g, n, k), assumed_align=16)
    a = row_major(cutlass.BFloat16, (rows, k), assumed_align=16)
    scale = row_major(cutlass.BFloat16, (g, sk, n), assumed_align=16)
    c = row_major(cutlass.Float16, (rows, n))
    d = row_major(cutlass.Float16, (rows, n), assumed_align=16)
    row_offsets = row_major(cutlass.Int32, (offs,))
    tile_offsets = row_major(cutlass.Int32, (offs,))
    gemm = port.GroupedMixedGemm(scale_only=mode == "scale_only")
    start = time.perf_counter()
    compiled = cute.compile(gemm, b, a, scale, c, d, row_offsets, tile_offsets,
                            cutlass.Float32(1.0), cutlass.Float32(0.0), cutlass.Int32(512),
                            cutlass.Int32(1), cuda.CUstream(0), options="--keep-cubin")
    seconds = time.perf_counter() - start
    cubins = sorted(out_dir.glob("*.cubin"), key=lambda p: p.stat().st_mtime)
    if not cubins:
        raise RuntimeError(f"cute.compile kept no cubin in {out_dir}")
    compiled.export_to_c(str(out_dir), "port", f"casebook_port_{mode}")
    from cutlass.cute.export import aot_config

    library = aot.link(out_dir / "port.o", out_dir / "libport.so",
                       Path(aot_config.get_libdir()) / "libcuda_dialect_runtime_static.a",
                       toolkit.CUDA_ROOT / "lib" / "libcudart_static.a")
    facts = {"mode": mode, "compile_seconds": seconds, "cubin": str(cubins[-1]),
             "dynamic_smem_bytes": int(gemm.storage.size_in_bytes()),
             "threads": port.THREADS, "stages": gemm.stages,
             "tile_nmk": list(gemm.tile), "compiled": type(compiled).__name__,
             "compiled_with": f"nvidia-cutlass-dsl "
                              f"{importlib.metadata.version('nvidia-cutlass-dsl')}",
             "sources_sha256": sources_sha256(), "library": str(library),
             "library_bytes": library.stat().st_size,
             "abi": aot.read_abi(out_dir / "port.h")}
    (out_dir / "port.json").write_text(json.dumps(facts, indent=1))
    return facts


def _carried(out_dir: Path) -> dict:
    """The export carried into ``out_dir``, if it was compiled from these sources."""
    made = out_dir / "port.json"
    facts = json.loads(made.read_text()) if made.exists() else {}
    if facts.get("sources_sha256") != sources_sha256() or not Path(facts["library"]).exists():
        raise RuntimeError(f"CuTe DSL is not installed here and {out_dir} holds no export of "
                           "these port sources: compile on a host with the DSL and carry "
                           f"{out_dir.parent.parent}/ here")
    return {**facts, "carried": True}


def _compiled_here(out_dir: Path) -> dict | None:
    """The export an earlier build on this host left in ``out_dir``, if it was compiled
    from these very sources by the CuTe DSL installed now; else None."""
    made = out_dir / "port.json"
    facts = json.loads(made.read_text()) if made.exists() else {}
    version = f"nvidia-cutlass-dsl {importlib.metadata.version('nvidia-cutlass-dsl')}"
    if (facts.get("sources_sha256") != sources_sha256() or facts.get("compiled_with") != version
            or not all(Path(facts[f]).exists() for f in ("library", "cubin"))):
        return None
    return {**facts, "carried": False, "reused": True}


def _compile(mode: str, out_dir: Path) -> dict:
    for stale in [*out_dir.glob("*.cubin"), out_dir / "port.json"]:
        stale.unlink(missing_ok=True)
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_DUMP_DIR": str(out_dir),
           "CUTE_DSL_CACHE_DIR": str(out_dir / "cache"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", __name__, mode, str(out_dir)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode:
        raise RuntimeError(f"CuTe DSL compile for {mode} exited {done.returncode}: "
                           f"{(done.stdout + done.stderr).strip()[-3000:]}")
    return {**json.loads((out_dir / "port.json").read_text()), "carried": False,
            "reused": False}


@functools.cache
def build(mode: str, build_dir: str) -> dict:
    """Compile and export the port for ``mode`` in a child process (or take the carried
    export where CuTe DSL is not installed); its facts and the cubin's. Builds of several
    points run at once: one compiles under a lock on the folder, the others then take its
    export (``reused``), made from the same sources by the same DSL."""
    out_dir = Path(build_dir) / "cute_dsl" / mode
    if dsl_installed():
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            facts = _compiled_here(out_dir) or _compile(mode, out_dir)
    else:
        facts = _carried(out_dir)
    cubin = Path(facts["cubin"])
    (kernel,) = toolkit.kernel_resources(cubin, KERNEL_NAME)
    return {**facts, **kernel, "sass_mma": toolkit.mma_instructions(cubin, KERNEL_NAME)}


if __name__ == "__main__":
    compile_port(sys.argv[1], Path(sys.argv[2]))
