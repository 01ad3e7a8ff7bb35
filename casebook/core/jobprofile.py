"""What one job spent: starting up (interpreter, Snakemake's preamble, imports), working,
CPU (its own and its children's) and peak memory; the cores it held and when it ended.

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
JOB_STARTED = "CASEBOOK_JOB_STARTED"  # set by casebook.run.worker for the jobs it forks
JOB_CPU_S = "CASEBOOK_JOB_CPU_S"


def process_started() -> float:
    """When this process started (``time.time()``'s scale), to one clock tick: psutil adds
    the process's age to the boot time, which Linux gives in whole seconds, so its start
    is up to a second early (every job's startup read about 1.1 s longer than it was)."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(after_name[19])  # field 22, starttime: clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return psutil.Process().create_time()
    return time.time() - age


def line(rule: str, entered: float, threads: int = 1) -> str:
    """The profile of this process, whose job's work began at ``entered`` (time.time())
    and which held ``threads`` of the run's cores."""
    cpu = os.times()
    # A job forked by the run's worker (casebook.run.worker) counts from its own process's
    # start, and the CPU that process spent before it handed the job over.
    started = float(os.environ.get(JOB_STARTED) or process_started())
    before = float(os.environ.get(JOB_CPU_S, 0))
    return PREFIX + json.dumps({
        "rule": rule,
        "startup_s": round(entered - started, 3),
        "work_s": round(time.time() - entered, 3),
        "cpu_s": round(before + cpu.user + cpu.system + cpu.children_user
                       + cpu.children_system, 3),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "threads": threads,
        "ended_at": round(time.time(), 3),
    }) + "\n"


def read(log: Path) -> dict[str, Any] | None:
    """The profile a job's log ends with; None for a log without one (a job killed, or
    not a casebook script)."""
    for text in reversed(log.read_text(errors="replace").splitlines()):
        if text.startswith(PREFIX):
            return json.loads(text.removeprefix(PREFIX))
    return None
