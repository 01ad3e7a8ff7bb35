"""Case configs: loaded, checked against their schemas, defaults filled in.

The global config is validated by Snakemake's ``validate`` in the Snakefile, after
``validate_global`` has named the one file (or ``--config``) that set a bad key. Case files
are checked here so that every error names the case file and the key, and completely
before any job runs: the point parameters by the case's own ``check_params``, and a
tolerance for every output each variant and baseline returns (``load_case``).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from casebook.core import files, paths
from casebook.core.errors import CasebookError, shown
from casebook.core.plugin_answers import PluginAnswers


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
        return files.load_yaml(path.read_text())
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


def measurement_defaults() -> dict[str, Any]:
    """The ``measurement`` block with nothing set: the schema's defaults, the one place a
    measurement default is written."""
    block: dict[str, Any] = {}
    _Validator(_schema(paths.CONFIG_SCHEMA)["properties"]["measurement"]).validate(block)
    return block


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def read_yaml(path: Path) -> Any:
    """The YAML file's content; a syntax error is one line, ``file:line:col: problem``."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise CasebookError(path, None, "file not found") from None
    try:
        return files.load_yaml(text)
    except yaml.YAMLError:
        pass  # parsed again below, by the pure-Python parser, for its wording of the error
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{shown(path)}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = error.problem or error.context or "syntax error"
        raise CasebookError(where, None, f"not valid YAML: {_one_line(problem)}") from None
    except yaml.YAMLError as error:
        raise CasebookError(path, None, f"not valid YAML: {_one_line(str(error))}") from None


def _merge(settings: dict[str, Any], overlay: Mapping[str, Any]) -> None:
    """``overlay`` on top of ``settings``, nested mappings merged (Snakemake's
    ``update_config``)."""
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(settings.get(key), dict):
            _merge(settings[key], value)
        else:
            settings[key] = dict(value) if isinstance(value, Mapping) else value


def _holds(settings: Any, keys: Sequence[str]) -> bool:
    for key in keys:
        if not isinstance(settings, Mapping) or key not in settings:
            return False
        settings = settings[key]
    return True


def source_of(sources: Sequence[tuple[str, Any]], key: str | None) -> str:
    """Which of ``sources`` (name and content, in the order applied) set ``key``
    (dotted): the last that holds it; for a key that is missing, the last that holds the
    nearest enclosing key; else the first source (``config`` where there is none)."""
    keys = [] if not key or key == "(top level)" else key.split(".")
    for depth in range(len(keys), 0, -1):
        for name, content in reversed(sources):
            if _holds(content, keys[:depth]):
                return name
    return sources[0][0] if sources else "config"


def validate_global(settings: dict[str, Any], sources: Sequence[tuple[str, Any]]) -> None:
    """Check the merged global ``settings`` (filling defaults); an error names the one
    source that set the bad key."""
    try:
        validate("config", settings, paths.CONFIG_SCHEMA)
    except CasebookError as error:
        raise CasebookError(source_of(sources, error.key), error.key, error.message) from None


def global_sources(configfiles: Sequence[str | Path],
                   given: Mapping[str, Any] | None = None) -> list[tuple[str, Any]]:
    """Each config file's content (in the order applied), then ``--config`` where given."""
    sources: list[tuple[str, Any]] = [(str(f), read_yaml(Path(f)) or {}) for f in configfiles]
    return sources + ([("--config", dict(given))] if given else [])


def load_global(overlays: Sequence[str | Path] = ()) -> dict[str, Any]:
    """configs/config.yaml with each overlay on top (as Snakemake's ``--configfile``:
    nested keys merged), validated, with the schema's defaults filled in."""
    sources = global_sources([paths.SOURCE_ROOT / "configs" / "config.yaml", *overlays])
    settings: dict[str, Any] = {}
    for name, content in sources:
        if not isinstance(content, Mapping):
            raise CasebookError(name, "(top level)", "not a mapping of config keys")
        _merge(settings, content)
    validate_global(settings, sources)
    return settings


