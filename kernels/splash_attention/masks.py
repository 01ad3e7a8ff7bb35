"""Dense boolean masks of a point (numpy only): what the oracle and baselines apply."""

from __future__ import annotations

from typing import Any

import numpy as np


def dense_mask(params: dict[str, Any]) -> np.ndarray:
    """``[S, S]`` bool: True where query i may attend to key j."""
    n = params["seq_len"]
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    mask = params["mask"]
    if mask["kind"] == "causal":
        return k <= q
    left, right = mask["window"]
    return (k >= q - left) & (k <= q + right)
