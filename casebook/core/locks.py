"""The project's hash-pinned locks (uv-compiled requirements), read by one parser: the
environment record compares their versions with what is installed, the wheelhouse
carries their wheels. Standard library only: the offline host's installer reads them
before anything is installed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from casebook.core.errors import CasebookError

_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
_VIA = re.compile(r"^\s+#\s+(?:via\s+)?(\S.*)$")


def normalize(name: str) -> str:
    """PEP 503 name normalisation, so ``PyYAML`` and ``pyyaml`` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Pin:
    """One locked package: its version, hashes, and who requires it (``-r`` for the .in)."""

    name: str
    version: str
    hashes: list[str] = field(default_factory=list)
    via: set[str] = field(default_factory=set)

    def requirement(self) -> str:
        hashes = "".join(f" \\\n    --hash={h}" for h in self.hashes)
        return f"{self.name}=={self.version}{hashes}\n"


def read_lock(path: Path) -> dict[str, Pin]:
    """A uv-compiled lock with hashes and ``# via`` annotations, by normalised name; a
    line that is no entry, an entry without a hash, or a lock without one entry is
    refused, naming the line or the package."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise CasebookError(path, None, "lock file not found") from None
    pins: dict[str, Pin] = {}
    current = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if match := _ENTRY.match(line):
            current = pins.setdefault(normalize(match[1]), Pin(normalize(match[1]), match[2]))
        elif current is None or not line[0].isspace():
            if not line.startswith("#"):
                raise CasebookError(path, f"line {number}", f"not a lock entry: {line!r}")
            continue
        current.hashes += _HASH.findall(line)
        if (via := _VIA.match(line)) and not line.strip().startswith("--"):
            current.via.add("-r" if via[1].startswith("-r ") else normalize(via[1]))
    if not pins:
        raise CasebookError(path, None, "lock pins no package")
    for pin in pins.values():
        if not pin.hashes:
            raise CasebookError(path, pin.name, "pinned without a hash")
    return pins


def versions(path: Path) -> dict[str, str]:
    """``{package: version}`` pinned by the lock at ``path``."""
    return {name: pin.version for name, pin in read_lock(path).items()}
