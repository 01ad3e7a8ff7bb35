"""A target's tile table: written by the autotune rule, applied by build, verify and time.

The table (``paths.tile_table``) maps variant -> point -> the tile row the autotune rule
picked (under the point key the case tunes, e.g. ``tiles``), with the point params it was
tuned for and its tile_choice record. A point's tile choice is, in order:

1. the row the case config gives explicitly in the point's params;
2. else this target's table row, applied by adding it to the params the kernel plug-in
   receives (the plug-in surface stays as it is: a kernel never learns the target);
3. else the kernel's own default (for splash attention: the shared-memory budget rule
   of ``port.tuning`` / ``port.backward_tuning``; for case 01: the tiles each GEMM
   variant chose by hand, ``port.VARIANTS``).

Every build, verify and time record says which table it used and its sha256 (the
``tile_table`` field), so a record shows where its tiles came from.
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


def read(path: str | Path) -> dict[str, Any]:
    """The table at ``path``, checked against its schema."""
    table = config.read_yaml(Path(path))
    config.validate(path, table, SCHEMA)
    return table


def _without(params: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != key}


def apply(target: str, case: str, variant: str, point: str,
          params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``params`` with the target's tuned row added (unless the config gives its own), and
    the provenance of the choice; ``(params, None)`` where the table has no row."""
    path = paths.tile_table(target, case)
    if not Path(path).exists():
        return params, None
    row = read(path)["rows"].get(variant, {}).get(point)
    if row is None:
        return params, None
    key = row["key"]
    if not isinstance(row.get(key), dict):
        raise CasebookError(path, f"rows.{variant}.{point}.{key}", "the row has no tile choice")
    if _without(row["params"], key) != _without(params, key):
        raise CasebookError(path, f"rows.{variant}.{point}.params",
                            "tuned for other point params than the case config's; rerun "
                            "`snakemake autotune` on a GPU host of this target")
    used = {"file": path, "sha256": provenance.file_sha256(path), "row": f"{variant}.{point}",
            "key": key, "tuned": row[key]}
    if key in params:
        return params, {**used, "applied": False,
                        "why": f"the case config gives `{key}` for this point"}
    return {**params, key: row[key]}, {**used, "applied": True}


def cites_current(record: dict[str, Any], target: str, case: str, variant: str) -> bool:
    """Whether ``record`` of ``variant`` (a lowering, verification, time or ablation
    record, or one compare subject) cites the tile-table row ``apply`` would give its point
    now (the same table file and row; neither, where no row applies)."""
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
