"""Where a record came from: the project commit and content hashes of its inputs."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from casebook import paths


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(paths.SOURCE_ROOT), *args],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


# A copy of the tree without git (e.g. one carried to an offline GPU host) names its
# commit here; a git checkout ignores it.
COMMIT_VARIABLE = "CASEBOOK_COMMIT"


@functools.cache
def commit() -> str:
    """The project commit, with ``-dirty`` when tracked files other than records under
    results/ differ from it (a run rewriting committed records stays clean)."""
    head = _git("rev-parse", "HEAD")
    if head is None:
        given = os.environ.get(COMMIT_VARIABLE, "").strip()
        return given or "unknown (not a git checkout)"
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                 f":!{paths.RESULTS}")
    return f"{head}-dirty" if dirty else head


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


def kernel_sources(case: str) -> list[Path]:
    """The files whose change must rerun a case: its package and the shared modules."""
    own = (p for p in paths.kernel_dir(case).rglob("*")
           if p.is_file() and "__pycache__" not in p.parts)
    return sorted([*paths.KERNELS_DIR.glob("*.py"), *own])


def case_sources_sha256(case: str, case_path: Path) -> str:
    """The hash a case's records carry: its kernel sources and its config."""
    return files_sha256([*kernel_sources(case), case_path])


def known_commit(sha: str) -> bool:
    """Whether ``sha`` (40 hex digits) is a commit of this repository."""
    return len(sha) == 40 and _git("cat-file", "-e", f"{sha}^{{commit}}") is not None


def tree_stamp() -> dict[str, object]:
    """This checkout's commit and the sha256 of every tracked file outside results/: what a
    copy of the tree carried without git (an offline GPU host) is checked against."""
    listed = _git("ls-files", "-z", "--", ".", f":!{paths.RESULTS}") or ""
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
