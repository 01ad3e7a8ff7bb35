"""An offline wheelhouse for an accelerator host: the wheels it lacks, in parts that fit a
transfer. One mechanism, two hosts (``HOSTS``): the GPU host (env/cuda.lock, cp312) and
the TPU host (env/cpu.lock, cp311: the CPU lock's Python and jax are that host's).

``build`` takes the host's lock, drops what its package list (env/gpu-host.txt,
env/tpu-host.txt) says the host has (and what those packages depend on, which the host
has with them) and what the host never needs (``Host.not_carried``), downloads the rest
for the host's Python on manylinux x86_64 with their lock hashes, and packs them into tar
parts of at most ``max_part`` bytes; a wheel larger than a part is cut into chunks. The
configured cases' reference sources that env/reference.lock provides travel as the files
alone (laid out as under site-packages), so the host hashes the same
bytes as condition 1 without the package.

The host installs it with ``casebook.hosts.host_install`` (standard library only: nothing else
is installed there yet), whose manifest format this module writes.

    python -m casebook.hosts.wheelhouse plan [--host tpu]         # what is carried, and why not
    python -m casebook.hosts.wheelhouse kept [--host tpu]         # the host's own, as lock lines
    python -m casebook.hosts.wheelhouse build OUT [--host tpu] [--max-part-mib 60]
    python -m casebook.hosts.wheelhouse commit PARTS_DIR          # this tree's commit, checked
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from casebook.core import paths, provenance
from casebook.core.errors import CasebookError
from casebook.core.locks import Pin, normalize, read_lock
from casebook.core.provenance import file_sha256
from casebook.hosts.host_install import FORMAT, MANIFEST, REQUIREMENTS, SOURCES

MIB = 1 << 20
DEFAULT_MAX_PART = 60 * MIB
TREE_STAMP = "tree.json"  # the commit and files of the tree the bundle was made from

def _manylinux(python: str) -> dict:
    """pip's download tags for CPython ``python`` ("3.12") on manylinux x86_64."""
    abi = "cp" + python.replace(".", "")
    return {"python_version": python, "abi": abi, "implementation": "cp",
            "platforms": [f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)]}


# Locked packages no accelerator host needs, with why (their own dependencies drop too).
_NEVER = {
    "ruff": "lint, run where the code is edited",
    "uv": "`make lock`, run where the locks are made",
    "playwright": "the site's browser tests, run where the site is built",
    "snakemake-executor-plugin-slurm": "cluster submission; the host runs jobs locally",
    "nvidia-cutlass-dsl": "the port is compiled here and carried exported, as a library that "
                          "needs no CuTe DSL (kernels/grouped_gemm_fp8_bf16/aot.py)",
    "nvidia-cutlass-dsl-libs-base": "part of CuTe DSL (see nvidia-cutlass-dsl)",
    "nvidia-cutlass-dsl-libs-core": "part of CuTe DSL (see nvidia-cutlass-dsl)",
    "nvidia-cutlass-dsl-libs-cu12": "part of CuTe DSL (see nvidia-cutlass-dsl)",
    "nvidia-curand": "headers for compiling example 69's harness, which is compiled here "
                     "and carried (build/grouped_gemm_fp8_bf16/ex69/)",
}
_NO_CUDA = "the CUDA toolchain: a TPU host compiles and runs no CUDA"


@dataclass(frozen=True)
class Host:
    """An offline accelerator host: its lock, its package list, its Python's wheel tags
    and the locked packages it never needs, with why."""

    name: str
    lock: str  # paths.lock_file's platform
    package_list: Path
    platform: dict
    not_carried: dict[str, str]


