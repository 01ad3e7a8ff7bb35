"""Condition 2 (software): the environment actually found, compared with its lock."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from casebook.core import locks, paths, provenance

# Settings read from the environment that change how JAX/XLA run (thread pool, devices).
RUNTIME_VARIABLES = ("PJRT_NPROC", "XLA_FLAGS", "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES")


def installed() -> dict[str, str]:
    """``{package: version}`` of every distribution this interpreter can import."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(locks.normalize(name), dist.version)
    return dict(sorted(found.items()))


def drift(locked: dict[str, str], found: dict[str, str],
          not_carried: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every locked package that is missing or at another version; a missing one that the
    offline GPU host's bundle leaves out on purpose says why (``not_carried``)."""
    out = []
    for name, version in locked.items():
        if found.get(name) != version:
            out.append({"package": name, "locked": version, "found": found.get(name)})
            if found.get(name) is None and name in (not_carried or {}):
                out[-1]["not_carried"] = not_carried[name]
    return out


def _tool_version(tool: str) -> str | None:
    exe = shutil.which(tool)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return lines[-1].strip() if lines else None


def capture(lock_platform: str, target: str = "cpu") -> dict[str, Any]:
    """The environment record body for the lock of ``lock_platform`` (cpu or cuda), on a
    host of ``target`` (an offline accelerator host's drift says what its bundle leaves
    out on purpose)."""
    lock = paths.lock_file(lock_platform)
    references = locks.versions(paths.REFERENCE_LOCK)
    locked = {**locks.versions(lock), **references}
    found = installed()
    from casebook.hosts.wheelhouse import HOST_OF_TARGET, HOSTS

    host = HOSTS.get(HOST_OF_TARGET.get(target, ""))
    mismatches = drift(locked, found, host.not_carried if host else None)
    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": provenance.portable(sys.executable),
        },
        "os": {"platform": platform.platform(), "libc": " ".join(platform.libc_ver())},
        "lock": {
            "platform": lock_platform,
            "file": str(lock.relative_to(paths.SOURCE_ROOT)),
            "sha256": provenance.file_sha256(lock),
            "packages": len(locked) - len(references),
        },
        "reference_lock": {
            "file": str(paths.REFERENCE_LOCK.relative_to(paths.SOURCE_ROOT)),
            "sha256": provenance.file_sha256(paths.REFERENCE_LOCK),
            "packages": len(references),
        },
        "matches_lock": not mismatches,
        "drift": mismatches,
        "unlocked": sorted(set(found) - set(locked)),
        "packages": found,
        "tools": {"nvcc": _tool_version("nvcc")},
        "runtime_variables": {name: os.environ[name] for name in RUNTIME_VARIABLES
                              if name in os.environ},
    }


def run(lock_platform: str, target: str, out: str) -> dict[str, Any]:
    """The env stage: write this machine's environment record."""
    from casebook.core import records

    return records.write(out, "env", {"target": target, **capture(lock_platform, target)})
