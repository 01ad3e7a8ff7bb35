"""Versioned JSON records: written atomically, read back only through the schema.

Every record carries ``schema_version``, ``kind``, ``created_at`` and the project
``commit``. A record newer or older than this code's schema is refused, as asv refuses
results files it cannot read, rather than guessed at.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

from casebook.core import files, paths, provenance
from casebook.core.errors import CasebookError

SCHEMA_VERSION = 1
# How a time or baseline record's not_timed_reason begins when a guard refused the
# measurement (written by casebook.stages.timing, read by casebook.report.verdict).
REFUSED = "not measurable"


@functools.cache
def _schema_document() -> dict[str, Any]:
    return files.load_yaml(paths.RECORD_SCHEMA.read_text())


@functools.cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    document = _schema_document()
    if kind not in document["$defs"]:
        raise CasebookError(paths.RECORD_SCHEMA, f"$defs.{kind}", "no such record kind")
    schema = {**document, "$ref": f"#/$defs/{kind}"}
    return jsonschema.Draft202012Validator(schema)


def _first_error(kind: str, data: Any) -> jsonschema.ValidationError | None:
    return jsonschema.exceptions.best_match(_validator(kind).iter_errors(data))


def _field(error: jsonschema.ValidationError) -> str:
    location = ".".join(str(part) for part in error.absolute_path)
    if error.validator == "required":
        missing = error.message.split("'")[1]
        location = f"{location}.{missing}" if location else missing
    return location or "(top level)"


def check(path: object, kind: str, data: Any) -> None:
    """Raise a CasebookError naming ``path`` and the first offending field."""
    error = _first_error(kind, data)
    if error is not None:
        raise CasebookError(path, _field(error), error.message)


def made() -> dict[str, str]:
    """When, and at which commit, a record (or a benchmark's result) is made now."""
    return {"created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "commit": provenance.commit()}


def stamp(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The record ``body`` with the fields every record carries."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, **made(), **body}


def write(path: str | Path, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """Stamp, validate and atomically write one record; returns what was written."""
    record = stamp(kind, body)
    check(path, kind, record)
    files.atomic_write_text(path, json.dumps(record, indent=2, sort_keys=False) + "\n")
    return record


def recovery(path: str | Path) -> str:
    """What to do about a broken record: the exact commands."""
    return (f"to make it again: rm {path} && snakemake --cores all (a record committed from "
            f"another machine: git checkout -- {path})")


def read(path: str | Path, kind: str) -> dict[str, Any]:
    """Load one record, refusing a missing, corrupt, foreign or off-schema file; the error
    of a corrupt one says how to recover."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise CasebookError(path, None, f"missing {kind} record") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise CasebookError(path, None, f"corrupt or truncated JSON ({error}); "
                            f"{recovery(path)}") from None
    if not isinstance(data, dict):
        raise CasebookError(path, None, f"a record must be a JSON object; {recovery(path)}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise CasebookError(
            path, "schema_version",
            f"is {version!r}; this code reads version {SCHEMA_VERSION}: regenerate the record",
        )
    if data.get("kind") != kind:
        raise CasebookError(path, "kind", f"is {data.get('kind')!r}, expected {kind!r}")
    check(path, kind, data)
    return data
