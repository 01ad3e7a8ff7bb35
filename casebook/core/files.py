"""The project's files at the lowest level: YAML's safe subset read fast, and text written
so that no reader ever sees half of it. Imported by config and records alike, it imports
neither."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from casebook.core import errors


def load_yaml(text: str) -> Any:
    """YAML's safe subset, parsed by libyaml where PyYAML has it: every job reads the
    schemas and a case config, and the pure-Python parser took a tenth of a second of each
    job's startup (``config.read_yaml`` words a user's syntax error with the pure-Python
    one)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary file beside ``path``, then rename: never half-written, and
    never by a job whose Snakemake run is gone (killed: its outputs are incomplete)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        if errors.run_gone():
            raise SystemExit(f"casebook: not writing {path}: this job's Snakemake run is gone")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
