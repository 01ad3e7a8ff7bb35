"""The C++ reference: CUTLASS example 69 and our harness, compiled once with nvcc.

``ex69_harness.cu`` includes the example's source from the pinned nvidia-cutlass wheel
(its ``main`` renamed) and reuses its kernel types, so the binary runs exactly the
example's kernels. A compile takes ~90-120 s and ~5 GB, so the binary is cached under
the build tree by a hash of everything that determines it: the harness, the example's
sources, the wheel's version, the flags and ``nvcc --version``, and kept per user by the
same key (``user_cache``), where a fresh clone finds it. A host whose nvcc differs
from the one that built a cached binary of the same sources (an offline GPU host given
the build made where the pinned nvcc is) uses that binary rather than compiling, and
its facts name the nvcc that built it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import time
from pathlib import Path

from kernels import cuda_toolkit as toolkit

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "ex69_harness.cu"
CUTLASS_SOURCE = Path(__import__("cutlass_library").__file__).parent / "source"
EXAMPLE_DIR = CUTLASS_SOURCE / "examples" / "69_hopper_mixed_dtype_grouped_gemm"
EXAMPLE = EXAMPLE_DIR / "69_hopper_mixed_dtype_grouped_gemm.cu"
# The example's own helpers, hashed with it (the CUTLASS headers are pinned by the version).
EXAMPLE_SOURCES = (EXAMPLE, EXAMPLE_DIR / "grouped_mixed_dtype_utils.hpp",
                   CUTLASS_SOURCE / "examples/55_hopper_mixed_dtype_gemm/mixed_dtype_utils.hpp")
# CUTLASS's release flags for an sm_90a example (-DNDEBUG as its CMake Release build).
FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "-gencode", "arch=compute_90a,code=sm_90a",
         "--expt-relaxed-constexpr", "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1")
PIC = ("-Xcompiler", "-fPIC")  # one object serves the executable and the shared library
LINK_FLAGS = ("-gencode", "arch=compute_90a,code=sm_90a")
INCLUDES = ("include", "tools/util/include", "examples/common",
            "examples/69_hopper_mixed_dtype_grouped_gemm")
# The two grouped kernels' mangled names differ in the mainloop's element of B: ScaleOnly
# takes a (e5m2, bf16 scale) tuple. The example's dense check GEMM matches neither.
KERNEL_NAMES = {"convert_only": "float_e5m2_tEEEEPNS",
                "scale_only": "float_e5m2_tENS_10bfloat16_tEEEEPNS"}
TIMEOUT_S = 1800
NVCC = toolkit.tool("nvcc")


def nvcc_version(nvcc: Path | None) -> str | None:
    """The last line of ``nvcc --version`` (its build id), or None without an nvcc."""
    if nvcc is None or not nvcc.exists():
        return None
    return toolkit.run([nvcc, "--version"]).strip().splitlines()[-1]


def sources_key() -> str:
    """What the binary is made from, whichever nvcc compiles it."""
    digest = hashlib.sha256()
    for part in (HARNESS.read_bytes(), *(p.read_bytes() for p in EXAMPLE_SOURCES),
                 importlib.metadata.version("nvidia-cutlass").encode(),
                 " ".join((*FLAGS, *PIC, *LINK_FLAGS)).encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def cache_key(version: str) -> str:
    return hashlib.sha256(f"{sources_key()} {version}".encode()).hexdigest()[:16]


def _cached(folder: Path) -> dict | None:
    facts_file = folder / "compile.json"
    if not (facts_file.exists() and (folder / "ex69_harness").exists()):
        return None
    return {**json.loads(facts_file.read_text()), "cached": True}


def user_cache() -> Path:
    """Builds kept for every clone of this user: $CASEBOOK_CACHE, else
    $XDG_CACHE_HOME/casebook, else ~/.cache/casebook; ``ex69/<cache_key>`` in it."""
    if os.environ.get("CASEBOOK_CACHE"):
        return Path(os.environ["CASEBOOK_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "casebook"


def _settled(final: Path, source: Path) -> None:
    """``source`` copied to ``final`` through a partial folder renamed when complete (never
    half a cache); a complete ``final`` (another process's) is left as it is."""
    if _cached(final) is not None:
        return
    partial = final.with_name(f"{final.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    shutil.rmtree(final, ignore_errors=True)  # an incomplete one
    try:
        partial.rename(final)
    except OSError:  # settled meanwhile by another process
        shutil.rmtree(partial, ignore_errors=True)
        if _cached(final) is None:
            raise


def _from_user_cache(final: Path) -> dict | None:
    """The user's cached build of this key, copied into ``final`` (a build tree stays whole
    on its own: the GPU host's bundle packs it), its facts naming the copies."""
    kept = user_cache() / "ex69" / final.name
    if _cached(kept) is None:
        return None
    _settled(final, kept)
    facts_file = final / "compile.json"
    facts = {**json.loads(facts_file.read_text()), "binary": str(final / "ex69_harness"),
             "library": str(final / "libex69.so")}
    facts_file.write_text(json.dumps(facts, indent=1))
    return {**facts, "cached": True}


def _keep_for_user(final: Path) -> None:
    """A fresh build, kept for the user's other clones; a home that cannot hold it keeps
    nothing (the build tree still has it)."""
    with contextlib.suppress(OSError):
        _settled(user_cache() / "ex69" / final.name, final)


def _built_by_another_nvcc(build_dir: str) -> dict | None:
    """A cached build of these sources by any nvcc (e.g. carried from the pinned one)."""
    key = sources_key()
    for folder in sorted((Path(build_dir) / "ex69").glob("*")):
        facts = _cached(folder)
        if facts is not None and facts.get("sources") == key:
            return facts
    return None


def compile_commands(nvcc: Path, folder: Path) -> list[list[str | Path]]:
    """Compile the harness once (position-independent), then link it twice: the
    executable (files in, D out; --resources) and libex69.so (the launch on device
    buffers and a stream, for timing). The pinned wheels' cudart where they are installed;
    a host nvcc without them links its own toolkit's."""
    obj = folder / "ex69_harness.o"
    lib_dir = [f"-L{toolkit.CUDA_ROOT / 'lib'}"] if toolkit.CUDA_ROOT else []
    return [[nvcc, *FLAGS, *PIC, *(f"-I{CUTLASS_SOURCE / d}" for d in INCLUDES),
             "-c", HARNESS, "-o", obj],
            [nvcc, *LINK_FLAGS, *lib_dir, obj, "-o", folder / "ex69_harness"],
            [nvcc, *LINK_FLAGS, "-shared", *lib_dir, obj, "-o", folder / "libex69.so"]]


@functools.cache
def build(build_dir: str, nvcc: Path | None = NVCC) -> dict:
    """The harness binary and library (compiled or found in the cache) and their
    resources, or why not."""
    version = nvcc_version(nvcc)
    final = Path(build_dir) / "ex69" / cache_key(version or "")
    found = ((_cached(final) or _from_user_cache(final)) if version else None) \
        or _built_by_another_nvcc(build_dir)
    if found is not None:
        return found
    if version is None:
        return {"built": False, "reason": f"nvcc not found ({nvcc or 'not installed'}): the "
                                          "C++ reference is not built on this host"}
    binary, facts_file = final / "ex69_harness", final / "compile.json"
    partial = final.with_suffix(".partial")  # renamed when complete: never half a cache
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    start = time.perf_counter()
    for command in compile_commands(nvcc, partial):
        toolkit.run(command, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - start
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    facts = {"built": True, "binary": str(binary), "library": str(final / "libex69.so"),
             "nvcc": version, "sources": sources_key(), "compile_seconds": seconds,
             "flags": list(FLAGS),
             "kernels": _resources(binary)}
    facts_file.write_text(json.dumps(facts, indent=1))
    _keep_for_user(final)
    return {**facts, "cached": False}


def _resources(binary: Path) -> dict[str, dict]:
    """Per mode: registers (cuobjdump), dynamic shared memory, threads and stages (the
    harness's --resources, host code only), and the wgmma forms in the SASS."""
    per_mode = {}
    for line in toolkit.run([binary, "--resources"]).splitlines():
        mode, *pairs = line.split()
        per_mode[mode] = {k: int(v) for k, v in zip(pairs[::2], pairs[1::2], strict=True)}
    for mode, name in KERNEL_NAMES.items():
        (kernel,) = toolkit.kernel_resources(binary, name)
        per_mode[mode].update(kernel, sass_mma=toolkit.mma_instructions(binary, name))
    return per_mode
