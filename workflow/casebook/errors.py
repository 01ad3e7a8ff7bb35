"""The one error type the pipeline raises for bad input, and how scripts report it."""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterator


class CasebookError(Exception):
    """Bad input: names the file and the key so the user can fix it."""

    def __init__(self, path: object, key: str | None, message: str):
        self.path, self.key, self.message = str(path), key, message
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {message}")


@contextlib.contextmanager
def reported(log_path: str) -> Iterator[None]:
    """Send stderr to the log; a CasebookError becomes one line on both, exit status 1."""
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
