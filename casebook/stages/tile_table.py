"""Tile choices on a target: made per point by the autotune rule, applied by build, verify
and time, gathered into the target's tile table for the page.

A point's tile choice is, in order:

1. the row the case config gives explicitly in the point's params;
2. else the tiles the autotune rule picked for this variant at this point on this target
   (its tile_choice record, ``paths.tile_choice_record``), applied by adding them to the
   params the kernel plug-in receives (the plug-in surface stays as it is: a kernel never
   learns the target);
3. else the kernel's own default (for splash attention: the shared-memory budget rule
   of ``port.tuning`` / ``port.backward_tuning``, or upstream's block size; for case 01:
   the tiles each GEMM variant chose by hand, ``port.VARIANTS``).

A job depends on its own point's tile_choice record, not on the others': a point's
choice being remade reruns that point alone. Every build, verify and time record says
which tile_choice record it used and its sha256 (the ``tile_table`` field, a row of the
target's table), so a record shows where its tiles came from. The table
(``paths.tile_table``, written by ``snakemake autotune``) lists every point's pick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from casebook.core import config, files, paths, provenance, records
from casebook.core.errors import CasebookError
from casebook.run import off_device

SCHEMA = paths.SCHEMA_DIR / "tile_table.schema.yaml"
CPU_REFUSAL = ("autotune measures tile candidates on an accelerator; target cpu would time "
               "the interpreter, which says nothing about a GPU's or a TPU's speed (run "
               "`snakemake autotune` on a GPU host, benchmarks/gpu_run.sh, or a TPU host, "
               "benchmarks/tpu_host.sh)")


def tuned_variants(spec: dict[str, Any], target: str) -> list[str]:
    """The variants whose tiles the autotune rule measures on ``target``: the case's
    ``autotune.variants`` on a GPU target, ``autotune.tpu_variants`` on a TPU one."""
    section = spec.get("autotune", {})
    return section.get("tpu_variants" if target in off_device.TPU_TARGETS else "variants", [])


def _without(params: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != key}


def apply(target: str, case: str, variant: str, point: str,
          params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``params`` with the tiles autotune picked for this point on ``target`` added (unless
    the config gives its own), and the provenance of the choice; ``(params, None)`` where
    none applies (no tile_choice record, or one whose candidates all failed)."""
    path = paths.tile_choice_record(target, case, variant, point)
    if not Path(path).exists():
        return params, None
    record = records.read(path, "tile_choice")
    for field, want in (("target", target), ("case", case), ("variant", variant),
                        ("point", point)):
        if record[field] != want:
            raise CasebookError(path, field, f"is {record[field]!r}, not {want!r}")
    if record["pick"] is None:
        return params, None
    key = record["key"]
    if _without(record["params"], key) != _without(params, key):
        raise CasebookError(path, "params", "tuned for other point params than the case "
                            "config's; rerun `snakemake autotune` on a host of this target")
    used = {"file": path, "sha256": provenance.file_sha256(path), "row": f"{variant}.{point}",
            "key": key, "tuned": record["pick"]["tiles"]}
    if key in params:
        return params, {**used, "applied": False,
                        "why": f"the case config gives `{key}` for this point"}
    return {**params, key: used["tuned"]}, {**used, "applied": True}


def cites_current(record: dict[str, Any], target: str, case: str, variant: str) -> bool:
    """Whether ``record`` of ``variant`` (a lowering, verification, time or ablation
    record, or one compare subject) cites the tile choice ``apply`` would give its point
    now (the same tile_choice record, byte for byte; none, where none applies)."""
    try:
        now = apply(target, case, variant, record["point"], record["params"])[1]
    except CasebookError:
        return False
    return record.get("tile_table") == now


def generate(target: str, case: str, record_paths: list[str], out: str) -> dict[str, Any]:
    """The table of ``target`` from its tile_choice records, written atomically; a record
    with no pick gives no row (its point runs the kernel's own choice) and is listed under
    ``unpicked`` with why."""
    rows: dict[str, dict[str, Any]] = {}
    unpicked: dict[str, dict[str, str]] = {}
    for record_path in sorted(record_paths):
        record = records.read(record_path, "tile_choice")
        if record["target"] != target or record["case"] != case:
            raise CasebookError(record_path, "target", f"is {record['target']}/"
                                f"{record['case']}, not {target}/{case}")
        if record["pick"] is None:
            unpicked.setdefault(record["variant"], {})[record["point"]] = (
                f"{record_path}: {record['reason']}")
            continue
        rows.setdefault(record["variant"], {})[record["point"]] = {
            "key": record["key"], record["key"]: record["pick"]["tiles"],
            "params": record["params"], "record": record_path,
            "record_sha256": provenance.file_sha256(record_path)}
    table = {"case": case, "target": target, "rows": rows,
             **({"unpicked": unpicked} if unpicked else {})}
    config.validate(out, table, SCHEMA)
    header = (f"# The tile table of {case} on {target}: generated by `snakemake autotune` "
              f"from the\n# tile_choice records it cites (do not edit; rerun the rule).\n")
    files.atomic_write_text(out, header + yaml.safe_dump(table, sort_keys=False))
    return table
