"""Both GPU builds of case 03 made here and packed for a GPU host that cannot make them.

    python -m kernels.grouped_gemm_fp8_bf16.prebuild build/grouped_gemm_fp8_bf16 BUNDLE.tar.xz

Run from the repository root; on the host, ``tar -xJf BUNDLE.tar.xz`` there.
"""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

from kernels.grouped_gemm_fp8_bf16 import compile_port, upstream
from kernels.grouped_gemm_fp8_bf16.problems import MODES


def prebuild(build_dir: str, bundle: Path) -> list[str]:
    """Compile both GPU builds here (the port exported, example 69 with the pinned nvcc)
    and pack what a GPU host runs them from into ``bundle`` (.tar.xz, paths as under the
    repository): with it the host compiles nothing and needs neither CuTe DSL nor nvcc."""
    files = []
    for mode in MODES:
        facts = compile_port.build(mode, build_dir)
        folder = Path(facts["library"]).parent
        files += [facts["library"], facts["cubin"], str(folder / "port.json"),
                  str(folder / "port.h")]
    built = upstream.build(build_dir)
    if not built["built"]:
        raise RuntimeError(f"example 69 is not built here: {built['reason']}")
    folder = Path(built["binary"]).parent
    files += [built["binary"], built["library"], str(folder / "compile.json")]
    bundle.parent.mkdir(parents=True, exist_ok=True)
    names = [os.path.relpath(name) for name in files]
    if any(name.startswith("..") for name in names):
        raise ValueError(f"{build_dir}: run from the repository root, the build under it")
    partial = bundle.with_name(f".{bundle.name}.partial")
    with tarfile.open(partial, "w:xz") as tar:
        for name in names:
            tar.add(name, recursive=False)
    partial.replace(bundle)
    return files


if __name__ == "__main__":
    prebuild(sys.argv[1], Path(sys.argv[2]))
