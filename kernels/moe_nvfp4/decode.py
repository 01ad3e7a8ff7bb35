"""NVFP4 decoding inside a Mosaic GPU kernel: exact, with ops that lower for sm_90a.

No gathers, no fp8/fp4 casts (Hopper's ptxas lacks them): e2m1 codes through a
where-chain on their integer value, e4m3 scale bytes through integer exponent
arithmetic and a bitcast. Every result is exact in float32 (and the products
code × scale are exact in bf16).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def e2m1(codes):
    """u8 codes (low 4 bits) -> float32 values, −0 for 0x8."""
    magnitude = (codes & 0x7).astype(jnp.int32).astype(jnp.float32)
    value = jnp.where(magnitude < 4, magnitude * 0.5,
                      jnp.where(magnitude < 6, magnitude - 2, magnitude * 2 - 8))
    return jnp.where((codes & 0x8) == 0x8, -value, value)


def high_nibble(packed):
    """u8 -> its high nibble as u8 (u8 shifts do not lower: widen first)."""
    return (packed.astype(jnp.uint16) >> 4).astype(jnp.uint8)


def e4m3(bits):
    """int32 e4m3fn bytes (finite, non-negative) -> float32 values."""
    exponent = bits >> 3
    mantissa = (bits & 0x7).astype(jnp.float32)
    power = lax.bitcast_convert_type((exponent + 117) << 23, jnp.float32)  # 2**(e - 10)
    return jnp.where(exponent == 0, mantissa * 2.0**-9, (mantissa + 8) * power)
