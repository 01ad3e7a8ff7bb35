"""Which of an earlier window's records a continuing window may keep (gpu_window
``--continue``): those still current at this tree, whatever commit made them.

A record of this tree's commit is current. A record of another commit is current when it
was made from what this tree would make it from: its ``sources_sha256`` (the case's kernel
sources and the job's slice of the case config, ``provenance.job_sha256``) equals the one
recomputed here. A baseline, compare or bit-exact record carries no hash of its own; it is current
when its commit's hashed records of the same case all are (its case's kernel sources are
then this tree's). The host's own records (env, host, noise floor, the window's) describe
the machine and are kept. Anything else of another commit is not current: Snakemake
redoes it.

Whatever its commit, a record made with a tile choice is current only while its point's
tile_choice record is that one still (``tile_table.cites_current``), and one made with
none only while the point has none: a point measured at the kernel's default blocks before the
autotune picked its own is measured again at the picked ones.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from casebook.core import config, paths, provenance
from casebook.stages import tile_table

HOST_KINDS = ("env", "host", "noise_floor", "gpu_window")
UNHASHED_CASE_KINDS = ("baseline", "compare", "bit_exact")


def recomputed(record: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """The ``sources_sha256`` this tree gives ``record``'s job (None: a kind carrying none)."""
    kind = record["kind"]
    if kind in ("verify", "time", "tile_choice", "tile_candidate", "lowering"):
        return provenance.job_sha256(spec, record["variant"], record["point"])
    if kind == "build":
        return provenance.job_sha256(spec, record["variant"])
    if kind in ("check_power", "check_power_trial"):
        return provenance.job_sha256(spec, point=record["point"])
    if kind == "ablation":
        return provenance.job_sha256(spec, record["of"], record["point"],
                                     ablation=record["ablation"])
    return None


def _hashed_current(record: dict[str, Any], spec: dict[str, Any]) -> bool:
    if record["kind"] == "lowerings":
        return all(_hashed_current({**part, "kind": "lowering"}, spec)
                   for part in record["lowerings"])
    want = recomputed(record, spec)
    return want is not None and record.get("sources_sha256") == want


def _tiles_current(record: dict[str, Any], target: str) -> bool:
    """Whether every tile-table row ``record``'s kernels ran with is the table's row now."""
    kind, case = record["kind"], record.get("case")
    if kind in ("verify", "time"):
        return tile_table.cites_current(record, target, case, record["variant"])
    if kind == "ablation":
        return tile_table.cites_current(record, target, case, record["of"])
    if kind in ("build", "lowering", "lowerings"):  # each point's part as built
        if kind == "build":
            parts = record["points"]
        elif kind == "lowering":
            parts = [record["built"]]
        else:
            parts = [part["built"] for part in record["lowerings"]]
        return all(tile_table.cites_current(part, target, case, record["variant"])
                   for part in parts)
    if kind == "compare":
        cited = record.get("tile_tables", {})
        return all(tile_table.cites_current(
            {"point": record["point"], "params": record["params"],
             **({"tile_table": cited[v]} if v in cited else {})}, target, case, v)
            for v in {p["variant"] for p in record["pairs"] if "why_not" not in p})
    return True


def not_current(target: str, commit: str) -> list[Path]:
    """The record files under results/<target>/ (logs and the store across commits aside)
    that are not current at this tree, whose commit is ``commit``; each with its samples."""
    root = Path(paths.target_dir(target))
    found: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(root.rglob("*.json")):
        if path.relative_to(root).parts[0] in ("logs", "history"):
            continue
        found.append((path, json.loads(path.read_text())))
    specs: dict[str, dict[str, Any]] = {}

    def spec(case: str) -> dict[str, Any]:
        if case not in specs:
            case_dir = paths.SOURCE_ROOT / config.load_global()["case_dir"]
            specs[case] = paths.for_target(config.load_case(case_dir, case), target)
        return specs[case]

    verdicts: dict[tuple[str, str], list[bool]] = defaultdict(list)
    stale = []
    for path, record in found:
        if not _tiles_current(record, target):
            stale.append(path)
            continue
        if record["commit"] == commit or record["kind"] in HOST_KINDS \
                or record["kind"] in UNHASHED_CASE_KINDS:
            continue
        current = "case" in record and _hashed_current(record, spec(record["case"]))
        verdicts[record["commit"], record.get("case")].append(current)
        if not current:
            stale.append(path)
    for path, record in found:
        if record["commit"] != commit and record["kind"] in UNHASHED_CASE_KINDS \
                and path not in stale:
            seen = verdicts.get((record["commit"], record["case"]))
            if not seen or not all(seen):
                stale.append(path)
    return [file for path in sorted(stale) for file in _with_samples(path)]


def _with_samples(record: Path) -> list[Path]:
    stem = record.name.removesuffix(".json")
    table, folder = record.with_name(f"{stem}.samples.csv"), record.with_name(f"{stem}.samples")
    return [record, *([table] if table.is_file() else []),
            *(sorted(folder.rglob("*")) if folder.is_dir() else [])]
