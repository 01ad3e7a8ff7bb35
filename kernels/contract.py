"""The contract between a case's kernel package and the pipeline that runs it.

Both sides import this module; it imports neither. A case is a package ``kernels/<case>/``
whose module exposes :class:`CasePlugin`'s functions; the pipeline finds it by name, checks
it has them (``REQUIRED``), and never imports a framework for it: what runs is a
:class:`Runnable`, with its :class:`Execution` facts. Adding a case is one config, one
point schema and one package.

- ``make_inputs(params, rng) -> {name: ndarray}``: fresh inputs of one problem;
- ``oracle(params, inputs) -> ndarray | {name: ndarray | SampledRows}``: the float64
  answer; where the whole answer does not scale (attention at S 32768), the exact answer
  of rows drawn at random after the kernel ran (:class:`SampledRows`);
- ``check_params(params) -> (key, why) | None``: why a problem cannot run, or None: the
  params key at fault (dotted as in the case file: ``n``, ``m.1``) and what is wrong,
  starting with its value (``("n", "100 is not a multiple of 16")``); the pipeline refuses
  such a point when its config loads, before any job runs;
- ``outputs(variant)`` and ``baseline_outputs(name) -> tuple[str, ...]``: the output
  names the kernel's (the baseline's) ``fetch`` returns (a bare array is
  ``SINGLE_OUTPUT``), known without running it, so a missing tolerance is found when the
  config loads; ValueError for a name the case does not have;
- ``build(variant, params, build_dir) -> dict``: lower/compile, with what was built;
- ``kernel(variant, params, purpose, build_dir) -> Runnable``: ``check`` or ``time``;
- ``baseline(name, params, build_dir) -> Runnable``;
- ``reference_file() -> str | None``: the upstream source actually used or read (None: it
  is not installed on this host);
- ``model_outputs(params, inputs, want) -> {name: ndarray}``: what a correct kernel writes,
  and ``mutants(params) -> [kernels.mutants.Mutant]``: near misses of it, which the check
  must catch.

``build_dir`` is the folder the pipeline gives the case for what it builds (None: the
caller keeps nothing; a case that must keep files refuses it). A ``kernel`` or
``baseline`` that cannot execute on this host raises :class:`NotRunnable`.

Optional (``OPTIONAL``): ``races_found() -> bool`` and ``reset()``, the hooks of a case
that runs an interpreter with a race detector (without them: no race detection, nothing
to reset); ``compare(params, inputs, output, got, want, tolerance, poisoned) -> dict |
None``, a case's own check of one named output (None: the elementwise default);
``tile_candidates(variant, params) -> {key, kept, rejected, smem_limit_bytes, tie_rule,
hand}``, the tile rows the autotune rule measures for a variant;
``intermediates(variant, params) -> [{tensor, bytes}]``, the tensors one of the variant's
kernels writes to memory for the next to read (a config's ``contrasts`` draw them);
``ablates(name) -> variant`` (ValueError for a name it does not have) and
``ablation_refusal(name, params) -> str | None``, a case's ablations: a variant with one
part switched off, which ``build`` and ``kernel`` then accept by name (a config's
``ablations`` lower and time them), and why one changes nothing at ``params``;
``work(params, outputs) -> {flops, bytes, math, basis}``, the least work of computing
``outputs`` at ``params`` (tensor FLOPs, bytes that must cross memory once, the lowest
precision ``fp4``/``fp8``/``bf16`` whose tensor cores could compute it exactly): the
speed-of-light bound every measured time is held to.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypedDict

import numpy as np

SINGLE_OUTPUT = "out"  # the name of an output given as a bare array
# Set by the pipeline in a job whose target is a TPU ("tpu"): a kernel that cannot run on
# one refuses (NotRunnable) before anything opens the chip, which takes seconds a process.
TARGET_PLATFORM = "CASEBOOK_TARGET_PLATFORM"
OPTIONAL = ("races_found", "reset", "compare", "tile_candidates", "intermediates",
            "ablates", "ablation_refusal", "work")


class NotRunnable(Exception):
    """This variant or baseline cannot execute on this host; the message says why."""


class SampledRows:
    """The oracle's answer for some rows of an output of ``shape``: ``index`` (one index
    array per leading axis it selects) picks them, ``values()`` computes them (on first
    use: an output no kernel returns costs nothing). ``seed`` drew them; ``rows`` of
    ``total`` are checked."""

    def __init__(self, shape: tuple[int, ...], index: tuple[np.ndarray, ...],
                 values: Callable[[], np.ndarray], seed: int):
        self.shape, self.index, self.seed = tuple(shape), index, seed
        self._values, self._computed = values, None
        self.rows = len(index[0])
        self.total = int(np.prod(shape[:len(index)]))

    def values(self) -> np.ndarray:
        if self._computed is None:
            self._computed = np.asarray(self._values(), np.float64)
        return self._computed


class _Required(TypedDict):
    mode: str  # what runs where, in words ("Pallas Mosaic GPU interpret mode on ...")
    interpret: bool  # an interpreter runs it: host time, never device time
    poisoned: bool  # its outputs are NaN before it writes them
    race_detection: bool


class Execution(_Required, total=False):
    """How a Runnable runs, as its records state it: made by :func:`execution`."""

    framework: str
    device: str
    subject: str  # what is measured when it is not the kernel itself
    xla_cpu_pool_workers: int


def execution(mode: str, *, interpret: bool = False, poisoned: bool = False,
              race_detection: bool = False, **facts: Any) -> Execution:
    """An :class:`Execution`, its types checked; ``facts`` only of the optional keys."""
    if not isinstance(mode, str) or not mode:
        raise TypeError(f"execution mode must be a non-empty string, not {mode!r}")
    flags = {"interpret": interpret, "poisoned": poisoned, "race_detection": race_detection}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"execution {name} must be a bool, not {value!r}")
    unknown = facts.keys() - Execution.__optional_keys__
    if unknown:
        raise TypeError(f"unknown execution facts {sorted(unknown)}; known: "
                        f"{sorted(Execution.__optional_keys__)}")
    return Execution(mode=mode, **flags, **facts)


class Runnable(NamedTuple):
    """What a case hands the pipeline to run: a framework-neutral callable.

    The pipeline calls ``prepare`` once per input set (host arrays -> device arrays),
    ``call`` to launch, ``sync`` to wait for completion and ``fetch`` to bring the output
    back: one numpy array, or ``{name: array}`` for a kernel with several named outputs.
    An array ``prepare`` returns at the top level of its tuple is an input: the timer
    refuses a call that changes one (a buffer ``call`` writes goes inside a container).
    Two optional facts help the timer: ``stream``, the device stream handle the work is
    enqueued on (CUDA events are recorded there), and ``barrier``, a wait for all work on
    every stream of the device. ``binary``, also optional, names what runs: a sha256 of
    the program ``call`` runs on given prepared arguments (the lowered module with its
    compiler's version, or the compiled file), the same where the same binary runs; the
    history of results across commits expects two revisions of one binary to time alike.
    """

    prepare: Callable[[dict[str, np.ndarray]], tuple[Any, ...]]
    call: Callable[..., Any]
    sync: Callable[[Any], None]
    fetch: Callable[[Any], np.ndarray | dict[str, np.ndarray]]
    execution: Execution
    stream: Any = None  # the stream ``call`` enqueues on; None: the framework chooses
    barrier: Callable[[], None] | None = None  # drains every stream, not just the output's
    binary: Callable[[tuple[Any, ...]], str] | None = None  # prepared args -> sha256


class CasePlugin(Protocol):
    """The functions a case package defines (the module docstring says what each does)."""

    def make_inputs(self, params: dict[str, Any], rng: np.random.Generator
                    ) -> dict[str, np.ndarray]: ...

    def oracle(self, params: dict[str, Any], inputs: dict[str, np.ndarray]
               ) -> np.ndarray | dict[str, np.ndarray]: ...

    def check_params(self, params: dict[str, Any]) -> tuple[str, str] | None: ...

    def outputs(self, variant: str) -> tuple[str, ...]: ...

    def baseline_outputs(self, name: str) -> tuple[str, ...]: ...

    def build(self, variant: str, params: dict[str, Any], build_dir: Path | None = None
              ) -> dict[str, Any]: ...

    def kernel(self, variant: str, params: dict[str, Any], purpose: str,
               build_dir: Path | None = None) -> Runnable: ...

    def baseline(self, name: str, params: dict[str, Any], build_dir: Path | None = None
                 ) -> Runnable: ...

    def reference_file(self) -> str | None: ...

    def model_outputs(self, params: dict[str, Any], inputs: dict[str, np.ndarray],
                      want: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def mutants(self, params: dict[str, Any]) -> list[Any]: ...


REQUIRED = tuple(name for name, value in vars(CasePlugin).items()
                 if callable(value) and not name.startswith("_"))


def races_found(plugin: Any) -> bool:
    """The case's race detector's verdict since the last reset; False without one."""
    hook = getattr(plugin, "races_found", None)
    return bool(hook()) if hook is not None else False


def reset(plugin: Any) -> None:
    """Reset the case's interpreter state, where it has one."""
    hook = getattr(plugin, "reset", None)
    if hook is not None:
        hook()
