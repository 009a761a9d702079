"""The storage dtypes flashgen supports: one table, never spelled elsewhere."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DTypeInfo:
    """Everything the generator, runtime and oracle need to know about one storage dtype."""

    name: str  # spelling in spec names, the CLI and the API
    ctype: str  # C++ element type in generated code
    header: str | None  # header that declares ctype (None: built in)
    numpy_type: str  # "module.name" of the NumPy scalar type holding the storage values
    itemsize: int  # bytes per element
    to_float: str  # device function converting one element to float
    from_float: str  # device function converting one float to the element type
    tensor_core: bool  # usable as an mma.sync / wgmma operand

    @property
    def numpy(self) -> type:
        """The NumPy scalar type holding the storage values. Imported on first use: bfloat16's
        (ml_dtypes) costs ~0.7 s to import, which rendering and compiling never need."""
        module, _, attr = self.numpy_type.rpartition(".")
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


DTYPES: dict[str, DTypeInfo] = {
    "fp32": DTypeInfo("fp32", "float", None, "numpy.float32", 4, "", "", False),
    "fp16": DTypeInfo(
        "fp16", "__half", "cuda_fp16.h", "numpy.float16", 2, "__half2float", "__float2half_rn",
        True,
    ),
    "bf16": DTypeInfo(
        "bf16",
        "__nv_bfloat16",
        "cuda_bf16.h",
        "ml_dtypes.bfloat16",
        2,
        "__bfloat162float",
        "__float2bfloat16_rn",
        True,
    ),
}


def dtype_info(name: str) -> DTypeInfo:
    """Return the table row for dtype `name`; raise KeyError naming the choices otherwise."""
    try:
        return DTYPES[name]
    except KeyError:
        raise KeyError(f"dtype={name!r}: unknown; choose one of {', '.join(DTYPES)}") from None


def dtype_of_array(dt: np.dtype) -> str | None:
    """Map a NumPy dtype to a flashgen dtype name, or None when it is not supported."""
    for info in DTYPES.values():
        if np.dtype(info.numpy) == dt:
            return info.name
    return None
