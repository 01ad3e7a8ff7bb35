"""The offline host's side of a wheelhouse (``casebook.hosts.wheelhouse`` builds it): check that
every part is there, reassemble the chunks, check each wheel's and reference source's
sha256, and install them with pip, no index, hashes required, into a target folder put
after the host's own packages on PYTHONPATH.

Standard library only, at import and after: it runs on a host where nothing of the
project's environment is installed yet.

    python -m casebook.hosts.host_install PARTS_DIR TARGET
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

MANIFEST = "wheelhouse.json"
REQUIREMENTS = "requirements.txt"
SOURCES = "sources"  # reference files, laid out as under site-packages
FORMAT = 1


class InstallError(Exception):
    """A bundle that cannot be installed: the file (and the key) at fault, and why."""

    def __init__(self, path: object, key: str | None, message: str):
        where = f"{path}: {key}" if key else f"{path}"
        super().__init__(f"{where}: {message}")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _members(part: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(part) as tar:
        members = tar.getmembers()
    for member in members:
        parts = member.name.split("/")
        if not member.isfile() or any(p in ("", ".", "..") or p.startswith(".") for p in parts) \
                or (len(parts) > 1 and parts[0] != SOURCES):
            raise InstallError(part, member.name, f"a part holds plain files by bare name, "
                               f"or under {SOURCES}/, only")
    return members


def reassemble(parts_dir: Path, into: Path) -> dict:
    """Unpack every part into ``into``, rejoin chunks, check sizes and sha256 of each wheel."""
    parts = sorted(parts_dir.glob("wheelhouse-*.tar"))
    if not parts:
        raise InstallError(parts_dir, None, "no wheelhouse-NN.tar part found")
    manifests = set()
    for part in parts:
        _members(part)
        with tarfile.open(part) as tar:
            tar.extractall(into, filter="data")
        manifests.add((into / MANIFEST).read_text())
    if len(manifests) != 1:
        raise InstallError(parts_dir, MANIFEST, "the parts come from different builds")
    manifest = json.loads(manifests.pop())
    if manifest.get("format") != FORMAT:
        raise InstallError(parts_dir, f"{MANIFEST}: format", f"is {manifest.get('format')!r}")
    if len(parts) != manifest["parts"]:
        raise InstallError(parts_dir, None, f"{len(parts)} parts found, "
                           f"the wheelhouse has {manifest['parts']}")
    for wheel in manifest["wheels"]:
        target = into / wheel["file"]
        if wheel["chunks"]:
            missing = [c for c in wheel["chunks"] if not (into / c).exists()]
            if missing:
                raise InstallError(parts_dir, wheel["file"], f"chunks missing: {missing}")
            with target.open("wb") as handle:
                for chunk in wheel["chunks"]:
                    handle.write((into / chunk).read_bytes())
                    (into / chunk).unlink()
        if not target.exists() or sha256(target) != wheel["sha256"]:
            raise InstallError(parts_dir, wheel["file"], "missing or sha256 differs")
    for source in manifest["sources"]:
        copy = into / SOURCES / source["path"]
        if not copy.exists() or sha256(copy) != source["sha256"]:
            raise InstallError(parts_dir, source["path"], "missing or sha256 differs")
    return manifest


def install(parts_dir: Path, target: Path) -> dict:
    """Install the wheelhouse into ``target`` with pip, no index, hashes required."""
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp)
        manifest = reassemble(parts_dir, staging)
        command = [sys.executable, "-m", "pip", "install", "--isolated", "--quiet",
                   "--disable-pip-version-check", "--no-index", "--no-deps",
                   "--require-hashes", "--upgrade", "--find-links", str(staging),
                   "--target", str(target), "-r", str(staging / REQUIREMENTS)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"pip install exited {done.returncode}: {done.stderr[-3000:]}")
        for source in manifest["sources"]:
            placed = target / source["path"]
            placed.parent.mkdir(parents=True, exist_ok=True)
            placed.write_bytes((staging / SOURCES / source["path"]).read_bytes())
    return manifest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    parts_dir, target = map(Path, args)
    try:
        done = install(parts_dir, target)
    except InstallError as error:
        print(f"casebook: error: {error}", file=sys.stderr)
        return 1
    print(f"installed {len(done['wheels'])} wheels into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
