"""`flashgen.attention`'s hooks: a call's aux values as NumPy arrays (checked, then copied to
the GPU with the range summaries of the tables a mask reads at ranges of indices, built on the
host) or GPUArrays (used in place; no summaries, so their tile verdicts do without: correct,
slower where a document mask would skip tiles), and what the launch takes of them: the
signature part (layouts, not addresses) and each call's `HookArgs`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashgen.generator.features.hook import HookArgs, Slot, summary_slots, token_of
from flashgen.generator.hooks import Hook
from flashgen.generator.hooks.summary import summarize
from flashgen.runtime.hook_calls import aux_slots, empty_table, scalar

_NP_DTYPES = {"int32": np.dtype(np.int32), "float32": np.dtype(np.float32)}


@dataclass(frozen=True)
class HookedCall:
    """A call's hooks and aux values on the device: `values` by aux name (GPUArrays and
    scalars), `summaries` by table name (GPUArrays of `summary.summarize`'s layout)."""

    hooks: tuple[Hook, ...]
    values: Mapping[str, Any]
    summaries: Mapping[str, Any]

    @property
    def tokens(self) -> tuple[str, ...]:
        """The hooks' feature tokens, score_mod first."""
        return tuple(token_of(h) for h in self.hooks)

    def key(self) -> tuple[Any, ...]:
        """What a remembered signature must match: the hooks, each array's shape, strides,
        dtype and alignment, each scalar's value (addresses are per call: `args`)."""

        def part(v: Any) -> Any:
            if hasattr(v, "gpudata"):
                return (v.shape, v.strides, v.dtype, int(v.gpudata) & 15)
            return v

        return (
            self.tokens,
            tuple((n, part(v)) for n, v in sorted(self.values.items())),
            tuple((n, part(v)) for n, v in sorted(self.summaries.items())),
        )

    def args(self) -> HookArgs:
        """The launcher's aux values for this call (device pointers, scalars, summaries)."""
        values: dict[str, Any] = {}
        for name, v in self.values.items():
            if not hasattr(v, "gpudata"):
                values[name] = v
            elif len(v.shape) == 2:
                values[name] = (int(v.gpudata), v.strides[0] // v.dtype.itemsize)
            else:
                values[name] = int(v.gpudata)
        summaries = {
            name: (int(s.gpudata), int(self.values[name].shape[0]))
            for name, s in self.summaries.items()
        }
        return HookArgs(self.hooks, values, summaries)


def host_call(
    hooks: tuple[Hook, ...], aux: Mapping[str, Any] | None, to_device: Callable[[Any], Any]
) -> Callable[[], HookedCall]:
    """Check NumPy aux values against the hooks now (ValueError naming value and rule); the
    returned function copies them and their tables' range summaries to the GPU (`to_device`),
    for after the whole call is validated."""
    values = dict(aux or {})
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, float | int] = {}
    for s in aux_slots(hooks, values):
        v = values[s.aux.name]
        if s.kind == "ptr":
            arrays[s.aux.name] = _host_array(s, v)
        else:
            scalars[s.aux.name] = scalar(s, v)
    summarized = {s.aux.name for s in summary_slots(hooks)}
    for name in summarized:
        if arrays[name].size == 0:
            raise ValueError(empty_table(name))
    tables = {n: summarize(a, n).table for n, a in arrays.items() if n in summarized}

    def upload() -> HookedCall:
        on_gpu = {n: to_device(a) for n, a in arrays.items()}
        return HookedCall(
            hooks, {**on_gpu, **scalars}, {n: to_device(t) for n, t in tables.items()}
        )  # fmt: skip

    return upload


def device_call(hooks: tuple[Hook, ...], aux: Mapping[str, Any] | None) -> HookedCall:
    """Check GPUArray aux values (and scalars) against the hooks; ValueError otherwise."""
    values = dict(aux or {})
    checked: dict[str, Any] = {}
    for s in aux_slots(hooks, values):
        v = values[s.aux.name]
        checked[s.aux.name] = _device_array(s, v) if s.kind == "ptr" else scalar(s, v)
    for s in summary_slots(hooks):
        if 0 in checked[s.aux.name].shape:
            raise ValueError(empty_table(s.aux.name))
    return HookedCall(hooks, checked, {})


def _host_array(slot: Slot, v: Any) -> np.ndarray:
    a = slot.aux
    if hasattr(v, "gpudata") or not isinstance(v, np.ndarray):
        raise ValueError(
            f"aux {a.name}: a {type(v).__name__}; with NumPy q, k, v pass it as a NumPy array "
            "(or all of them as GPUArrays)"
        )
    _check_kind(slot, v.dtype, v.ndim)
    return np.ascontiguousarray(v)


def _device_array(slot: Slot, v: Any) -> Any:
    a = slot.aux
    if not hasattr(v, "gpudata"):
        raise ValueError(
            f"aux {a.name}: a {type(v).__name__}; with GPUArray q, k, v pass it as a GPUArray "
            "(or all of them as NumPy arrays)"
        )
    _check_kind(slot, np.dtype(v.dtype), len(v.shape))
    item = np.dtype(v.dtype).itemsize
    if v.strides[-1] != item or (a.ndim == 2 and v.strides[0] < v.shape[1] * item):
        raise ValueError(f"aux {a.name}: its last axis must be contiguous; copy it first")
    return v


def _check_kind(slot: Slot, dtype: np.dtype[Any], ndim: int) -> None:
    a = slot.aux
    if dtype != _NP_DTYPES[a.dtype] or ndim != a.ndim:
        raise ValueError(
            f"aux {a.name}: {dtype} with {ndim} dimensions; the hook declares {a.dtype} with "
            f"{a.ndim}: pass np.asarray({a.name}, np.{a.dtype})"
        )
