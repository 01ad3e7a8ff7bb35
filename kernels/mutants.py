"""Near misses of what a case verifies: the outputs a subtly wrong kernel would write.

A case lists its mutants (``mutants(params)``) beside ``model_outputs(params, inputs)``,
what a correct kernel writes; the pipeline runs each mutant through verify's own check
(``casebook.check_power``) to show that the check can fail. numpy only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

# (params, inputs, the oracle's answers, the correct output) -> the mutant's output, or
# None where the mutant does not apply at these params (e.g. beta = 0, no partial block).
Make = Callable[[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray],
                np.ndarray | None]


class Mutant(NamedTuple):
    name: str
    output: str  # the named output it corrupts
    description: str
    make: Make


def scale(values: np.ndarray) -> float:
    """An output's scale: the root mean square of its finite elements (0 if none)."""
    finite = values[np.isfinite(values)].astype(np.float64)
    return float(np.sqrt(np.mean(finite**2))) if finite.size else 0.0


def biased(values: np.ndarray, fraction: float, dtype=None) -> np.ndarray:
    """``values`` plus ``fraction`` of their scale, everywhere, rounded to ``dtype``."""
    moved = values.astype(np.float64) + fraction * scale(values)
    return moved.astype(dtype or values.dtype)


def bias(output: str, fraction: float = 0.01) -> Mutant:
    """Every element of ``output`` off by ``fraction`` of the output's scale."""
    return Mutant(f"bias_{fraction:.0%}".replace("%", "pct"), output,
                  f"every element of {output} plus {fraction:.0%} of its RMS",
                  lambda params, inputs, want, correct: biased(correct, fraction))
