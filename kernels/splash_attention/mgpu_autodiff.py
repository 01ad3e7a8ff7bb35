"""The port made differentiable: forward and backward kernels joined by ``jax.custom_vjp``.

The forward kernel runs with ``return_lse=True``; its output and logsumexp are the
residuals the backward kernels (``mgpu_backward``) read. ``jax.grad`` through
``splash_attention`` therefore runs the ported dQ and dK/dV kernels.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from kernels.splash_attention import block_plan, mgpu_backward, mgpu_forward

FORWARD_CONFIG = mgpu_forward.TuningConfig()
BACKWARD_CONFIG = mgpu_backward.BackwardConfig()


def _problem(mask, q, k, v, segment_ids, soft_cap, return_lse=False):
    return mgpu_forward.Problem(q.shape[0], k.shape[0], q.shape[1], k.shape[1], q.shape[2],
                                v.shape[2], jnp.dtype(q.dtype).name, soft_cap=soft_cap,
                                segment_ids=segment_ids is not None, return_lse=return_lse)


def splash_attention(mask, q, k, v, *, segment_ids=None, soft_cap: float | None = None,
                     config: mgpu_forward.TuningConfig = FORWARD_CONFIG,
                     bwd_config: mgpu_backward.BackwardConfig = BACKWARD_CONFIG,
                     interpret: Any = None):
    """``mgpu_forward.splash_attention``'s output, differentiable in q, k and v.

    Arguments as ``mgpu_forward.splash_attention`` (MQA: k, v [Skv, D]; their gradients
    come back in the same shape, summed over every query head that reads them).
    """
    q, k3, v3 = mgpu_forward.check_inputs(mask, q, k, v, segment_ids)
    problem = _problem(mask, q, k3, v3, segment_ids, soft_cap, return_lse=True)
    forward = mgpu_forward.make(problem, config,
                                block_plan.plan(mask, config.block_q, config.block_kv),
                                interpret=interpret)
    backward = mgpu_backward.make(
        problem, bwd_config, block_plan.plan(mask, bwd_config.block_q, bwd_config.block_kv),
        block_plan.plan_dkv(mask, bwd_config.block_q, bwd_config.block_kv, problem.heads_kv),
        interpret=interpret)
    segments = () if segment_ids is None else (jnp.asarray(segment_ids.q),
                                               jnp.asarray(segment_ids.kv))
    return joined(forward, backward, segments)(q, k3, v3)


def joined(forward, backward, segments: tuple = ()):
    """``f(q, k, v) -> out`` differentiable through the kernels: ``forward(q, k_t, v,
    *segments) -> (out, lse)`` and ``backward(q, k, v, out, lse, do, *segments) -> (dq,
    dk, dv)`` (either architecture's)."""

    @jax.custom_vjp
    def attend(q, k, v):
        return forward(q, jnp.swapaxes(k, 1, 2), v, *segments)[0]

    def attend_fwd(q, k, v):
        out, lse = forward(q, jnp.swapaxes(k, 1, 2), v, *segments)
        return out, (q, k, v, out, lse)

    def attend_bwd(residuals, do):
        return backward(*residuals, do, *segments)

    attend.defvjp(attend_fwd, attend_bwd)
    return attend