SHIPPED_CASES = "configs/cases"  # the case configs shipped with the sources


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
    case.setdefault("ablations", [])
    for group in ("variants", "points", "baselines", "build_only_points", "ablations"):
        repeated = [n for n, c in Counter(i["name"] for i in case[group]).items() if c > 1]
        if repeated:
            raise CasebookError(path, group, f"name {repeated[0]!r} appears twice")
    variants = {v["name"] for v in case["variants"]}
    for key in ("variants", "tpu_variants"):
        for i, variant in enumerate(case.get("autotune", {}).get(key, [])):
            if variant not in variants:
                raise CasebookError(path, f"autotune.{key}.{i}", f"no variant named {variant!r}")
    for i, contrast in enumerate(case.get("contrasts", [])):
        for key in ("variant", "against"):
            if contrast[key] not in variants:
                raise CasebookError(path, f"contrasts.{i}.{key}",
                                    f"no variant named {contrast[key]!r}")
        if contrast["variant"] == contrast["against"]:
            raise CasebookError(path, f"contrasts.{i}.against", "a variant against itself")
    for i, chips in enumerate(case.get("across_chips", [])):
        for j, variant in enumerate([chips["reference"], *chips["port"]]):
            if variant not in variants:
                key = "reference" if j == 0 else f"port.{j - 1}"
                raise CasebookError(path, f"across_chips.{i}.{key}",
                                    f"no variant named {variant!r}")
        if chips["reference"] in chips["port"]:
            raise CasebookError(path, f"across_chips.{i}.port", "the reference against itself")
    pair = case.get("side_by_side")
    for key in ("variant", "against") if pair else ():
        if pair[key] not in variants:
            raise CasebookError(path, f"side_by_side.{key}", f"no variant named {pair[key]!r}")
    for i, ablation in enumerate(case["ablations"]):
        if ablation["name"] in variants:
            raise CasebookError(path, f"ablations.{i}.name", f"{ablation['name']!r} is a "
                                "variant: an ablation is never verified, so it is not one")
        if ablation["of"] not in variants:
            raise CasebookError(path, f"ablations.{i}.of", f"no variant named {ablation['of']!r}")
    point_schema = paths.SCHEMA_DIR / "points" / f"{name}.schema.yaml"
    for i, point in enumerate(case["points"]):
        validate(path, point["params"], point_schema, prefix=f"points.{i}.params")
        dtype = point["params"].get("dtype")
        if dtype is not None and dtype not in case["tolerances"]:
            raise CasebookError(path, f"points.{i}.params.dtype", f"no tolerance for {dtype!r}")
    for i, point in enumerate(case["build_only_points"]):
        validate(path, point["params"], point_schema, prefix=f"build_only_points.{i}.params")
        dtype = point["params"].get("dtype")
        if "measured_on" in point and dtype is not None and dtype not in case["tolerances"]:
            raise CasebookError(path, f"build_only_points.{i}.params.dtype",
                                f"no tolerance for {dtype!r} (the point is measured on "
                                f"{', '.join(point['measured_on'])})")
    answers = PluginAnswers(name)
    _check_with_plugin(path, case, answers)
    answers.save()
    return case


def _check_with_plugin(path: Path, case: dict[str, Any], plugin: PluginAnswers) -> None:
    """What only the case's kernel package knows, checked before any job runs: every
    variant and baseline it has, every point it can run (``check_params``: build-only
    points are built, so they count), and a tolerance for every output a variant or a
    baseline returns at the dtype of every point; every ablation it has, of the variant
    the config says."""
    for i, ablation in enumerate(case["ablations"]):
        try:
            of = plugin.ablates(ablation["name"])
        except ValueError as error:
            raise CasebookError(path, f"ablations.{i}.name", str(error)) from None
        if of != ablation["of"]:
            raise CasebookError(path, f"ablations.{i}.of", f"is {ablation['of']!r}, but the "
                                f"case's plug-in ablates {of!r} by {ablation['name']!r}")
    returned: dict[str, tuple[str, ...]] = {}
    for group, outputs in (("variants", plugin.outputs),
                           ("baselines", plugin.baseline_outputs)):
        for i, item in enumerate(case[group]):
            try:
                returned[f"{group[:-1]} {item['name']}"] = tuple(outputs(item["name"]))
            except ValueError as error:
                raise CasebookError(path, f"{group}.{i}.name", str(error)) from None
    for group in ("points", "build_only_points"):
        for i, point in enumerate(case[group]):
            found = plugin.params_problem(point["params"])
            if found is not None:
                raise CasebookError(path, f"{group}.{i}.params.{found[0]}", found[1])
    for point in [*case["points"], *(p for p in case["build_only_points"]
                                     if "measured_on" in p)]:
        dtype = point["params"].get("dtype")
        if dtype is None:
            continue
        for who, outputs in returned.items():
            for output in outputs:
                try:
                    tolerance(case, dtype, output, path)
                except CasebookError as error:
                    raise CasebookError(path, error.key, f"missing: {who} returns {output!r} "
                                        f"at {dtype} points (e.g. {point['name']})") from None


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


def shipped_tolerance(case: str, dtype: str, output: str) -> tuple[float, float]:
    """(atol, rtol) of ``output`` at ``dtype`` in the shipped case config: what tests and
    benchmarks check a kernel against, read from the one place it is written (with its
    reason)."""
    entry = tolerance(load_case(SHIPPED_CASES, case), dtype, output,
                      case_path(SHIPPED_CASES, case))
    return entry["atol"], entry["rtol"]


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
