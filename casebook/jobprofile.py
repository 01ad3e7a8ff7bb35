"""What one job spent: starting up (interpreter, Snakemake's preamble, imports), working,
CPU (its own and its children's) and peak memory.

Each job's log ends with one line (``line``); ``benchmarks/pipeline_time.py`` reads them
back (``read``) into the pipeline's profile per rule.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import psutil

PREFIX = "casebook: job profile "


def line(rule: str, entered: float) -> str:
    """The profile of this process, whose job's work began at ``entered`` (time.time())."""
    cpu = os.times()
    return PREFIX + json.dumps({
        "rule": rule,
        "startup_s": round(entered - psutil.Process().create_time(), 3),
        "work_s": round(time.time() - entered, 3),
        "cpu_s": round(cpu.user + cpu.system + cpu.children_user + cpu.children_system, 3),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }) + "\n"


def read(log: Path) -> dict[str, Any] | None:
    """The profile a job's log ends with; None for a log without one (a job killed, or
    not a casebook script)."""
    for text in reversed(log.read_text(errors="replace").splitlines()):
        if text.startswith(PREFIX):
            return json.loads(text.removeprefix(PREFIX))
    return None
