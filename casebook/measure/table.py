"""The raw-samples table kept beside every time/baseline record, and reading it back."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from casebook import records
from casebook.errors import CasebookError

COLUMNS = ("sample", "input_set", "seconds", "host_seconds", "kernel_seconds",
           "launch_overhead_seconds", "kernels", "unseen_seconds", "sm_clock_mhz",
           "clock_event_reasons", "discarded")


def write(path: str, rows: list[dict[str, Any]]) -> None:
    """Every sample, discarded ones included (``discarded`` says which); blanks are None."""
    table = io.StringIO()
    writer = csv.DictWriter(table, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if row[k] is None else row[k]) for k in COLUMNS} for row in rows)
    records.atomic_write_text(path, table.getvalue())


def kept_seconds(path: str | Path) -> list[float]:
    """The samples a summary was made from (throttled ones left out)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise CasebookError(path, None, "missing samples table") from None
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "seconds" not in reader.fieldnames:
        raise CasebookError(path, "seconds", "no such column in the samples table")
    try:
        return [float(row["seconds"]) for row in reader if row.get("discarded") != "True"]
    except (TypeError, ValueError) as error:
        raise CasebookError(path, "seconds", f"not a number ({error})") from None
