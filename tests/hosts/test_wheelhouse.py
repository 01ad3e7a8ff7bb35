"""The offline wheelhouse: what is carried to the GPU host, parts under the limit, an
offline install from the parts, and refusals of incomplete or tampered parts."""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from casebook.core import locks, paths
from casebook.core.errors import CasebookError
from casebook.hosts import host_install, wheelhouse

pytestmark = pytest.mark.host_rehearsal

LOCK = """\
alpha==1.0 \\
    --hash=sha256:{h}
    # via -r env/cuda.in
beta==2.0 \\
    --hash=sha256:{h}
    # via alpha
gamma==3.0 \\
    --hash=sha256:{h}
    # via
    #   -r env/cuda.in
    #   hostpkg
hostpkg==9.9 \\
    --hash=sha256:{h}
    # via -r env/cuda.in
delta==4.0 \\
    --hash=sha256:{h}
    # via hostpkg
ruff==0.1 \\
    --hash=sha256:{h}
    # via -r env/cuda.in
""".format(h="0" * 64)


def test_plan_carries_what_the_host_lacks_and_nothing_else(tmp_path):
    lock = tmp_path / "cuda.lock"
    lock.write_text(LOCK)
    host = tmp_path / "host.txt"
    host.write_text("python==3.12.3\nhostpkg==9.8  # older than locked\n")
    decisions = wheelhouse.plan(locks.read_lock(lock), wheelhouse.read_host(host))
    carried = sorted(n for n, d in decisions.items() if d["decision"] == "carry")
    assert carried == ["alpha", "beta"]
    assert decisions["hostpkg"]["decision"] == "on the host (9.8; locked 9.9)"
    assert decisions["gamma"]["decision"] == "on the host, required by hostpkg"
    assert decisions["delta"]["decision"] == "on the host, required by hostpkg"
    assert decisions["ruff"]["decision"].startswith("not needed there")


def test_the_real_plan_drops_the_hosts_packages_and_keeps_the_pipelines():
    decisions = wheelhouse.plan(locks.read_lock(paths.lock_file("cuda")),
                                wheelhouse.read_host())
    carried = {n for n, d in decisions.items() if d["decision"] == "carry"}
    assert {"snakemake", "jsonschema", "cupti-python", "psutil"} <= carried
    assert not carried & {"jax", "jaxlib", "numpy", "scipy", "ml-dtypes", "ruff", "playwright"}


@pytest.mark.parametrize("text, key", [("numpy>=2\n", "line 1"), ("a==1 ==2\n", "line 1")])
def test_a_bad_host_line_is_named(tmp_path, text, key):
    host = tmp_path / "host.txt"
    host.write_text(text)
    with pytest.raises(CasebookError, match=key):
        wheelhouse.read_host(host)


def test_a_lock_entry_without_hash_is_refused(tmp_path):
    lock = tmp_path / "cuda.lock"
    lock.write_text("alpha==1.0\n    # via -r env/cuda.in\n")
    with pytest.raises(CasebookError, match="alpha: pinned without a hash"):
        locks.read_lock(lock)


def make_wheel(folder: Path, name: str, payload_bytes: int) -> Path:
    """A minimal pure-Python wheel carrying ``payload_bytes`` of random data."""
    files = {f"{name}/__init__.py": b"VALUE = 42\n",
             f"{name}/payload.bin": os.urandom(payload_bytes),
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\n"
                                                f"Version: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                            b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()}"
        f",{len(d)}\n" for n, d in files.items())
    files[f"{name}-1.0.dist-info/RECORD"] = (record + f"{name}-1.0.dist-info/RECORD,,\n").encode()
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for n, d in files.items():
            archive.writestr(n, d)
    return wheel


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """A wheelhouse of two real wheels, one larger than a part, built with a fake download."""
    def download(pins, into, platform):
        out = []
        for pin, size in zip(pins, (900_000, 1_000), strict=True):
            folder = into / pin.name
            folder.mkdir()
            out.append((make_wheel(folder, pin.name, size), {"pin": pin.name, "from": "wheel"}))
        return out

    monkeypatch.setattr(wheelhouse, "_download", download)
    monkeypatch.setattr(wheelhouse, "carried", lambda lock, host, not_carried: [
        locks.Pin("bigpkg", "1.0", ["sha256:" + "0" * 64]),
        locks.Pin("smallpkg", "1.0", ["sha256:" + "0" * 64])])
    out = tmp_path / "parts"
    limit = 700_000
    source = tmp_path / "reference.py"
    source.write_text("KERNEL = 'upstream'\n")
    done = wheelhouse.build(out, max_part=limit, sources=[
        (source, "upstream/kernels/reference.py", "upstream==1.0 (test)")])
    assert all(p["bytes"] <= limit for p in done["written"])
    big = next(w for w in done["wheels"] if w["file"].startswith("bigpkg"))
    assert len(big["chunks"]) >= 2
    return out


