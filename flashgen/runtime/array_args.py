"""The PyCUDA-side front doors' arrays (`flashgen.attention_with_kvcache`,
`flashgen.attention_varlen`): which kind a call's arrays are, their device pointers, and the
checks of an array feature's device value.

A call's arrays are all NumPy (copied to the GPU, outputs copied back), all device arrays
(PyCUDA GPUArrays, CUDA-array-interface objects: used in place), or all torch tensors (passed
to `flashgen.torch`); a mix is one ValueError naming each array's type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flashgen.generator.features import Feature
from flashgen.runtime import feature_values
from flashgen.runtime.validate import ArrayInfo, cai_stream, describe

HOST, DEVICE, TORCH = "host", "device", "torch"


def _kind(x: Any) -> str | None:
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return HOST
    if type(x).__module__.split(".")[0] == "torch":
        return TORCH
    if hasattr(x, "gpudata") or hasattr(x, "__cuda_array_interface__"):
        return DEVICE
    return "other"


def kind_of(names: Sequence[str], arrays: Sequence[Any], torch_call: str) -> str:
    """HOST, DEVICE or TORCH: the one kind of the arrays given (None entries: not given);
    ValueError for an object that is not an array or for a mix. `torch_call` names the torch
    front door a call of torch tensors goes to."""
    for name, x in zip(names, arrays, strict=True):
        if _kind(x) == "other":
            raise ValueError(
                f"{name}={type(x).__name__}: not an array; pass a NumPy array, or a GPUArray "
                f"(CUDA array) when {names[0]} is on the GPU"
            )
    kinds = {k for k in map(_kind, arrays) if k is not None}
    if len(kinds) > 1:
        said = ", ".join(
            f"{n}={type(x).__name__}" for n, x in zip(names, arrays, strict=True) if x is not None
        )
        fix = (f"torch tensors ({torch_call})" if TORCH in kinds
               else "GPUArrays")  # fmt: skip
        raise ValueError(f"{said}: mixed kinds of arrays; pass every one as NumPy or as {fix}")
    return kinds.pop() if kinds else HOST


def host_info(name: str, x: np.ndarray) -> ArrayInfo:
    """A NumPy array's description without its host address (the front doors copy it to the
    GPU before use, so its host alignment is not the kernel's)."""
    return dataclasses.replace(describe(name, np.ascontiguousarray(x)), ptr=None)


def _empty(shape: Sequence[int]) -> bool:
    return any(n == 0 for n in shape)


def device_ptr(x: Any) -> int:
    """A device array's address; 0 (NULL) for None or an empty array (never read)."""
    if x is None:
        return 0
    a = describe("array", x)
    if a.ptr is None:
        assert _empty(a.shape)  # require_pointers refused any other array without one
        return 0
    return a.ptr


def require_pointers(names: Sequence[str], arrays: Sequence[Any]) -> None:
    """ValueError for a non-empty device array (not None) whose pointer cannot be read."""
    for name, x in zip(names, arrays, strict=True):
        if x is not None:
            a = describe(name, x)
            if a.ptr is None and not _empty(a.shape):
                raise ValueError(f"{name}: no device pointer; pass GPUArrays or CUDA arrays")


def feature_key(array: Any) -> tuple[Any, ...]:
    """What a remembered signature must match of an array feature's value (pointer, shape,
    strides, dtype: the pointer alone would let a view at the same address skip its checks).
    TypeError for a value that is not a PyCUDA GPUArray: such a call is not remembered (its
    pointer could change under the same key), and validation names a wrong one."""
    if getattr(array, "gpudata", None) is None:
        raise TypeError("not a GPUArray")
    return (int(array.gpudata), tuple(array.shape), tuple(array.strides), np.dtype(array.dtype))


def producer_streams(named: Sequence[tuple[str, Any]], values: feature_values.Values) -> list[
    int | None
]:
    """The CUDA-array-interface producer streams of a call's arrays and array features, which
    its launch must wait for (`launch.wait_for_streams`)."""
    arrays = [*named, *((f.keyword, v) for f, v in feature_values.arrays(values))]
    return [cai_stream(n, x) for n, x in arrays if x is not None]


def feature_pointer(heads: int) -> Callable[[Feature, Any], int]:
    """`feature_values.bind`'s pointer function for device calls with `heads` query heads: the
    feature's shape and dtype rule, contiguous, a device array, aligned as the kernel loads."""

    def pointer(feature: Feature, array: Any) -> int:
        a = describe(feature.keyword, array)
        if a.ptr is None or isinstance(array, np.ndarray):
            raise ValueError(
                f"{feature.keyword}={type(array).__name__}: with device inputs pass it as a "
                "device array too (or every array as NumPy)"
            )
        feature.check_array(a.shape, a.dtype, heads)
        if a.shape and a.shape[-1] > 1 and a.strides[-1] != a.dtype.itemsize:
            raise ValueError(f"{feature.keyword}: must be contiguous; copy it first")
        feature.check(a.ptr)
        return a.ptr

    return pointer


def signature_key(
    arrays: Sequence[Any], scalars: tuple[Any, ...], values: feature_values.Values
) -> tuple[Any, ...] | None:
    """The key a validated device call is remembered by: each array's shape, strides, dtype
    and pointer alignment (the pointers themselves come with every call), the scalars with
    their types (1 and True are equal keys otherwise) and the feature values (an array one by
    `feature_key`). None -- validate this call -- when an array or array feature is not a
    PyCUDA GPUArray (a CUDA-array-interface object is checked every call, its stream waited
    for), an array is empty, or a value is unhashable (validation then names it)."""
    try:
        key = (
            *(None if x is None else (x.shape, x.strides, x.dtype, int(x.gpudata) & 15)
              for x in arrays),
            *((type(v), v) for v in scalars), feature_values.signature(values, feature_key),
        )  # fmt: skip
        hash(key)
    except (AttributeError, TypeError):  # not GPUArrays (or empty ones), or unhashable
        return None
    return key
