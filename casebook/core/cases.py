"""Loading a case's plug-in: ``kernels/<case>/``, found by name, held to the contract
(``kernels.contract``: the functions it defines, what they return, NotRunnable).

Adding a case touches no pipeline code.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from casebook.core import interpreter_speed, paths
from casebook.core.errors import CasebookError
from kernels import contract


def load(case: str) -> ModuleType:
    """The kernel package of ``case``, checked to define the contract's functions (and
    its optional hooks, where present, as functions); where it imported Pallas Mosaic
    GPU, the interpreter then runs without its callbacks' jax round trips
    (``interpreter_speed``)."""
    init = paths.kernel_dir(case) / "__init__.py"
    if not init.exists():
        raise CasebookError(init, None, f"no kernel package for case {case!r}")
    module = importlib.import_module(f"kernels.{case}")
    missing = [name for name in contract.REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise CasebookError(init, missing[0], "the case plug-in does not define it")
    broken = [name for name in contract.OPTIONAL
              if hasattr(module, name) and not callable(getattr(module, name))]
    if broken:
        raise CasebookError(init, broken[0], "an optional hook of the contract, and not "
                                             "a function")
    interpreter_speed.host_values_in_callbacks()  # where its kernels are interpreted
    return module


def params_problem(plugin: ModuleType, params: dict) -> tuple[str, str] | None:
    """The case's ``check_params`` of ``params``: (key, why), or None: it can run."""
    found = plugin.check_params(params)
    if found is not None and not (isinstance(found, tuple) and len(found) == 2
                                  and all(isinstance(part, str) for part in found)):
        raise CasebookError(plugin.__file__, "check_params",
                            f"must return (key, why) or None, not {found!r}")
    return found


def refusal(plugin: ModuleType, params: dict) -> str | None:
    """The case's ``check_params`` of ``params`` as one phrase (``n: 100 is not a multiple
    of 16``), or None: the problem can run."""
    found = params_problem(plugin, params)
    return None if found is None else f"{found[0]}: {found[1]}"
