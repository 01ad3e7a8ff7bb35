"""Host stand-ins: what runs in a kernel's place on a host without its device (an
interpreter running the kernel, or what is not the kernel itself, e.g. case 03's
numerics model). Its host time is correctness evidence, not a speed result: it is timed
with ``measurement.interpret``'s short budget, on one core beside other jobs, never
pinned, and compared only with its own kind."""

from __future__ import annotations

from typing import Any


def is_stand_in(execution: dict[str, Any]) -> bool:
    """Whether what ran (its contract's ``execution``) stands in for the kernel: an
    interpreter ran it, or what ran is not the kernel itself (its ``subject``)."""
    return bool(execution.get("interpret") or execution.get("subject"))


def verified_by_stand_in(verify_record: dict[str, Any]) -> bool:
    """Whether a verify record's kernel ran as a stand-in in any of its checks."""
    return any(is_stand_in(c.get("execution", {})) for c in verify_record["checks"])
