"""The contract between kernel packages and the pipeline (kernels/contract.py): nothing
under kernels/ imports the pipeline, every shipped case defines the contract's functions,
execution facts are typed, and the pipeline refuses a package that breaks the contract."""

from __future__ import annotations

import ast
import inspect
import sys
import types
from pathlib import Path

import pytest

from casebook.core import cases, config, paths
from casebook.core.errors import CasebookError
from kernels import contract

pytestmark = pytest.mark.host_rehearsal

KERNELS = sorted(paths.KERNELS_DIR.rglob("*.py"))


def imported(source: Path) -> set[str]:
    """Every module ``source`` imports, statically or through importlib by a literal name."""
    found = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value)
    return found


def test_the_scan_finds_imports_of_every_kind(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import casebook.core.paths\nfrom casebook import cases\n"
                     "import importlib\nimportlib.import_module('casebook.stages.verify')\n")
    assert {"casebook.core.paths", "casebook", "casebook.stages.verify"} <= imported(probe)


@pytest.mark.parametrize("source", KERNELS, ids=lambda p: str(p.relative_to(paths.KERNELS_DIR)))
def test_no_kernel_module_imports_the_pipeline(source):
    assert not {m for m in imported(source) if m.split(".")[0] == "casebook"}


@pytest.mark.parametrize("case", config.load_global()["cases"])
def test_every_shipped_case_defines_the_contract(case):
    plugin = cases.load(case)
    for name in ("build", "kernel", "baseline"):
        parameter = inspect.signature(getattr(plugin, name)).parameters.get("build_dir")
        assert parameter is not None and parameter.default is None, f"{case}.{name}"
    assert {"make_inputs", "oracle", "kernel", "baseline", "mutants"} <= set(contract.REQUIRED)


# The modules every case names alike (docs/adding-a-case.md), each with a docstring.
ROLE_MODULES = ("oracle_f64", "upstream", "port", "baselines", "problems", "near_misses")


@pytest.mark.parametrize("case", config.load_global()["cases"])
def test_every_shipped_case_names_its_roles_alike(case):
    folder = paths.kernel_dir(case)
    assert (folder / "README.md").is_file(), f"{case}: README.md"
    for role in ROLE_MODULES:
        module = folder / f"{role}.py"
        assert module.is_file(), f"{case}: no {role}.py"
        assert ast.get_docstring(ast.parse(module.read_text())), f"{case}: {role}.py"
        assert f"`{role}`" in (folder / "README.md").read_text(), f"{case}: README, {role}"


def test_execution_facts_are_typed():
    made = contract.execution("Pallas interpret mode", interpret=True, framework="jax 0.10.2")
    assert made == {"mode": "Pallas interpret mode", "interpret": True, "poisoned": False,
                    "race_detection": False, "framework": "jax 0.10.2"}
    with pytest.raises(TypeError, match="mode must be a non-empty string"):
        contract.execution("")
    with pytest.raises(TypeError, match="poisoned must be a bool, not 1"):
        contract.execution("m", poisoned=1)
    with pytest.raises(TypeError, match=r"unknown execution facts \['speed'\]"):
        contract.execution("m", speed="fast")


def test_the_race_hooks_are_optional():
    calls = []
    hooked = types.SimpleNamespace(races_found=lambda: calls.append("races") or True,
                                   reset=lambda: calls.append("reset"))
    contract.reset(hooked)
    assert contract.races_found(hooked) and calls == ["reset", "races"]
    bare = types.SimpleNamespace()
    contract.reset(bare)
    assert contract.races_found(bare) is False


def test_case_03_keeps_builds_only_in_a_folder_it_is_given():
    grouped = cases.load("grouped_gemm_fp8_bf16")
    params = config.load_case("configs/cases", "grouped_gemm_fp8_bf16")["points"][0]["params"]
    with pytest.raises(ValueError, match="keeps its builds in a folder: pass build_dir"):
        grouped.build("cute_dsl", params)
    assert grouped.kernel("model", params, "check").execution["subject"] == "numerics model"


@pytest.fixture
def fake_case(tmp_path, monkeypatch):
    """A case package ``kernels.fake_case`` defining the whole contract; a test breaks it."""
    (tmp_path / "fake_case").mkdir()
    init = tmp_path / "fake_case" / "__init__.py"
    init.write_text("")
    module = types.ModuleType("kernels.fake_case")
    module.__file__ = str(init)
    for name in contract.REQUIRED:
        setattr(module, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(paths, "KERNELS_DIR", tmp_path)
    monkeypatch.setitem(sys.modules, "kernels.fake_case", module)
    return module


def test_a_whole_package_loads(fake_case):
    assert cases.load("fake_case") is fake_case


@pytest.mark.parametrize("name", contract.REQUIRED)
def test_a_package_without_a_required_function_is_refused(fake_case, name):
    delattr(fake_case, name)
    with pytest.raises(CasebookError, match=f"{name}: the case plug-in does not define it"):
        cases.load("fake_case")


@pytest.mark.parametrize("name", contract.OPTIONAL)
def test_an_optional_hook_that_is_not_a_function_is_refused(fake_case, name):
    setattr(fake_case, name, True)
    with pytest.raises(CasebookError, match=f"{name}: an optional hook of the contract"):
        cases.load("fake_case")
