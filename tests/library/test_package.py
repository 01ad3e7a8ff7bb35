"""The project is a package installed into the environment (`make env`: pip's editable
install), and nothing of ours edits sys.path to find it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib

from casebook.core import paths

FIND = """
import json, pkgutil, casebook, kernels.contract, snakemake_logger_plugin_casebook as plugin
print(json.dumps({"casebook": casebook.__file__, "contract": kernels.contract.__file__,
                  "plugin": plugin.__file__,
                  "found": [m.name for m in pkgutil.iter_modules() if m.name == plugin.__name__]}))
"""
# An assignment to sys.path or a call that changes it.
EDIT = re.compile(r"sys\.path\s*(\[[^]]*\]\s*=|=|\.(insert|append|extend|remove)\()")


def test_the_environment_holds_the_project_at_its_version():
    project = tomllib.loads((paths.SOURCE_ROOT / "pyproject.toml").read_text())["project"]
    assert importlib.metadata.version(project["name"]) == project["version"]


def test_a_fresh_interpreter_anywhere_imports_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", FIND], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for name in ("casebook", "contract", "plugin"):
        assert found[name].startswith(str(paths.SOURCE_ROOT) + os.sep), (name, found[name])
    # Snakemake finds its logger plug-ins by walking sys.path (pkgutil), not by importing.
    assert found["found"] == ["snakemake_logger_plugin_casebook"]


def test_no_file_of_ours_edits_sys_path():
    ours = [*paths.SOURCE_ROOT.glob("Snakefile"), *paths.SOURCE_ROOT.glob("workflow/**/*.smk")]
    for folder in ("casebook", "kernels", "workflow", "benchmarks", "tests",
                   "snakemake_logger_plugin_casebook"):
        ours += (paths.SOURCE_ROOT / folder).rglob("*.py")
    edits = [f"{path.relative_to(paths.SOURCE_ROOT)}:{n}"
             for path in ours
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if EDIT.search(line) and path.name != "test_package.py"]
    assert not edits