HOSTS = {
    "gpu": Host("gpu", "cuda", paths.ENV_DIR / "gpu-host.txt", _manylinux("3.12"), {
        **_NEVER,
        "nvidia-cuda-cuobjdump": "the host has cuobjdump 13 on PATH",
        "cuda-python": "a metapackage over cuda-bindings (pinning its version), which the "
                       "host has; casebook imports cuda.bindings",
        "nvidia-cuda-nvdisasm": "the host has nvdisasm 13 on PATH",
    }),
    "tpu": Host("tpu", "cpu", paths.ENV_DIR / "tpu-host.txt", _manylinux("3.11"), {
        **_NEVER,
        **dict.fromkeys(("nvidia-cuda-nvcc", "nvidia-cuda-crt",
                         "nvidia-nvvm", "nvidia-cuda-runtime", "nvidia-cuda-cccl",
                         "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"), _NO_CUDA),
        "cuda-python": "the CUDA runtime's bindings: a TPU host has no GPU (casebook reports "
                       "'no GPU' without them)",
        "cuda-bindings": "see cuda-python",
        **dict.fromkeys(("pytest", "pytest-timeout", "pytest-xdist", "hypothesis"),
                        "the tests run where the code is edited; the TPU window runs the "
                        "pipeline's records only"),
        **dict.fromkeys(("matplotlib", "pandas"),
                        "figures and pages are drawn where the window's archive is imported "
                        "(the bundle must fit the device's 64 MiB with the tree)"),
    }),
}
# A target's offline host, where it has one.
HOST_OF_TARGET = {"h100": "gpu", "h200": "gpu", "b200": "gpu", "tpu-v5e": "tpu"}
def read_host(path: Path = HOSTS["gpu"].package_list) -> dict[str, str | None]:
    """``{package: version or None}`` of a host's package list (``python`` included)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise CasebookError(path, None, "host package list not found") from None
    found: dict[str, str | None] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:==(\S+))?", line)
        if match is None:
            raise CasebookError(path, f"line {number}", f"not `name` or `name==version`: {raw!r}")
        found[normalize(match[1])] = match[2]
    return found


def plan(lock: dict[str, Pin], host: dict[str, str | None],
         not_carried: dict[str, str] = HOSTS["gpu"].not_carried) -> dict[str, dict[str, str]]:
    """Each locked package: ``carry``, or why not. The host has its listed packages and
    what they require (pip installed them together); a package is needed when the lock's
    ``.in`` asks for it or a needed package requires it, unless it is never carried
    (``not_carried``)."""
    with_host = dict.fromkeys(host, "listed")
    grew = True
    while grew:
        grew = False
        for name, pin in lock.items():
            by = sorted(pin.via & set(with_host))
            if name not in with_host and by:
                with_host[name], grew = f"required by {by[0]}", True
    needed = {n for n, pin in lock.items() if "-r" in pin.via and n not in not_carried}
    frontier = list(needed)
    while frontier:
        parent = frontier.pop()
        for name, pin in lock.items():
            if parent in pin.via and name not in needed and name not in not_carried:
                needed.add(name)
                frontier.append(name)
    out = {}
    for name, pin in sorted(lock.items()):
        if name in with_host:
            seen = host.get(name) or "version not read"
            why = (f"on the host ({seen}; locked {pin.version})" if name in host
                   else f"on the host, {with_host[name]}")
        elif name in not_carried:
            why = f"not needed there: {not_carried[name]}"
        elif name not in needed:
            why = "needed only by packages not carried"
        else:
            why = "carry"
        out[name] = {"version": pin.version, "decision": why}
    return out


def carried(lock: dict[str, Pin], host: dict[str, str | None],
            not_carried: dict[str, str] = HOSTS["gpu"].not_carried) -> list[Pin]:
    decisions = plan(lock, host, not_carried)
    return [lock[n] for n, d in decisions.items() if d["decision"] == "carry"]


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--no-deps",
                           "--disable-pip-version-check"], capture_output=True, text=True)


def _fetch(pin: Pin, into: Path, platform: dict) -> dict:
    """Download ``pin``'s wheel for the host; a pin published only as an sdist is
    downloaded (hash-checked) and built into a pure-Python wheel, whose own sha256 then
    pins it. Returns the manifest entry's provenance."""
    folder = into / pin.name
    folder.mkdir()
    requirement = folder / "pin.txt"
    requirement.write_text(pin.requirement())
    done = _pip("download", "--only-binary=:all:", "--require-hashes",
                "--python-version", platform["python_version"], "--abi", platform["abi"],
                "--implementation", platform["implementation"],
                *(f"--platform={p}" for p in platform["platforms"]),
                "-r", str(requirement), "-d", str(folder))
    if done.returncode == 0:
        return {"pin": pin.name, "from": "wheel"}
    sdist = _pip("download", "--no-binary=:all:", "--require-hashes", "-r", str(requirement),
                 "-d", str(folder / "sdist"))
    if sdist.returncode:
        raise RuntimeError(f"{pin.name}=={pin.version}: no wheel for the host "
                           f"({done.stderr.strip()[-500:]}) and no sdist "
                           f"({sdist.stderr.strip()[-500:]})")
    (source,) = (folder / "sdist").iterdir()
    built = _pip("wheel", "-w", str(folder), str(source))
    wheels = list(folder.glob("*.whl"))
    if built.returncode or len(wheels) != 1 or not wheels[0].name.endswith("-py3-none-any.whl"):
        raise RuntimeError(f"{pin.name}=={pin.version}: its sdist did not build one pure "
                           f"Python wheel: {built.stderr.strip()[-1000:]}")
    return {"pin": pin.name, "from": f"sdist {source.name} ({pin.hashes[0]}), built here"}


