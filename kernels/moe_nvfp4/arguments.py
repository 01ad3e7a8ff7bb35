"""Argument checks at case 01's kernel entries (quantize, GEMM, fused GEMM1): one
ValueError naming the argument, what it got and what it needs, before anything is traced."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

ROW_MAJOR = "row-major [E, M, K/16]; the reference's 128x4 layout is not read here"


def checked(fn: Callable, names: tuple[str, ...], shapes: tuple[jax.ShapeDtypeStruct, ...],
            rows: int, notes: dict[str, str] | None = None) -> Callable:
    """``fn`` with its arguments checked first: count, dtypes, shapes, and (where it is not
    traced) masked_m within [0, rows]. ``notes`` add a hint to an argument's message."""
    notes = notes or {}

    def call(*args):
        if len(args) != len(names):
            raise ValueError(f"{len(args)} arguments; needs {len(names)}: {', '.join(names)}")
        for name, arg, want in zip(names, args, shapes, strict=True):
            hint = f" ({notes[name]})" if name in notes else ""
            if not hasattr(arg, "dtype"):
                raise ValueError(f"{name}: {type(arg).__name__}; needs an array")
            if np.dtype(arg.dtype) != np.dtype(want.dtype):
                raise ValueError(f"{name}: dtype {np.dtype(arg.dtype).name}; needs "
                                 f"{np.dtype(want.dtype).name}{hint}")
            if tuple(arg.shape) != tuple(want.shape):
                raise ValueError(f"{name}: shape {tuple(arg.shape)}; needs "
                                 f"{tuple(want.shape)}{hint}")
        masked = args[names.index("masked_m")]
        if not isinstance(masked, jax.core.Tracer):
            values = np.asarray(masked)
            if values.size and (values.min() < 0 or values.max() > rows):
                raise ValueError(f"masked_m: {values.tolist()}; needs each in [0, {rows}]")
        return fn(*args)

    return call
