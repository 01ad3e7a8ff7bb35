"""Case configs: loaded, checked against their schemas, defaults filled in.

The global config is validated by Snakemake's ``validate`` in the Snakefile; case files
are checked here so that every error names the case file and the key.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from casebook import paths
from casebook.errors import CasebookError


def _with_defaults(validator_class: type) -> type:
    """A validator class that also fills in each property's ``default``."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def properties(validator, props, instance, schema):
        if isinstance(instance, dict):
            for key, sub in props.items():
                if "default" in sub:
                    instance.setdefault(key, sub["default"])
        yield from validate_properties(validator, props, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": properties})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


@functools.cache
def _schema(path: Path) -> dict[str, Any]:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise CasebookError(path, None, "schema file is missing") from None


def validate(path: object, data: Any, schema_path: Path, prefix: str = "") -> None:
    """Check ``data`` (filling defaults); raise naming ``path`` and the bad key."""
    error = jsonschema.exceptions.best_match(_Validator(_schema(schema_path)).iter_errors(data))
    if error is None:
        return
    key = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        key, message = ".".join(filter(None, [key, unknown[0]])), "unknown key"
    elif error.validator == "required":
        missing = error.message.split("'")[1]
        key, message = ".".join(filter(None, [key, missing])), "required key is missing"
    else:
        message = error.message
    raise CasebookError(path, ".".join(filter(None, [prefix, key])) or "(top level)", message)


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CasebookError(path, None, "file not found") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CasebookError(path, None, f"not valid YAML ({error})") from None


def load_global(overlays: Sequence[str | Path] = ()) -> dict[str, Any]:
    """configs/config.yaml with each overlay's top-level keys on top (as Snakemake's
    ``--configfile``), validated, with the schema's defaults filled in."""
    path = paths.SOURCE_ROOT / "configs" / "config.yaml"
    settings = read_yaml(path)
    for overlay in map(Path, overlays):
        settings.update(read_yaml(overlay) or {})
    validate(" + ".join(map(str, [path, *overlays])), settings, paths.CONFIG_SCHEMA)
    return settings


def case_path(case_dir: str | Path, name: str) -> Path:
    """The config file of case ``name``; ``case_dir`` is relative to the sources."""
    return paths.SOURCE_ROOT / case_dir / f"{name}.yaml"


def load_case(case_dir: str | Path, name: str) -> dict[str, Any]:
    """The validated config of case ``name``, with defaults filled in."""
    path = case_path(case_dir, name)
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise CasebookError(path, None, f"unknown case {name!r} (known: {', '.join(known)})")
    case = read_yaml(path)
    validate(path, case, paths.CASE_SCHEMA)
    if case["name"] != name:
        raise CasebookError(path, "name", f"is {case['name']!r} but the file is {name}.yaml")
    if not (paths.kernel_dir(name) / "__init__.py").exists():
        raise CasebookError(path, "name", f"no kernel package {paths.kernel_dir(name)}/")
    case.setdefault("build_only_points", [])
    for group in ("variants", "points", "baselines", "build_only_points"):
        repeated = [n for n, c in Counter(i["name"] for i in case[group]).items() if c > 1]
        if repeated:
            raise CasebookError(path, group, f"name {repeated[0]!r} appears twice")
    variants = {v["name"] for v in case["variants"]}
    for i, variant in enumerate(case.get("autotune", {}).get("variants", [])):
        if variant not in variants:
            raise CasebookError(path, f"autotune.variants.{i}", f"no variant named {variant!r}")
    point_schema = paths.SCHEMA_DIR / "points" / f"{name}.schema.yaml"
    for i, point in enumerate(case["points"]):
        validate(path, point["params"], point_schema, prefix=f"points.{i}.params")
        dtype = point["params"].get("dtype")
        if dtype is not None and dtype not in case["tolerances"]:
            raise CasebookError(path, f"points.{i}.params.dtype", f"no tolerance for {dtype!r}")
    for i, point in enumerate(case["build_only_points"]):
        validate(path, point["params"], point_schema, prefix=f"build_only_points.{i}.params")
    return case


def tolerance(spec: dict[str, Any], dtype: str, output: str, path: object) -> dict[str, Any]:
    """The tolerance of ``output`` for ``dtype``: the dtype's one entry, or its entry for
    that output."""
    entry = spec["tolerances"][dtype]
    if "atol" in entry:
        return entry
    if output not in entry:
        raise CasebookError(path, f"tolerances.{dtype}.{output}",
                            "no tolerance for this output of the kernel")
    return entry[output]


def tolerance_rows(spec: dict[str, Any]) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(dtype, output or None for all outputs, tolerance) for every entry of a case."""
    rows: list[tuple[str, str | None, dict[str, Any]]] = []
    for dtype, entry in spec["tolerances"].items():
        if "atol" in entry:
            rows.append((dtype, None, entry))
        else:
            rows += [(dtype, output, tol) for output, tol in entry.items()]
    return rows


def find(items: list[dict[str, Any]], name: str, path: object, group: str) -> dict[str, Any]:
    """The entry called ``name`` in a case's ``group`` list."""
    for item in items:
        if item["name"] == name:
            return item
    raise CasebookError(path, group, f"no entry named {name!r}")
