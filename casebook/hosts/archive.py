"""An accelerator host's records (a GPU's or a TPU's) in one archive: packed there,
checked and imported here.

``pack`` puts ``results/<target>/`` and the run's logs (as ``results/<target>/logs/``)
into one .tar.xz under a size limit, leaving the raw sample tables out when they would
not fit (and saying so). ``import_archive`` refuses an archive unless every member is a
plain file under one ``results/<target>/`` of an accelerator target, every record passes its
schema, and every record names a clean commit of this repository (one window's records
name one; a window continuing an earlier commit's plan carries those of its records that
are still current, ``casebook.hosts.carry``); it then replaces
``results/<target>/`` as a whole (staged beside it, then renamed), but for its store of
results across commits (``history/``), which is kept and gains the archive's timed
records: the store is kept here, never carried.

    python -m casebook.hosts.archive import ARCHIVE      # then: git add results/<target>/
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from casebook.core import paths, provenance, records
from casebook.core.errors import CasebookError
from casebook.report import history

ACCELERATOR_TARGETS = ("h100", "h200", "b200", "tpu-v5e")  # hosts a window runs on
LOGS_IN_RESULTS = "logs"
HISTORY_IN_RESULTS = "history"
_ALLOWED = re.compile(r".*\.(json|csv|yaml)$")
_SAMPLES = re.compile(r".*(\.samples\.csv|\.samples/.*)$")


def _files(target: str, logs_since: float | None = None) -> list[tuple[Path, str]]:
    """(file on disk, name in the archive) of what ``pack`` carries: the logs only written
    at or after ``logs_since`` (seconds since the epoch) where it is given."""
    out = []
    root = Path(paths.target_dir(target))
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and rel.parts[0] not in (LOGS_IN_RESULTS, HISTORY_IN_RESULTS) \
                and not _hidden(rel):
            out.append((path, f"{paths.target_dir(target)}/{rel.as_posix()}"))
    logs = Path(paths.LOGS)
    for path in sorted(logs.rglob("*")) if logs.exists() else []:
        rel = path.relative_to(logs)
        if path.is_file() and not _hidden(rel) and (
                logs_since is None or path.stat().st_mtime >= logs_since):
            out.append((path, f"{paths.target_dir(target)}/{LOGS_IN_RESULTS}/{rel.as_posix()}"))
    return out


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts) or rel.name.endswith(".tmp")


def _write(files: list[tuple[Path, str]], destination: Path) -> int:
    fd, tmp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
    try:
        with open(fd, "wb") as handle, tarfile.open(fileobj=handle, mode="w:xz",
                                                    preset=9) as tar:
            for path, name in files:
                tar.add(path, arcname=name, recursive=False)
        Path(tmp).replace(destination)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return destination.stat().st_size


def pack(target: str, out: Path, limit_bytes: int, logs_since: float | None = None
         ) -> dict[str, Any]:
    """Pack ``results/<target>/`` and ``logs/`` into ``out``; at most ``limit_bytes``.
    ``logs_since``: only the logs written at or after it (a window continuing a plan
    leaves the earlier windows' logs to their own archives)."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    destination = out / f"casebook-{target}-{stamp}.tar.xz"
    files = _files(target, logs_since)
    size = _write(files, destination)
    dropped = size > limit_bytes
    if dropped:
        files = [(p, n) for p, n in files if not _SAMPLES.match(n)]
        size = _write(files, destination)
    if size > limit_bytes:
        destination.unlink()
        raise CasebookError(destination, None, f"{size} bytes even without the sample tables, "
                            f"over the {limit_bytes}-byte limit")
    return {"file": str(destination), "bytes": size, "members": len(files),
            "samples_dropped": dropped}


def _member_target(archive: Path, member: tarfile.TarInfo) -> str | None:
    """The target a member lies under (None for the ``results`` folder itself)."""
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts or name.parts[0] != paths.RESULTS \
            or (len(name.parts) < 3 and not member.isdir()):
        raise CasebookError(archive, member.name, "not a path under results/<target>/")
    if not (member.isfile() or member.isdir()):
        raise CasebookError(archive, member.name, "not a plain file or folder")
    if member.isfile() and name.parts[2] != LOGS_IN_RESULTS and not _ALLOWED.match(member.name):
        raise CasebookError(archive, member.name, "not a record, sample table or tile table")
    if len(name.parts) > 2 and name.parts[2] == HISTORY_IN_RESULTS:
        raise CasebookError(archive, member.name, "a store of results across commits is kept "
                            "where it is imported, never carried")
    return name.parts[1] if len(name.parts) > 1 else None


def _check_record(archive: Path, member: str, text: bytes, target: str) -> str:
    """Schema-check one record; its commit."""
    where = f"{archive}:{member}"
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CasebookError(where, None, f"corrupt or truncated JSON ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise CasebookError(where, "kind", "a record is a JSON object naming its kind")
    if data.get("schema_version") != records.SCHEMA_VERSION:
        raise CasebookError(where, "schema_version", f"is {data.get('schema_version')!r}; "
                            f"this code reads version {records.SCHEMA_VERSION}")
    records.check(where, data["kind"], data)
    if data.get("target", target) != target:
        raise CasebookError(where, "target", f"is {data['target']!r}, the folder is {target!r}")
    return data["commit"]


def check(archive: Path, on_host: bool = False) -> tuple[str, list[str], list[tarfile.TarInfo]]:
    """(target, commits, members) of a sound archive; raises naming the first fault. Its
    records' commits must be clean commits of this repository, unless ``on_host`` (a host
    without git continuing a plan: ``casebook.hosts.carry`` then judges each record)."""
    try:
        with tarfile.open(archive) as tar:
            return _check_open(archive, tar, on_host)
    except (OSError, tarfile.TarError) as error:
        raise CasebookError(archive, None, f"not a readable archive ({error})") from None


def _check_open(archive: Path, tar: tarfile.TarFile, on_host: bool
                ) -> tuple[str, list[str], list[tarfile.TarInfo]]:
    members = tar.getmembers()
    targets = {_member_target(archive, m) for m in members} - {None}
    if len(targets) != 1:
        raise CasebookError(archive, None, f"holds targets {sorted(targets)}; one expected")
    (target,) = targets
    if target not in ACCELERATOR_TARGETS:
        raise CasebookError(archive, f"results/{target}",
                            f"not an accelerator target ({', '.join(ACCELERATOR_TARGETS)})")
    commits: dict[str, str] = {}
    for member in members:
        parts = PurePosixPath(member.name).parts
        if member.isfile() and member.name.endswith(".json") and parts[2] != LOGS_IN_RESULTS:
            text = tar.extractfile(member).read()
            commits.setdefault(_check_record(archive, member.name, text, target),
                               member.name)
    for required in (paths.env_record(target), paths.host_record(target)):
        if required not in {m.name for m in members}:
            raise CasebookError(archive, required, "missing: every import carries env and host")
    for commit, member in commits.items():
        if not (on_host or provenance.known_commit(commit)):
            raise CasebookError(archive, member, f"commit {commit!r} is not a clean commit "
                                "of this repository: records must come from committed code")
    return target, sorted(commits), members


def import_archive(*archives: Path, root: Path = Path(), on_host: bool = False
                   ) -> dict[str, Any]:
    """Check ``archives`` (of one target: the windows of one plan, ``check``; ``on_host``:
    their commits not looked up) and make them ``root/results/<target>/``, replacing what
    was there but the store of results across commits, which gains their timed records.
    A file in several archives is the last one's: a later window's env, host, noise-floor
    and window records describe the folder; each time record carries the floor it applied."""
    if not archives:
        raise CasebookError("archive", None, "name at least one archive")
    checked = [(archive, *check(archive, on_host)) for archive in archives]
    targets = {target for _, target, _, _ in checked}
    if len(targets) != 1:
        raise CasebookError(archives[-1], None, f"archives of targets {sorted(targets)}: "
                            "one import takes one target's windows")
    (target,) = targets
    results = root / paths.RESULTS
    results.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=results, prefix=f".import-{target}-"))
    try:
        for archive, _, _, members in checked:
            with tarfile.open(archive) as tar:
                tar.extractall(staging, members=members, filter="data")
        final = results / target
        old = results / f".replaced-{target}"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        (staging / paths.RESULTS / target).rename(final)
        if (old / HISTORY_IN_RESULTS).is_dir():
            (old / HISTORY_IN_RESULTS).rename(final / HISTORY_IN_RESULTS)
        shutil.rmtree(old, ignore_errors=True)
        for kind in history.KINDS:
            for path in sorted(final.glob(f"*/{kind}/*/*.json")):
                history.keep(records.read(path, kind), root=root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    files = len({m.name for _, _, _, members in checked for m in members if m.isfile()})
    commits = sorted({commit for _, _, named, _ in checked for commit in named})
    return {"target": target, "commits": commits, "files": files}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m casebook.hosts.archive", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    put = sub.add_parser("import", help="check archives (one target's windows) and unpack "
                                        "them into results/, the later's file over the earlier's")
    put.add_argument("archives", type=Path, nargs="+")
    args = parser.parse_args(argv)
    try:
        done = import_archive(*args.archives)
    except CasebookError as error:
        print(f"casebook: error: {error}", file=sys.stderr)
        return 1
    print(f"imported {done['files']} files into {paths.target_dir(done['target'])}/ "
          f"(commit {', '.join(c[:12] for c in done['commits'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
