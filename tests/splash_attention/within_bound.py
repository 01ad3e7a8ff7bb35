"""The kernel tests' check: each output against the float64 oracle within the bound a
correct execution keeps to (``bounds.dense_check``), under the test's own dense mask, plus
the case config's atol and rtol (the output's rounding)."""

from __future__ import annotations

import numpy as np

from casebook.core import config
from kernels.splash_attention import bounds


def visible(mask: np.ndarray, seg=None) -> np.ndarray:
    """The dense mask ([H, S, S] or [S, S]) with the segments folded in."""
    if seg is None:
        return np.asarray(mask, bool)
    return np.asarray(mask, bool) & (np.asarray(seg.q)[:, None] == np.asarray(seg.kv)[None, :])


def check(got: dict[str, np.ndarray], want: dict[str, np.ndarray],
          operands: dict[str, np.ndarray], mask: np.ndarray, *, seg=None,
          cap: float | None = None) -> dict[str, dict]:
    """``got[name]`` against ``want[name]`` for every name of ``got`` (out, dq, dk, dv);
    ``operands``: q, k, v as the kernel read them (k, v [S, d] for MQA), and do for the
    gradients."""
    dtype = np.asarray(operands["q"]).dtype.name
    return bounds.dense_check(got, want, operands, visible(mask, seg), cap,
                              lambda name: config.shipped_tolerance("splash_attention",
                                                                    dtype, name))
