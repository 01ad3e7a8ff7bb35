"""The pinned CUDA tools (from the lock's nvidia-* wheels) and what cuobjdump reads.

nvcc 13.0 (nvidia-cuda-nvcc) builds case 03's C++ reference; cuobjdump and nvdisasm read
the cubins of case 03's builds and of case 01's compiled reference. A host without them
gets None from ``tool`` and says so in its records.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

try:
    import nvidia
except ImportError:  # a host without the lock's CUDA wheels (the TPU host)
    nvidia = None

# Where the nvidia-cuda-* wheels land; None where they are not installed.
CUDA_ROOT = Path(next(iter(nvidia.__path__))) / "cu13" if nvidia else None
SASS_MMA = re.compile(r"\bHGMMA\.[0-9A-Za-z_.]+")  # wgmma as it appears in SASS
RESOURCES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def tool(name: str) -> Path | None:
    """The pinned wheel's ``name`` (nvcc, cuobjdump, nvdisasm), else one on PATH, else None."""
    pinned = CUDA_ROOT / "bin" / name if CUDA_ROOT else None
    if pinned and pinned.exists():
        return pinned
    found = shutil.which(name)
    return Path(found) if found else None


def run(args: list[str | Path], **kwargs) -> str:
    """stdout of a tool run; a non-zero exit raises with its stderr."""
    # The pinned tools first; a host's own CUDA (e.g. the nvdisasm cuobjdump calls) after.
    found = os.environ.get("PATH") or "/usr/bin:/bin"
    search = f"{CUDA_ROOT / 'bin'}:{found}" if CUDA_ROOT else found
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          env={"PATH": search}, **kwargs)
    if done.returncode:
        raise RuntimeError(f"{Path(args[0]).name} exited {done.returncode}: "
                           f"{done.stderr.strip()[-2000:]}")
    return done.stdout


def kernel_resources(binary: Path, name_contains: str) -> list[dict]:
    """Registers, stack, static shared and local memory of every kernel whose (mangled)
    name contains ``name_contains``, from ``cuobjdump -res-usage``."""
    out = run([tool("cuobjdump"), "-res-usage", binary])
    return [{"kernel": name, "registers_per_thread": int(reg), "stack_bytes": int(stack),
             "static_smem_bytes": int(shared), "local_bytes": int(local)}
            for name, reg, stack, shared, local in RESOURCES.findall(out)
            if name_contains in name]


def mma_instructions(binary: Path, name_contains: str) -> dict[str, int]:
    """Count of each HGMMA (wgmma) form in the SASS of the matching kernels."""
    out = run([tool("cuobjdump"), "-sass", binary])
    counts: dict[str, int] = {}
    for function in out.split("\t\tFunction : ")[1:]:
        if name_contains in function.split("\n", 1)[0]:
            for form in SASS_MMA.findall(function):
                counts[form] = counts.get(form, 0) + 1
    return counts
