"""Where a record came from: the project commit and content hashes of its inputs."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from casebook.core import paths


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(paths.SOURCE_ROOT), *args],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


# A copy of the tree carried to an offline GPU host names its commit here, as checked
# against its bundle's tree.json (benchmarks/gpu_host.sh). Set, it wins over git: the
# H200's copy of the tree came with a .git of another commit, whose status named every
# changed file dirty and stopped the window.
COMMIT_VARIABLE = "CASEBOOK_COMMIT"
# Git pathspecs of the tree without its records (the pipeline's and the benchmarks'): what
# a commit's cleanliness and a carried tree's stamp are about.
_NOT_RECORDS = (f":!{paths.RESULTS}", f":!{paths.BENCHMARK_RECORDS}")


@functools.cache
def commit() -> str:
    """The project commit, with ``-dirty`` when tracked files other than records under
    results/ or benchmarks/results/ differ from it (a run or a benchmark rewriting
    committed records stays clean); or ``COMMIT_VARIABLE`` where it is set."""
    given = os.environ.get(COMMIT_VARIABLE, "").strip()
    if given:
        return given
    head = _git("rev-parse", "HEAD")
    if head is None:
        return "unknown (not a git checkout)"
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                 *_NOT_RECORDS)
    return f"{head}-dirty" if dirty else head


def portable(path: str | Path) -> str:
    """``path`` as a record names it, free of the folder the project sits in: relative to
    the sources where it lies inside them (``.venv/bin/python``), else as found."""
    found = Path(path).absolute()
    if found.is_relative_to(paths.SOURCE_ROOT):
        return found.relative_to(paths.SOURCE_ROOT).as_posix()
    return str(path)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def files_sha256(files: Iterable[str | Path], root: Path = paths.SOURCE_ROOT) -> str:
    """One hash over the names (relative to ``root``, else bare) and contents of ``files``."""
    digest = hashlib.sha256()
    for path in sorted(Path(f).resolve() for f in files):
        name = path.relative_to(root) if path.is_relative_to(root) else path.name
        digest.update(str(name).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _imported(module: Path) -> set[str]:
    """The dotted names ``module`` (a file under kernels/) imports, relative ones resolved."""
    package = module.relative_to(paths.SOURCE_ROOT).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_bytes(), str(module))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], node.module or ""]
                            if node.level else [node.module or ""]).strip(".")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _module_file(name: str) -> list[Path]:
    """The file of dotted ``name`` under kernels/ (a module, or a package's __init__.py)."""
    if name.split(".")[0] != paths.KERNELS_DIR.name:
        return []
    found = paths.SOURCE_ROOT.joinpath(*name.split("."))
    return [f for f in (found.with_suffix(".py"), found / "__init__.py") if f.is_file()]


@functools.cache
def kernel_sources(case: str) -> tuple[Path, ...]:
    """The files whose change must rerun a case: its package (its README aside) and every
    module under kernels/ it imports, transitively (a shared module it never imports is
    not one)."""
    found = {p for p in paths.kernel_dir(case).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".md"}
    found.add(paths.KERNELS_DIR / "__init__.py")
    todo = [p for p in found if p.suffix == ".py"]
    while todo:
        for name in _imported(todo.pop()):
            new = set(_module_file(name)) - found
            found |= new
            todo += [p for p in new if p.suffix == ".py"]
    return tuple(sorted(found))


@functools.cache
def kernel_sources_sha256(case: str) -> str:
    return files_sha256(kernel_sources(case))


# Case-config keys only the pages read: editing them reruns no measurement.
PRESENTATION_KEYS = ("title", "summary", "notice", "numerics_notes", "randomized_checks",
                     "target", "contrasts", "across_chips")


def job_slice(spec: dict[str, Any], variant: str | None = None, point: str | None = None,
              baseline: str | None = None, ablation: str | None = None) -> dict[str, Any]:
    """The part of a case config one job reads: its variant, point, baseline or ablation
    entry (a job naming no point reads every point, as a build does), the tolerance of its
    point's dtype, and the case-wide settings. Which targets also measure a build-only
    point (``measured_on``) changes no job's work: it is left out."""
    kept = {k: v for k, v in spec.items() if k not in PRESENTATION_KEYS}
    kept["build_only_points"] = [{k: v for k, v in p.items() if k != "measured_on"}
                                 for p in spec.get("build_only_points", [])]
    kept["points"] = [{k: v for k, v in p.items() if k != "measured_on"}
                      for p in spec.get("points", [])]
    for group, name in (("variants", variant), ("baselines", baseline),
                        ("ablations", ablation)):
        kept[group] = [i for i in spec.get(group, []) if i["name"] == name]
    if point is not None:
        for group in ("points", "build_only_points"):
            kept[group] = [p for p in kept[group] if p["name"] == point]
        dtypes = {p["params"].get("dtype") for p in [*kept["points"],
                                                        *kept["build_only_points"]]}
        kept["tolerances"] = {d: t for d, t in spec["tolerances"].items() if d in dtypes}
    return kept


def job_sha256(spec: dict[str, Any], variant: str | None = None, point: str | None = None,
               baseline: str | None = None, ablation: str | None = None) -> str:
    """The hash a record carries: the kernel sources its case imports and the job's own
    slice of the case config, so that a record is stale only when what it read changed."""
    digest = hashlib.sha256(kernel_sources_sha256(spec["name"]).encode())
    digest.update(json.dumps(job_slice(spec, variant, point, baseline, ablation),
                             sort_keys=True).encode())
    return digest.hexdigest()


def known_commit(sha: str) -> bool:
    """Whether ``sha`` (40 hex digits) is a commit of this repository."""
    return len(sha) == 40 and _git("cat-file", "-e", f"{sha}^{{commit}}") is not None


def tree_stamp() -> dict[str, object]:
    """This checkout's commit and the sha256 of every tracked file outside results/ and
    benchmarks/results/: what a copy of the tree carried without git (an offline GPU host)
    is checked against."""
    listed = _git("ls-files", "-z", "--", ".", *_NOT_RECORDS) or ""
    files = sorted(f for f in listed.split("\0") if f and (paths.SOURCE_ROOT / f).is_file())
    return {"commit": commit.__wrapped__(),
            "files": {f: file_sha256(paths.SOURCE_ROOT / f) for f in files}}


def tree_commit(stamp: dict[str, object]) -> tuple[str, list[str]]:
    """(commit, changed files) of this tree against ``stamp``: the stamp's commit where
    every file it lists is here unchanged, else that commit marked ``-dirty``."""
    changed = [f for f, digest in stamp["files"].items()
               if not (paths.SOURCE_ROOT / f).is_file()
               or file_sha256(paths.SOURCE_ROOT / f) != digest]
    clean = str(stamp["commit"]).removesuffix("-dirty")
    dirty = changed or str(stamp["commit"]).endswith("-dirty")
    return (f"{clean}-dirty" if dirty else clean), changed
