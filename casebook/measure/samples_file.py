"""The raw-samples table kept beside every time/baseline record, and reading its kept
samples back."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from casebook.core import files

COLUMNS = ("sample", "input_set", "seconds", "host_seconds", "kernel_seconds",
           "launch_overhead_seconds", "kernels", "unseen_seconds", "sm_clock_mhz",
           "clock_event_reasons", "discarded")


def write(path: str, rows: list[dict[str, Any]]) -> None:
    """Every sample, discarded ones included (``discarded`` says which); blanks are None."""
    table = io.StringIO()
    writer = csv.DictWriter(table, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if row[k] is None else row[k]) for k in COLUMNS} for row in rows)
    files.atomic_write_text(path, table.getvalue())


def write_interleaved(path: str, measured: dict[str, list[dict[str, Any]]]) -> None:
    """An interleaved measurement's samples: every workload's rows, named in ``subject``,
    with the ``round`` that pairs them."""
    table = io.StringIO()
    writer = csv.DictWriter(table, ("subject", "round", *COLUMNS), lineterminator="\n")
    writer.writeheader()
    for subject, rows in measured.items():
        writer.writerows({"subject": subject, "round": row["round"],
                          **{k: ("" if row[k] is None else row[k]) for k in COLUMNS}}
                         for row in rows)
    files.atomic_write_text(path, table.getvalue())


def kept(text: str) -> list[float]:
    """The kept (not discarded) samples' seconds of a samples table's ``text``."""
    return [float(row["seconds"]) for row in csv.DictReader(io.StringIO(text))
            if row["discarded"] != "True"]


def read_kept(path: str | Path) -> list[float]:
    """The kept samples of the table at ``path``."""
    with open(path) as handle:
        return kept(handle.read())