def _download(pins: list[Pin], into: Path, platform: dict) -> list[tuple[Path, dict]]:
    """``(wheel, provenance)`` of every pin for ``platform``, fetched in parallel."""
    with ThreadPoolExecutor(8) as pool:
        origins = list(pool.map(lambda pin: _fetch(pin, into, platform), pins))
    out = []
    for pin, origin in zip(pins, origins, strict=True):
        (wheel,) = (into / pin.name).glob("*.whl")
        out.append((wheel, origin))
    return out


def _tar_size(sizes: list[int]) -> int:
    """Bytes of an uncompressed tar of files of ``sizes`` (headers, padding, end, record)."""
    body = sum(3 * 512 + -(-s // 512) * 512 for s in sizes) + 1024  # long names: +2 blocks
    return -(-body // 10240) * 10240


def _chunks(wheel: Path, size: int) -> list[Path]:
    out = []
    with wheel.open("rb") as handle:
        for index, block in enumerate(iter(lambda: handle.read(size), b"")):
            chunk = wheel.with_name(f"{wheel.name}.{index:03d}")
            chunk.write_bytes(block)
            out.append(chunk)
    wheel.unlink()
    return out


def reference_sources() -> list[tuple[Path, str, str]]:
    """(file, its path under site-packages, origin) of each configured case's reference
    source that a package of env/reference.lock provides. Such a package is read, never
    run (FlashInfer: hundreds of MB), so the host gets the one file the case hashes."""
    import importlib
    import importlib.metadata

    from casebook.core import config

    settings = config.load_global()
    references = [importlib.import_module(f"kernels.{case}").reference_file()
                  for case in settings["cases"]]
    wanted = {str(Path(r).resolve()) for r in references if r}
    out = []
    for pin in read_lock(paths.REFERENCE_LOCK).values():
        try:
            dist = importlib.metadata.distribution(pin.name)
        except importlib.metadata.PackageNotFoundError:
            raise CasebookError(paths.REFERENCE_LOCK, pin.name, "not installed here: "
                                "`make env` installs the reference lock") from None
        if dist.version != pin.version:
            raise CasebookError(paths.REFERENCE_LOCK, pin.name,
                                f"{dist.version} installed, {pin.version} locked")
        for name in map(str, dist.files or []):
            found = Path(dist.locate_file(name)).resolve()
            if str(found) in wanted:
                out.append((found, name, f"{pin.name}=={pin.version} (env/reference.lock)"))
    return out


def build(out: Path, max_part: int = DEFAULT_MAX_PART, host: Host = HOSTS["gpu"],
          sources: list[tuple[Path, str, str]] = ()) -> dict:
    """Download the wheels ``host`` lacks and pack them, and ``sources`` (reference files
    laid out as under site-packages), into ``out/wheelhouse-NN.tar`` parts."""
    lock_path = paths.lock_file(host.lock)
    pins = carried(read_lock(lock_path), read_host(host.package_list), host.not_carried)
    reserve = 256 * 1024  # the manifest, requirements and tar headers of a part
    if max_part < 2 * reserve:
        raise CasebookError("--max-part-mib", None, f"{max_part} bytes is too small a part")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("wheelhouse-*.tar"):
        stale.unlink()
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        staging = Path(tmp)
        wheels, files, requirements = [], [], []
        for wheel, origin in _download(pins, staging, host.platform):
            wheel = wheel.rename(staging / wheel.name)
            entry = {"file": wheel.name, "sha256": file_sha256(wheel), "size": wheel.stat().st_size,
                     **origin}
            name, version = wheel.name.split("-")[:2]
            requirements.append(f"{name}=={version} --hash=sha256:{entry['sha256']}\n")
            parts = _chunks(wheel, max_part - reserve) if entry["size"] > max_part - reserve \
                else [wheel]
            entry["chunks"] = [p.name for p in parts] if parts != [wheel] else []
            wheels.append(entry)
            files += parts
        (staging / REQUIREMENTS).write_text("".join(requirements))
        carried_sources = []
        for source, name, origin in sources:
            copy = staging / SOURCES / name
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(source.read_bytes())
            carried_sources.append({"path": name, "sha256": file_sha256(copy), "from": origin})
            files.append(copy)
        bins: list[list[Path]] = []  # first fit, largest first
        for item in sorted(files, key=lambda p: -p.stat().st_size):
            for group in bins:
                if _tar_size([f.stat().st_size for f in [*group, item]]) <= max_part - reserve:
                    group.append(item)
                    break
            else:
                bins.append([item])
        manifest = {"format": FORMAT, "host": host.name, "parts": len(bins),
                    "max_part_bytes": max_part, "platform": host.platform,
                    "lock": lock_path.name,
                    "lock_sha256": file_sha256(lock_path), "wheels": wheels,
                    "sources": carried_sources}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        written = []
        for index, group in enumerate(bins, 1):
            part = out / f"wheelhouse-{index:02d}.tar"
            with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
                for item in [staging / MANIFEST, staging / REQUIREMENTS, *group]:
                    tar.add(item, arcname=item.relative_to(staging).as_posix())
            if part.stat().st_size > max_part:
                raise RuntimeError(f"{part} is {part.stat().st_size} bytes > {max_part}")
            written.append({"file": part.name, "bytes": part.stat().st_size})
    return {**manifest, "written": written}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m casebook.hosts.wheelhouse",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    planned = sub.add_parser("plan", help="each locked package: carried, or why not")
    kept = sub.add_parser("kept", help="the lock's entries (hashes included) of what the host "
                                       "has: a requirements file for a rehearsal of it")
    make = sub.add_parser("build", help="download and pack the carried wheels")
    make.add_argument("out", type=Path)
    for command in (planned, kept, make):
        command.add_argument("--host", choices=sorted(HOSTS), default="gpu")
    make.add_argument("--max-part-mib", type=float, default=DEFAULT_MAX_PART / MIB)
    tree = sub.add_parser("commit", help="the commit of this tree, checked against the "
                                         "bundle's tree.json (-dirty where files differ)")
    tree.add_argument("parts_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            host = HOSTS[args.host]
            decisions = plan(read_lock(paths.lock_file(host.lock)),
                             read_host(host.package_list), host.not_carried)
            for name, d in decisions.items():
                print(f"{name}=={d['version']}: {d['decision']}")
        elif args.command == "kept":
            host = HOSTS[args.host]
            lock = read_lock(paths.lock_file(host.lock))
            decisions = plan(lock, read_host(host.package_list), host.not_carried)
            print("".join(lock[n].requirement() for n, d in decisions.items()
                          if d["decision"].startswith("on the host")), end="")
        elif args.command == "build":
            done = build(args.out, int(args.max_part_mib * MIB), HOSTS[args.host],
                         sources=reference_sources())
            (args.out / TREE_STAMP).write_text(json.dumps(provenance.tree_stamp()) + "\n")
            for part in done["written"]:
                print(f"{args.out / part['file']}: {part['bytes'] / MIB:.1f} MiB")
            print(f"{len(done['wheels'])} wheels and {len(done['sources'])} reference sources "
                  f"in {done['parts']} parts")
        else:
            stamp = args.parts_dir / TREE_STAMP
            try:
                found, changed = provenance.tree_commit(json.loads(stamp.read_text()))
            except (OSError, ValueError) as error:
                raise CasebookError(stamp, None, f"unreadable ({error})") from None
            for name in changed:
                print(f"casebook: changed since the bundle was made: {name}", file=sys.stderr)
            print(found)
    except CasebookError as error:
        print(f"casebook: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
