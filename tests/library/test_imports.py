"""Every module of the project imports in this environment, and so does every package the
GPU path loads lazily. Run in the rehearsal of the offline GPU host (`make rehearse`), it
proves the host's packages plus the wheelhouse are all that the pipeline needs."""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

from casebook.core import paths
from kernels.grouped_gemm_fp8_bf16 import compile_port

pytestmark = pytest.mark.host_rehearsal

OWN = sorted(
    ".".join(path.relative_to(paths.SOURCE_ROOT).with_suffix("").parts)
    for package in ("casebook", "kernels")
    for path in (paths.SOURCE_ROOT / package).rglob("*.py")
    if path.name != "__init__.py" or path.parent != paths.SOURCE_ROOT / package
)
# Imported inside functions on the GPU path (clocks, throttling, the host record, case 03,
# the Mosaic GPU lowering) or by Snakemake's own start.
LAZY = ["pynvml", "cuda.bindings.driver", "cuda.bindings.runtime", "snakemake",
        "jax.experimental.mosaic.gpu", "jax.experimental.pallas.mosaic_gpu", "absl",
        "cutlass.cute", "psutil", "jsonschema"]
# In env/cuda.lock and the wheelhouse, not in env/cpu.lock.
CUDA_ONLY = ["cupti.cupti"]
REHEARSAL = "CASEBOOK_HOST_REHEARSAL"
# The compile side of case 03: CuTe DSL compiles and exports the port where the wheelhouse
# is built; a GPU host runs the exported library without the DSL (compile_port, aot).
DSL = ["kernels.grouped_gemm_fp8_bf16.port", "cutlass.cute"]


@pytest.mark.parametrize("module", [m for m in [*OWN, *LAZY] if m not in DSL])
def test_module_imports(module):
    importlib.import_module(module)


@pytest.mark.skipif(os.environ.get(REHEARSAL) and not compile_port.dsl_installed(),
                    reason="the rehearsed GPU host has no CuTe DSL: it runs the exported port")
@pytest.mark.parametrize("module", DSL)
def test_dsl_module_imports(module):
    importlib.import_module(module)


@pytest.mark.skipif(not os.environ.get(REHEARSAL),
                    reason=f"cupti-python is in env/cuda.lock only ({REHEARSAL} unset)")
@pytest.mark.parametrize("module", CUDA_ONLY)
def test_cuda_lock_module_imports(module):
    importlib.import_module(module)


def imports_of(module: str) -> set[str]:
    """The project modules ``module`` imports, anywhere in it (a function's lazy import
    too): ``from pkg import name`` counts as ``pkg.name`` where that is a module."""
    path = paths.SOURCE_ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES
                      else node.module for alias in node.names}
    return (found & MODULES) - {module}


MODULES = {m.removesuffix(".__init__") for m in OWN} | {"casebook", "kernels"}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, str] = {}
    trail: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        trail.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return [*trail[trail.index(imported):], imported]
            if imported not in state and (found := visit(imported)):
                return found
        state[module] = "done"
        trail.pop()
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m))), None)


def test_no_module_of_casebook_or_kernels_imports_itself_through_others():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    graph = {module: imports_of(module) for module in MODULES}
    assert len(graph) > 100 and graph["casebook.core.records"] >= {"casebook.core.files"}
    assert cycle(graph) is None, " -> ".join(cycle(graph))


# What each folder of casebook may import of casebook (docs/layout.md): core stands on
# nothing else, the measurement engine on core alone.
BELOW = {"casebook.core": {"casebook.core"},
         "casebook.measure": {"casebook.core", "casebook.measure"}}


@pytest.mark.parametrize("package", sorted(BELOW))
def test_the_lowest_folders_import_nothing_above_them(package):
    above = {f"{module} -> {imported}" for module in MODULES if module.startswith(f"{package}.")
             for imported in imports_of(module)
             if imported.startswith("casebook.")
             and ".".join(imported.split(".")[:2]) not in BELOW[package]}
    assert not above, sorted(above)
