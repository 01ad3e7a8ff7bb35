"""The port exported ahead of time: a self-contained shared library and its launch ABI.

CuTe DSL's ``export_to_c`` writes the compiled host launcher and its cubin as an object
file and a C header. ``link`` makes that object a shared library with the DSL's static
CUDA-dialect runtime and CUDA's static runtime, so it needs nothing but the driver
(libcuda) at run time: a GPU host launches the port without CuTe DSL installed.
``read_abi`` reads the header (the entry symbols, each tensor argument's count of dynamic
shapes and strides, the scalar arguments in order); ``Launcher`` calls the library through
ctypes with exactly those structs. Standard library and numpy only.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

_TENSOR = re.compile(r"typedef struct \{\s*void \*data;\s*int32_t dynamic_shapes\[(\d+)\];"
                     r"(?:\s*int64_t dynamic_strides\[(\d+)\];)?\s*\} \w+?_Tensor_(\w+)_t;")
_WRAPPER = re.compile(r"static inline int32_t cute_dsl_\w+_wrapper\(([^)]*)\)")
_ENTRY = re.compile(r"void (_mlir_\w+__mlir_ciface_\w+)\(void \*\*args, int32_t num_args\);")
_INIT = re.compile(r"void (_mlir_\w+_cuda_init)\(void \*\*\);")
_LOAD = re.compile(r"void (_mlir_\w+_cuda_load_to_device)\(void \*\*\);")
_SCALARS = {"float": ctypes.c_float, "int32_t": ctypes.c_int32, "cudaStream_t": ctypes.c_void_p}
RUNTIME_LIBS = ["-lrt", "-lpthread", "-ldl"]


def read_abi(header: Path) -> dict[str, Any]:
    """The launch ABI the exported header declares."""
    text = header.read_text()
    tensors = {name: {"shapes": int(shapes), "strides": int(strides or 0)}
               for shapes, strides, name in _TENSOR.findall(text)}
    wrapper, entry, init, load = (p.search(text) for p in (_WRAPPER, _ENTRY, _INIT, _LOAD))
    if not (wrapper and entry and init and load):
        raise ValueError(f"{header}: not a CuTe DSL export header (entry, init, load, wrapper)")
    arguments = []
    for declaration in wrapper[1].split(",")[1:]:  # the first is the module
        kind, name = declaration.strip().rsplit(" ", 1)
        if name.startswith("*"):
            tensor = name.lstrip("*")
            arguments.append({"name": tensor, "kind": "tensor", **tensors[tensor]})
        elif kind in _SCALARS:
            arguments.append({"name": name, "kind": kind})
        else:
            raise ValueError(f"{header}: argument {declaration.strip()!r} of unknown type")
    return {"entry": entry[1], "init": init[1], "load_to_device": load[1],
            "arguments": arguments}


def link(obj: Path, out: Path, dialect_runtime: Path, cudart_static: Path) -> Path:
    """``obj`` + the static runtimes -> a shared library that needs only libc and libcuda
    (which CUDA's static runtime opens at run time)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ or c++) to link the exported port")
    done = subprocess.run([compiler, "-shared", "-o", str(out), str(obj), str(dialect_runtime),
                           str(cudart_static), *RUNTIME_LIBS, "-Wl,--no-undefined"],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"linking {out.name} failed: {done.stderr.strip()[-2000:]}")
    return out


def tensor_struct(shapes: int, strides: int) -> type[ctypes.Structure]:
    """The C struct the export passes a tensor as: data, its dynamic shapes, its dynamic
    (non-unit) strides in elements."""
    fields = [("data", ctypes.c_void_p), ("dynamic_shapes", ctypes.c_int32 * shapes)]
    if strides:
        fields.append(("dynamic_strides", ctypes.c_int64 * strides))
    return type(f"Tensor{shapes}x{strides}", (ctypes.Structure,), {"_fields_": fields})


def tensor_value(argument: dict[str, Any], pointer: int, shape: tuple[int, ...],
                 strides: tuple[int, ...]) -> ctypes.Structure:
    """One tensor argument for a buffer at ``pointer`` (``shape``, ``strides`` in elements,
    the last one unit, as the port was compiled): every extent, every stride but the last."""
    dynamic = list(strides[:-1])
    if strides[-1] != 1 or len(shape) != argument["shapes"] \
            or len(dynamic) != argument["strides"]:
        raise ValueError(f"{argument['name']}: shape {shape} strides {strides} do not fit "
                         f"{argument['shapes']} dynamic extents and {argument['strides']} "
                         "dynamic strides")
    struct = tensor_struct(argument["shapes"], argument["strides"])(pointer, (*shape,))
    if argument["strides"]:
        struct.dynamic_strides[:] = dynamic
    return struct


class Launcher:
    """The exported port in a process: its kernels loaded on every device, one launch per
    call. Errors come back as RuntimeError naming the CUDA error code."""

    def __init__(self, library: str, abi: dict[str, Any], devices: int):
        self.abi = abi
        self._lib = ctypes.CDLL(library)
        self._entry = getattr(self._lib, abi["entry"])
        self._entry.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32]
        self._module = ctypes.c_void_p()
        self._module_ptr = ctypes.pointer(self._module)
        ret = ctypes.c_int(0)
        init_args = (ctypes.c_void_p * 2)(ctypes.addressof(self._module_ptr),
                                          ctypes.addressof(ret))
        getattr(self._lib, abi["init"])(init_args)
        self._check(ret.value, "module init")
        for index in range(devices):
            device = ctypes.c_int32(index)
            load_args = (ctypes.c_void_p * 3)(ctypes.addressof(self._module_ptr),
                                              ctypes.addressof(device), ctypes.addressof(ret))
            getattr(self._lib, abi["load_to_device"])(load_args)
            self._check(ret.value, f"load to device {index}")

    @staticmethod
    def _check(code: int, what: str) -> None:
        if code:
            raise RuntimeError(f"exported port: {what} failed with CUDA error {code}")

    def arguments(self, values: list[Any]) -> list[Any]:
        """ctypes values for ``values`` (tensor structs, or Python numbers in ABI order)."""
        out = []
        for argument, value in zip(self.abi["arguments"], values, strict=True):
            out.append(value if argument["kind"] == "tensor" else
                       _SCALARS[argument["kind"]](value))
        return out

    def __call__(self, values: list[Any]) -> None:
        """Launch once with ``values`` from ``arguments``."""
        ret = ctypes.c_int32(0)
        pointers = [ctypes.addressof(v) for v in values] + [ctypes.addressof(ret)]
        args = (ctypes.c_void_p * len(pointers))(*pointers)
        self._entry(args, len(pointers))
        self._check(ret.value, "launch")
