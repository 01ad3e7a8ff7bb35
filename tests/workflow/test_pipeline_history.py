"""docs/pipeline-time.md's history table is generated from the benchmark's records
(benchmarks/pipeline_history.py), never hand-kept."""

from __future__ import annotations

import json

from benchmarks import pipeline_history


def test_the_docs_table_is_the_one_the_records_give():
    assert pipeline_history.block(pipeline_history.DOC.read_text()) == pipeline_history.table()


def test_a_run_over_its_target_is_marked_and_runs_are_ordered_by_date(tmp_path):
    def record(name, when, wall, noop, change, **probe):
        (tmp_path / f"pipeline_time_{name}.json").write_text(json.dumps({
            "created_at": when, "commit": name * 40, "cores": 2,
            "cold_run": {"wall_s": wall, "cpu_s": 2 * wall, "jobs": 9},
            "noop_rerun_wall_s": noop, "one_point_change": {"wall_s": change},
            **({"host_probe_s": probe} if probe else {})}))

    record("b", "2026-12-02T10:00:00+00:00", 599.4, 3.5, 60.2, before=143.4e-6,
           after=306.2e-6)
    record("a", "2026-12-03T10:00:00+00:00", 612.0, 2.0, None)
    rows = pipeline_history.table(tmp_path).splitlines()[2:]
    assert [row.split(" | ")[1] for row in rows] == ["b" * 7, "a" * 7]
    assert "| 2 | 143–306 | 599 s |" in rows[0] and "**3.5 s** (over 3 s)" in rows[0]
    assert "**60.2 s** (over 60 s)" in rows[0]
    assert "| 2 | — | **612 s** (over 600 s)" in rows[1] and rows[1].count("—") == 2
