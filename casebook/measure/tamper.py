"""The functions a measurement trusts, and a check that the measured code left them alone.

A runnable runs in the measuring process, so it can replace what measures it: the
clock (``time.perf_counter_ns``), CUDA's event timer, the statistics, the engine's own
functions. gpu-mode/reference-kernels#162 patched ``Event.elapsed_time`` and the stats to
report a hundredth of the time. The clocks read their functions as bound when casebook
was imported, so a replacement does not reach them; ``Watch`` notes every watched
function (casebook's and the libraries' when casebook.measure.engine is imported, before
any case's code runs; the GPU libraries' when a measurement loads them), and
``replaced()`` names any that is no longer the one noted: the measurement is then
refused, whatever it read.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

# Library functions a measurement reads, by owner; a module of casebook.measure is
# watched whole (every function and class at its top level, every method of its classes).
LIBRARY = ((time, ("perf_counter_ns", "perf_counter", "monotonic", "monotonic_ns",
                   "process_time", "sleep")),
           (np, ("median", "mean", "percentile", "quantile", "sort", "asarray",
                 "array_equal")),
           (statistics, ("median", "mean", "stdev")))
CUDA = ("cudaEventRecord", "cudaEventSynchronize", "cudaEventElapsedTime",
        "cudaDeviceSynchronize", "cudaMemsetAsync", "cudaDeviceSetLimit",
        "cudaCtxResetPersistingL2Cache")
CUPTI = ("get_timestamp", "activity_flush_all")
MEASURE_PACKAGE = "casebook.measure"


def _callables(owner: Any) -> list[str]:
    """Every function or class at ``owner``'s top level (a module's, or a class's own
    methods), its own or imported."""
    return [name for name, value in vars(owner).items() if callable(value)]


def _top(name: str | None) -> str | None:
    return name.split(".")[0] if isinstance(name, str) else None


def _owner_name(owner: Any) -> str:
    return getattr(owner, "__name__", None) or type(owner).__module__


class Watch:
    """The watched functions as they are now: the library's and casebook.measure's (made
    at ``engine``'s import, before any case's code has run)."""

    def __init__(self, noted: dict[tuple[Any, str], Any] | None = None,
                 loaded: frozenset[tuple[Any, str]] = frozenset()):
        if noted is None:
            owners: list[tuple[Any, Iterable[str]]] = list(LIBRARY)
            measuring = [module for name, module in list(sys.modules.items())
                         if name.startswith(MEASURE_PACKAGE + ".") and module is not None]
            owners += [(module, _callables(module)) for module in measuring]
            owners += [(cls, _callables(cls)) for module in measuring
                       for cls in vars(module).values()
                       if isinstance(cls, type) and cls.__module__ == module.__name__]
            noted = _note(owners)
        self.noted, self.loaded = noted, loaded

    def with_tools(self, tools: Any) -> Watch:
        """These and the GPU libraries' timing functions (``tools``; None: no GPU), noted
        now, when the libraries were loaded for this measurement."""
        if tools is None:
            return self
        owners: list[tuple[Any, Iterable[str]]] = [(tools.cudart, CUDA)]
        if tools.cupti is not None:
            owners.append((tools.cupti, CUPTI))
        loaded = _note(owners)
        return Watch({**self.noted, **loaded}, frozenset(loaded))

    def replaced(self) -> list[str]:
        """``owner.name`` of every watched function that is not the one noted, or (a GPU
        library's) was already replaced when noted: defined outside its owner's package."""
        return sorted(f"{_owner_name(owner)}.{name}"
                      for (owner, name), noted in self.noted.items()
                      if getattr(owner, name, None) != noted
                      or ((owner, name) in self.loaded and _foreign(owner, noted)))

    def restore(self) -> list[str]:
        """Put every replaced function back (a corpus of cheats runs in one process);
        the names of those that were replaced."""
        replaced = self.replaced()
        for (owner, name), noted in self.noted.items():
            if getattr(owner, name, None) != noted:
                setattr(owner, name, noted)
        return replaced


def _note(owners: Iterable[tuple[Any, Iterable[str]]]) -> dict[tuple[Any, str], Any]:
    return {(owner, name): getattr(owner, name) for owner, names in owners
            for name in names if hasattr(owner, name)}


def _foreign(owner: Any, function: Any) -> bool:
    """Whether ``function`` says it was defined outside ``owner``'s top-level package
    (a replacement made before it was noted); one that does not say is not accused."""
    made_in = _top(getattr(function, "__module__", None))
    return made_in is not None and made_in != _top(_owner_name(owner))

