"""The pipeline's time across commits, drawn from benchmarks/results/pipeline_time*.json
(what benchmarks/pipeline_time.py records) into docs/pipeline-time.md, between its
markers: the history is generated, never hand-kept.

    .venv/bin/python -m benchmarks.pipeline_history          # rewrite the table
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from casebook.core import files, paths

DOC = paths.SOURCE_ROOT / "docs" / "pipeline-time.md"
BEGIN, END = "<!-- pipeline_time: begin (benchmarks/pipeline_history.py) -->", \
    "<!-- pipeline_time: end -->"
TARGETS = {"cold": 600, "noop": 3, "change": 60}  # issue 46's, in seconds


def _when(record: dict) -> str:
    """When the run was made: its record's date, else its commit's (older records)."""
    if record.get("created_at"):
        return record["created_at"]
    found = subprocess.run(["git", "-C", str(paths.SOURCE_ROOT), "show", "-s",
                            "--format=%cI", record["commit"].removesuffix("-dirty")],
                           capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else ""


def _seconds(value: float | None, target: float | None = None) -> str:
    if value is None:
        return "—"
    text = f"{value:,.0f} s" if value >= 100 else f"{value:.1f} s"
    return f"**{text}** (over {target:g} s)" if target is not None and value > target else text


def _probe(record: dict) -> str:
    """The host's speed around the run: the calibration workload's median before and
    after, in µs (a slower host reads higher; records before it was measured: —)."""
    probe = record.get("host_probe_s")
    if not probe:
        return "—"
    return "–".join(f"{probe[k] * 1e6:.0f}" for k in ("before", "after"))


def table(results: Path = paths.BENCHMARK_RESULTS) -> str:
    """One row per recorded run, oldest first."""
    runs = []
    for path in sorted(results.glob("pipeline_time*.json")):
        record = json.loads(path.read_text())
        runs.append((_when(record), path.name, record))
    rows = ["| when | commit | cores | host probe, µs | cold run, wall | cold run, CPU | jobs "
            "| no-op rerun | one-point change | record |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for when, name, r in sorted(runs, key=lambda run: (run[0], run[1])):
        cold, change = r["cold_run"], r.get("one_point_change") or {}
        rows.append(
            f"| {when[:16].replace('T', ' ') or '—'} | {r['commit'][:7]}"
            f"{'-dirty' if r['commit'].endswith('-dirty') else ''} | {r['cores']} "
            f"| {_probe(r)} "
            f"| {_seconds(cold['wall_s'], TARGETS['cold'])} | {_seconds(cold['cpu_s'])} "
            f"| {cold['jobs']} | {_seconds(r.get('noop_rerun_wall_s'), TARGETS['noop'])} "
            f"| {_seconds(change.get('wall_s'), TARGETS['change'])} "
            f"| `benchmarks/results/{name}` |")
    return "\n".join(rows)


def block(doc: str) -> str:
    """The generated part of ``doc`` (between the markers)."""
    return doc[doc.index(BEGIN) + len(BEGIN):doc.index(END)].strip("\n")


def main() -> None:
    doc = DOC.read_text()
    head, tail = doc[:doc.index(BEGIN) + len(BEGIN)], doc[doc.index(END):]
    files.atomic_write_text(DOC, f"{head}\n{table()}\n{tail}")
    print(DOC)


if __name__ == "__main__":
    main()