def test_parts_install_offline_into_a_target(parts, tmp_path):
    target = tmp_path / "site"
    host_install.install(parts, target)
    done = subprocess.run([sys.executable, "-c", "import bigpkg, smallpkg; "
                           "print(bigpkg.VALUE + smallpkg.VALUE)"],
                          env={**os.environ, "PYTHONPATH": str(target)},
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "84"
    assert (target / "upstream/kernels/reference.py").read_text() == "KERNEL = 'upstream'\n"


def test_a_missing_part_is_refused(parts, tmp_path):
    sorted(parts.glob("wheelhouse-*.tar"))[-1].unlink()
    with pytest.raises(host_install.InstallError, match="parts found"):
        host_install.reassemble(parts, tmp_path / "staging")


def test_a_tampered_chunk_is_refused(parts, tmp_path):
    part = sorted(parts.glob("wheelhouse-*.tar"))[0]
    unpacked = tmp_path / "unpacked"
    with tarfile.open(part) as tar:
        tar.extractall(unpacked, filter="data")
    chunk = next(unpacked.glob("*.whl.000"))
    chunk.write_bytes(b"x" + chunk.read_bytes()[1:])
    with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
        for item in sorted(unpacked.iterdir()):
            tar.add(item, arcname=item.name)
    with pytest.raises(host_install.InstallError,
                       match=r"bigpkg-1\.0-py3-none-any\.whl: missing or sha256"):
        host_install.reassemble(parts, tmp_path / "staging")


def test_a_part_with_a_path_is_refused(parts, tmp_path):
    part = sorted(parts.glob("wheelhouse-*.tar"))[0]
    evil = tmp_path / "evil.txt"
    evil.write_text("x")
    with tarfile.open(part, "a") as tar:
        tar.add(evil, arcname="../evil.txt")
    with pytest.raises(host_install.InstallError, match="plain files by bare name"):
        host_install.reassemble(parts, tmp_path / "staging")


def names_in(part):
    with tarfile.open(part) as tar:
        return tar.getnames()


def test_a_tampered_source_is_refused(parts, tmp_path):
    name = "sources/upstream/kernels/reference.py"
    (part,) = [p for p in parts.glob("wheelhouse-*.tar") if name in names_in(p)]
    unpacked = tmp_path / "unpacked"
    with tarfile.open(part) as tar:
        names = tar.getnames()
        tar.extractall(unpacked, filter="data")
    (unpacked / name).write_text("KERNEL = 'other'\n")
    with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
        for member in names:
            tar.add(unpacked / member, arcname=member)
    with pytest.raises(host_install.InstallError,
                       match=r"upstream/kernels/reference\.py: missing or sha256"):
        host_install.reassemble(parts, tmp_path / "staging")


def reference_lock_installed() -> bool:
    try:
        importlib.metadata.distribution("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not reference_lock_installed(),
                    reason="env/reference.lock is not installed here (the rehearsed host)")
def test_the_reference_sources_are_the_files_the_cases_hash():
    from kernels import moe_nvfp4

    (found,) = wheelhouse.reference_sources()
    assert str(found[0]) == str(Path(moe_nvfp4.reference_file()).resolve())
    assert found[1] == "flashinfer/" + moe_nvfp4.REFERENCE[1]
    assert found[2] == "flashinfer-python==0.7.2.post1 (env/reference.lock)"


def test_the_host_installer_imports_the_standard_library_alone():
    """It runs where nothing of the environment is installed yet: no third-party package
    and no other casebook module, at import or inside a function."""
    tree = ast.parse(Path(host_install.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_host_installer_names_the_bundle_it_cannot_install(tmp_path, capsys):
    assert host_install.main([str(tmp_path), str(tmp_path / "site")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"casebook: error: {tmp_path}: no wheelhouse-NN.tar part found")
