"""NVFP4 encoding inside a Mosaic GPU kernel, in float32 with ops that lower for sm_90a.

Round to nearest even without ``round``, from exact steps only (truncation, an exact
subtraction, comparisons), so no compiler rewrite of float arithmetic can change it.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def _rne(t):
    """0 <= t < 2**31 rounded to an integer, ties to even (float32 in and out)."""
    whole = t.astype(jnp.int32)  # truncation
    fraction = t - whole.astype(jnp.float32)  # exact
    up = (fraction > 0.5) | ((fraction == 0.5) & ((whole & 1) == 1))
    return (whole + up.astype(jnp.int32)).astype(jnp.float32)


def e4m3(v):
    """v >= 0 (float32) -> (the e4m3fn value it rounds to, its int32 byte)."""
    bits = lax.bitcast_convert_type(v, jnp.int32)
    exponent = jnp.maximum((bits >> 23) - 127, -6)  # subnormals share 2**-6's quantum
    quantum = lax.bitcast_convert_type((exponent + 124) << 23, jnp.float32)  # 2**(e-3)
    value = jnp.minimum(_rne(v / quantum) * quantum, 448.0)
    vbits = lax.bitcast_convert_type(value, jnp.int32)
    vexp = (vbits >> 23) - 127
    normal = ((vexp + 7) << 3) | ((vbits >> 20) & 0x7)
    subnormal = (value * 512.0).astype(jnp.int32)  # exact: value is on the grid
    return value, jnp.where(value < 2.0**-6, subnormal, normal)


def e2m1(y, negative):
    """float32 y (any sign) and its sign bit (bool) -> int32 code, ties to even."""
    a = jnp.minimum(jnp.abs(y), 6.0)
    step = jnp.where(a < 2, 0.5, jnp.where(a < 4, 1.0, 2.0))
    r = jnp.minimum(_rne(a / step) * step, 6.0)
    magnitude = jnp.where(r < 2, r * 2, jnp.where(r < 4, r + 2, r * 0.5 + 4))
    return magnitude.astype(jnp.int32) | jnp.where(negative, 8, 0)
