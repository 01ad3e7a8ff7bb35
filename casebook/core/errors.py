"""The one error type the pipeline raises for bad input, and how scripts report it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

# How often a job looks for its Snakemake process: a killed run's jobs end within this.
PARENT_POLL_S = 1.0
# The Snakemake process whose jobs these are; its jobs inherit it (rules/common.smk).
RUN_PID = "CASEBOOK_RUN_PID"


def shown(path: object) -> str:
    """``path`` as the user would type it: relative to the current directory where it lies
    inside it (an absolute path elsewhere, or a label such as ``--config``, unchanged)."""
    text = str(path)
    if os.path.isabs(text):
        try:
            relative = os.path.relpath(text)
        except (OSError, ValueError):  # no current directory, or another drive
            return text
        if relative != os.pardir and not relative.startswith(os.pardir + os.sep):
            return relative
    return text


class CasebookError(Exception):
    """Bad input: names the file and the key so the user can fix it."""

    def __init__(self, path: object, key: str | None, message: str):
        self.path, self.key, self.message = shown(path), key, message
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {message}")


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped has)."""
    import psutil  # not at the top: the GPU host's bundle installer imports this module

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run_gone() -> bool:
    """Whether the Snakemake run whose job this is (``RUN_PID``) has ended."""
    run = os.environ.get(RUN_PID)
    return run is not None and gone(int(run))


def _end_with(run: int, parent: int) -> None:
    while not gone(run) and os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)  # records are written whole or not at all


_ENDING: list[bool] = []


def end_with_run() -> None:
    """End this process when the Snakemake run that started it is gone: a killed run
    leaves no job writing records after it. The run is the process named in ``RUN_PID``
    (set by the workflow, so a run killed while its job was still starting up counts),
    else this process's parent."""
    if _ENDING:  # a process that runs jobs in turn (casebook.run.chip_holder) watches once
        return
    _ENDING.append(True)
    parent = os.getppid()
    run = int(os.environ.get(RUN_PID, parent))
    threading.Thread(target=_end_with, args=(run, parent), daemon=True,
                     name="end-with-run").start()


@contextlib.contextmanager
def reported(job: Any) -> Iterator[None]:
    """Run a Snakemake script's work (``job``: its ``snakemake`` object) with stderr in the
    job's log; a CasebookError becomes one line on both, exit status 1. The log ends with
    the job's profile (``jobprofile``). The job ends with its run (``end_with_run``)."""
    from casebook.core import jobprofile

    end_with_run()
    entered = time.time()
    # Line-buffered: a job killed at its budget (SIGTERM flushes nothing) keeps its lines.
    with open(job.log[0], "w", buffering=1) as log, contextlib.redirect_stderr(log):
        try:
            yield
        except CasebookError as error:
            line = f"casebook: error: {error}\n"
            log.write(line)
            sys.__stderr__.write(line)
            raise SystemExit(1) from None
        except Exception:
            traceback.print_exc()  # into the log; the exception still ends the job
            raise
        finally:
            log.write(jobprofile.line(job.rule, entered, getattr(job, "threads", 1)))
