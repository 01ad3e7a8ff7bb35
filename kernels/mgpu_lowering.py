"""Lower a Pallas Mosaic GPU kernel for CUDA on any host and read its launch facts.

``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` runs the whole Mosaic GPU
compiler front end (layout inference, TMA descriptors, wgmma or tcgen05, shared- and
tensor-memory allocation, the 227 KiB budget check) without a GPU. The kernel's module
travels serialised inside the ``mosaic_gpu_v2`` custom call; it is deserialised here:
the ``gpu.launch`` operands give grid, block and dynamic shared memory, its
``tcgen05.alloc`` operations the tensor-memory columns it holds (of 512), and its
inline PTX the kinds of ``tcgen05.mma`` it issues (Blackwell kernels only).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib import mosaic_gpu_dialect
from jax._src.lib.mlir import ir, passmanager
from jax.experimental.pallas import mosaic_gpu as plgpu

CUSTOM_CALL = "mosaic_gpu_v2"
TMEM_COLUMNS = 512  # tensor memory per SM on sm_100: 128 lanes × 512 columns of 32 bits
TCGEN05_MMA = re.compile(r"tcgen05\.mma[\w:.]*")
TENSOR_MEMORY_OPS = ("llvm.inline_asm", "nvvm.tcgen05.alloc")  # read per launch


def _ops(op: ir.Operation, *names: str) -> dict[str, list[ir.Operation]]:
    """The operations nested in ``op`` (itself included) of each name, in one walk of the
    tree by MLIR (a Python recursion over a large kernel took a second)."""
    found: dict[str, list[ir.Operation]] = {name: [] for name in names}

    def visit(inner: ir.Operation) -> ir.WalkResult:
        if (bucket := found.get(inner.name)) is not None:
            bucket.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


def _kernel_module(payload: bytes, context: ir.Context) -> ir.Module:
    """The kernel's module from its serialised form: parsed, then Mosaic GPU's serde pass
    undone (what ``mosaic_core._run_serde_pass`` does, less its bytecode round trip and
    verifier: the module was verified before it was serialised)."""
    module = ir.Module.parse(payload)
    passmanager.PassManager.parse(
        "builtin.module(mosaic_gpu-serde{serialize=false})", context).run(module.operation)
    return module


def _constant(value: ir.Value) -> int:
    return ir.IntegerAttr(value.owner.attributes["value"]).value


def launches(stablehlo: ir.Module) -> list[dict[str, Any]]:
    """grid, block and dynamic shared memory of every Mosaic GPU kernel in a module."""
    facts = []
    for call in _ops(stablehlo.operation, "stablehlo.custom_call")["stablehlo.custom_call"]:
        if ir.StringAttr(call.attributes["call_target_name"]).value != CUSTOM_CALL:
            continue
        config = ir.DictAttr(call.attributes["mhlo.backend_config"])
        payload = ir.StringAttr(config["module"]).value_bytes
        context = jax_mlir.make_ir_context()
        mosaic_gpu_dialect.register_dialect(context)
        with context:
            context.allow_unregistered_dialects = True
            module = _kernel_module(payload, context)  # alive while its ops are read
            kernel = _ops(module.operation, "gpu.launch", *TENSOR_MEMORY_OPS)
            for launch in kernel["gpu.launch"]:
                # Operands: async token, grid x/y/z, block x/y/z, dynamic smem bytes.
                values = [_constant(v) for v in list(launch.operands)[1:8]]
                inside = {name: [op for op in kernel[name] if _launch_of(op) == launch]
                          for name in TENSOR_MEMORY_OPS}
                facts.append({"grid": values[0:3], "block": values[3:6],
                              "dynamic_smem_bytes": values[6], **_tensor_memory(inside)})
    return facts


def _launch_of(op: ir.Operation) -> ir.Operation | None:
    """The ``gpu.launch`` that ``op`` is nested in, if any."""
    parent = op.parent
    while parent is not None and parent.name != "gpu.launch":
        parent = parent.parent
    return parent


def _tensor_memory(inside: dict[str, list[ir.Operation]]) -> dict[str, Any]:
    """Tensor-memory columns allocated and tcgen05 MMA kinds issued by one launch, from
    its ``TENSOR_MEMORY_OPS``; nothing for a kernel that uses neither (Hopper's). An
    allocation is an ``nvvm.tcgen05.alloc`` (jax 0.10.2) or inline ``tcgen05.alloc`` PTX
    (0.11.2); its operand 1 is the columns."""
    asm = [(op, ir.StringAttr(op.attributes["asm_string"]).value)
           for op in inside["llvm.inline_asm"]]
    allocs = [*inside["nvvm.tcgen05.alloc"],
              *(op for op, text in asm if text.startswith("tcgen05.alloc"))]
    columns = sum(_constant(op.operands[1]) for op in allocs)
    kinds = sorted({kind for _, text in asm for kind in TCGEN05_MMA.findall(text)})
    if not columns and not kinds:
        return {}
    return {"tmem_columns": columns, "tmem_limit_columns": TMEM_COLUMNS,
            "tcgen05_mma": kinds}


def lower_for_cuda(fn: Callable, args: Sequence[jax.ShapeDtypeStruct]) -> dict[str, Any]:
    """Lower ``fn`` for CUDA; its kernel launches, the seconds it took, module size."""
    start = time.perf_counter()
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    seconds = time.perf_counter() - start
    module = lowered.compiler_ir("stablehlo")
    found = launches(module)
    if not found:
        raise ValueError("the lowered module holds no Mosaic GPU kernel launch")
    return {"seconds": seconds, "launches": found}


def scratch_bytes(scratch: dict) -> int:
    """Shared memory of a kernel's scratch buffers, from their shapes (barriers: 8 bytes
    each) — the budget check made before lowering."""
    total = 0
    for item in scratch.values():
        if isinstance(item, plgpu.Barrier):
            total += 8 * math.prod(item.num_barriers)
        else:
            total += math.prod(item.shape) * jnp.dtype(item.dtype).itemsize
    return total
