"""A case is a plug-in: ``kernels/<case>/`` exposes this surface, found by name.

- ``make_inputs(params, rng) -> {name: ndarray}``: fresh inputs of one problem;
- ``oracle(params, inputs) -> ndarray``: the float64 answer;
- ``check_params(params) -> (key, why) | None``: why a problem cannot run, or None: the
  params key at fault (dotted as in the case file: ``n``, ``m.1``) and what is wrong,
  starting with its value (``("n", "100 is not a multiple of 16")``); the case config
  refuses such a point when it loads (``config.load_case``), before any job runs;
- ``outputs(variant) -> tuple[str, ...]`` and ``baseline_outputs(name) -> tuple[str,
  ...]``: the output names the kernel's (the baseline's) ``fetch`` returns (a bare array
  is ``SINGLE_OUTPUT``), known without running it, taken from the case's own variant
  tables, so a missing tolerance is found when the config loads; ValueError for a name
  the case does not have;
- ``build(variant, params) -> dict``: lower/compile, with what was built;
- ``kernel(variant, params, purpose) -> Runnable``: ``check`` or ``time``;
- ``baseline(name, params) -> Runnable``;
- ``races_found() -> bool`` and ``reset()``: the interpreter's race detector;
- ``reference_file() -> str | None``: the upstream source actually used or read (None:
  the reference is not installed on this host);
- ``model_outputs(params, inputs, want) -> {name: ndarray}``: what a correct kernel
  writes, and ``mutants(params) -> [kernels.mutants.Mutant]``: near misses of it, which
  the check must catch (``casebook.check_power``).

Optional: ``compare(params, inputs, output, got, want, tolerance, poisoned) -> dict |
None``, a case's own check of one named output on ``inputs`` (None: the elementwise
default, ``verify.compare``); ``poisoned``: the outputs were NaN before the kernel ran, so
what it must not write must still be NaN.
Optional: ``tile_candidates(variant, params) -> {key, kept, rejected, smem_limit_bytes,
tie_rule}``,
the tile rows the autotune rule measures for a variant (``casebook.autotune``).

``oracle`` returns one array or ``{output name: array}``; a kernel's ``fetch`` returns
some of those names (a variant computing one stage returns that stage's outputs). A
``kernel`` or ``baseline`` that cannot execute on this host raises ``NotRunnable``.

Adding a case touches no pipeline code.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from casebook import paths
from casebook.errors import CasebookError


class NotRunnable(Exception):
    """This variant or baseline cannot execute on this host; the message says why."""


SURFACE = ("make_inputs", "oracle", "check_params", "outputs", "baseline_outputs", "build",
           "kernel", "baseline", "races_found", "reset", "reference_file", "model_outputs",
           "mutants")
SINGLE_OUTPUT = "out"  # the name of an output given as a bare array


def load(case: str) -> ModuleType:
    """The kernel package of ``case``, checked to expose the whole surface."""
    init = paths.kernel_dir(case) / "__init__.py"
    if not init.exists():
        raise CasebookError(init, None, f"no kernel package for case {case!r}")
    module = importlib.import_module(f"kernels.{case}")
    missing = [name for name in SURFACE if not callable(getattr(module, name, None))]
    if missing:
        raise CasebookError(init, missing[0], "the case plug-in does not define it")
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
