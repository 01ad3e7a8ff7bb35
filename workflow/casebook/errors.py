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

# How often a job looks for its Snakemake process: a killed run's jobs end within this.
PARENT_POLL_S = 1.0


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


def _end_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)  # records are written whole or not at all


def end_with_parent() -> None:
    """End this process when the one that started it (the Snakemake run) is gone: a
    killed run leaves no job writing records after it."""
    threading.Thread(target=_end_with, args=(os.getppid(),), daemon=True,
                     name="end-with-parent").start()


@contextlib.contextmanager
def reported(log_path: str) -> Iterator[None]:
    """Send stderr to the log; a CasebookError becomes one line on both, exit status 1.
    The job ends with its Snakemake process (``end_with_parent``)."""
    end_with_parent()
    with open(log_path, "w") as log, contextlib.redirect_stderr(log):
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
