"""Bundles: a self-contained folder a C/C++/CUDA project drops in, with no Python at all.

A bundle holds the rendered kernels (`kernels/<kernel>.cu`, exactly what `flashgen build`
writes), a host launcher with a C ABI (`flashgen_launch.cu`), its header
(`flashgen_attention.h`, usable from C and C++), a `CMakeLists.txt` building the static
library `flashgen_kernels` and an `example` program that checks every variant against a CPU
reference, and a README. Every file is rendered from `templates/bundle/*.j2`.

`bundle_files(specs)` is pure (returns {relative path: text}, byte-deterministic);
`write_bundle(files, out)` writes them, only inside `out`. `select_variants(...)` turns the
`flashgen bundle` filters into one variant per (d, dtype, causal), the key the dispatch
function `flashgen_fwd` picks a variant by.

Backward variants (direction "bwd", family mma: `templates/mma_bwd.cu.j2`, or wgmma:
`templates/wgmma_bwd.cu.j2`; three kernels `<name>_pre`, `<name>`, `<name>_post`) bundle beside
forward ones, one per (d, dtype, causal) of their own: the header gains `flashgen_bwd_params`,
the dispatch `flashgen_bwd` and per variant `<symbol>_bwd` and `<symbol>_bwd_workspace_bytes`
(the fp32 scratch the caller provides, laid out as `backward.scratch_shapes` says: d_buf, then
the dQ accumulator, `bwd_workspace_layout`; `flashgen_bwd_workspace_bytes` returns the most any
variant of that head dim needs); the launcher validates as `backward.validate_backward` does,
then launches the three kernels in order on the stream with `BackwardProblem.grids`'s grids. The
kernels take the forward's four feature values last (backward.ABI_FORMAT); the launcher passes
them off (-1, -1, 0.0f, NULL), and backward variants with features are not bundled yet.

Varlen forward variants (family wgmma with `varlen`: packed sequences, `abi.VARLEN` after the
features) get `flashgen_varlen_params`, the dispatch `flashgen_varlen_fwd` and per variant
`<symbol>_fwd`/`_check`/`_device_check` on those params: the launcher checks them as a dense call
of one batch over the packed totals (what flashgen.varlen binds), encodes the maps over the
totals and sizes the grid as `VarlenPersistent.varlen_grid` does, never reading cu_seqlens.
Decode variants (family mma, direction "decode": `abi.DECODE`) get `flashgen_decode_params`,
`flashgen_decode` and `flashgen_decode_workspace_bytes`, and per variant `<symbol>_decode`,
`_decode_check`, `_decode_workspace_bytes`, `_decode_device_check`: the split count as
`runtime.decode_call.choose_launch` takes it for the variant (`choose_splits` over the SMs times
the occupancy the runtime reports; with the merge kernel, DECODE_MIN_TILES_PER_WARP_MERGED tiles
per warp while every block keeps an SM), the split scratch of `scratch_sizes` in the caller's
workspace (`decode_workspace_layout`). A kernel binary built for sm_90 or newer (as
`cudaFuncGetAttributes` reports it: SASS and PTX both; asked once per variant and device)
launches as `DecodeLaunch` does on sm_90: the decode kernel as a programmatic dependent
(`cudaLaunchKernelEx`), and with splits given counters = NULL, then its merge kernel
`<name>_combine` (`abi.DECODE_COMBINE`) as a programmatic dependent on the same stream; an older
binary gets plain launches, and with splits zeroes the counters on the stream and merges in
the one launch.

Family `wgmma` (Hopper, sm_90a) takes three `CUtensorMap`s ahead of the common C ABI (its
backward four: Q, K, V and dO). Its C launcher builds them itself with the driver's
`cuTensorMapEncodeTiled`, fetched at run time through the CUDA runtime
(`cudaGetDriverEntryPoint*`), so the library still links without `-lcuda`; the maps follow
`tma.py` (the Python path) field for field. Its kernels are compiled for sm_90a only, in an
object library of their own (`FLASHGEN_WGMMA_GENCODE`), and its launchers refuse any GPU other
than compute capability 9.0 with `cudaErrorInvalidDeviceFunction`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flashgen._version import __version__
from flashgen.generator import abi
from flashgen.generator.arch import ARCHS, STATIC_SMEM_LIMIT, runs_on
from flashgen.generator.backward import kernel_names, pre_rows, scratch_rows, scratch_shapes
from flashgen.generator.cache import atomic_write
from flashgen.generator.dtypes import DTYPES
from flashgen.generator.families import FAMILIES
from flashgen.generator.families.mma.decode import DECODE_MERGE_MAX, combine_name
from flashgen.generator.features import RUNTIME_FEATURES, TOKENS
from flashgen.generator.features.hook import (
    MAX_POINTERS,
    HookNotRegistered,
    Slot,
    call_args,
    hook_tokens,
    hooks_of,
    map_slot,
    slots,
    summary_slots,
)
from flashgen.generator.hooks import Hook, emit_hook, evaluate_hook, helpers
from flashgen.generator.hooks.expr import postorder, to_text
from flashgen.generator.numerics import LOG2E as LOG2E_FLOAT
from flashgen.generator.render import environment, render
from flashgen.generator.select import select
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.runtime.decode import (
    COMBINE_THREADS,
    DECODE_MAX_SPLITS,
    DECODE_MIN_TILES_PER_WARP,
    DECODE_MIN_TILES_PER_WARP_MERGED,
    DECODE_WAVES,
    row_tiles,
    scratch_sizes,
)
from flashgen.runtime.tma import (
    BOX_COLS,
    L2_PROMOTION_128B,
    SWIZZLE_128B,
    TMA_DTYPE,
    TMA_STRIDE_LIMIT,
)
from flashgen.runtime.validate import MAX_LENGTH
from flashgen.verify.oracle_bwd import CANCEL_ULPS, GRAD_EPS_ULPS, GRAD_FACTOR

HEADER = "flashgen_attention.h"
LAUNCHER = "flashgen_launch.cu"
KERNEL_DIR = "kernels"
# output file -> template under templates/
TEMPLATES: dict[str, str] = {
    HEADER: "bundle/flashgen_attention.h.j2",
    LAUNCHER: "bundle/flashgen_launch.cu.j2",
    "example.cu": "bundle/example.cu.j2",
    "CMakeLists.txt": "bundle/CMakeLists.txt.j2",
    "README.md": "bundle/README.md.j2",
}
NAME_PREFIX = "flash_fwd_"  # dropped from kernel names in the C symbols: flashgen_<short>_fwd
# ... and per direction: a backward variant's C functions are flashgen_<short>_bwd
NAME_PREFIXES = {"fwd": NAME_PREFIX, "bwd": "flash_bwd_", "decode": "flash_decode_"}
KERNEL_GLOB = "flash_*.cu"  # every kernel file a bundle may hold
# The caller's fp32 workspace of a backward call: d_buf, then the dQ accumulator at the next
# multiple of this many bytes (its float4 accesses and bulk reductions), and the workspace
# pointer itself aligned to it (`bwd_workspace_layout`).
BWD_WORKSPACE_ALIGN = 16
LOG2E = repr(LOG2E_FLOAT)  # scale -> scale_log2, as the Python runtime does
# The example's problems: ragged lengths that are not multiples of any tile; causal variants
# also run Tq > Tk, where the first Tq - Tk query rows see no key (O = 0, LSE = -inf).
# Each is (B, H, Tq, Tk, H_kv); the GQA problem has 4 query heads per K/V head.
EXAMPLE_PROBLEM = (2, 3, 77, 131, 3)
EXAMPLE_CAUSAL_TALL = (2, 3, 131, 77, 3)
EXAMPLE_GQA = (1, 8, 65, 97, 2)
# The example's pass bounds for unit-normal inputs: max abs error of O for 16-bit storage
# (bf16 keeps 8 significant bits: O of magnitude ~3 rounds by up to 0.008), relative error
# (Frobenius) of O for fp32, max abs error of the natural-log LSE.
# The feature values the example runs a feature variant with: a window of 17 keys back (and 3
# ahead when not causal), a softcap of 30, ALiBi slopes 0.5 * 2^(-8 (h + 1) / H)
EXAMPLE_WINDOW = {False: (17, 3), True: (17, 0)}
EXAMPLE_SOFTCAP = "30.0"
EXAMPLE_ALIBI = "0.5"
EXAMPLE_O_BOUND = {"fp32": "1e-4", "fp16": "2e-2", "bf16": "2e-2"}
# The example's varlen problems: given (query, key) lengths -- an empty sequence, a single
# row, a sequence with more queries than keys (causal: its first rows see nothing) -- over
# (H, H_kv) = (4, 2) heads, with 3 query and 2 key rows after the last sequence; and 24
# sequences of random lengths up to 150 over 8 heads, enough query tiles for persistent blocks
EXAMPLE_VARLEN_LENGTHS = ((77, 131), (1, 64), (0, 5), (131, 77), (40, 40))
EXAMPLE_VARLEN_GIVEN: dict[str, Any] = {"heads": 4, "kv_heads": 2, "pad_q": 3, "pad_k": 2}
EXAMPLE_VARLEN_RANDOM: dict[str, Any] = {"heads": 8, "kv_heads": 8, "n_random": 24, "longest": 150}
# The example's decode problems: (B, Tq, H, H_kv, cache columns, page size (0: contiguous),
# cache_seqlens (None: the whole cache), num_splits (0: the launcher's choice)). Paged caches of
# 16- and 7-key pages in shuffled order, lengths that differ (0: O = 0, LSE -inf; causal with
# L < Tq: rows that see nothing), a split merge in one level and in two (20 splits).
EXAMPLE_DECODE = (
    (3, 1, 8, 2, 25, 16, (400, 37, 0), 0),
    (3, 4, 8, 2, 57, 7, (293, 399, 2), 20),
    (2, 3, 4, 4, 150, 0, None, 3),
)
EXAMPLE_LSE_BOUND = "1e-3"
# The backward example judges dQ, dK and dV with flashgen's gradient rule (oracle_bwd.
# check_grads, FlashAttention's): max|g - g64| <= GRAD_FACTOR * max|g_ref - g64| + eps, g64 in
# float64, g_ref a same-precision reference, eps = GRAD_EPS_ULPS storage ulps at max|g64| +
# CANCEL_ULPS fp32 ulps of the cancellation in dS (see oracle_bwd).
# A hooked variant's example problems, (B, H, Tq, Tk, H_kv): square, as packed training is (a
# document mask indexes one doc_ids table with queries and keys), ragged against every tile;
# the second grouped-query. The generic aux values the example fills each slot kind with:
# int32 tensors random sorted segment ids (documents of ~1 / EXAMPLE_DOC_BREAK tokens), float32
# tensors uniform in [0, 0.5) (slopes, biases), scalars these numbers (a cap, a window side or
# prefix); tensors of max(Tq, Tk, H, B) elements per row (2-D: as many rows).
EXAMPLE_HOOK_PROBLEMS = ((2, 3, 131, 131, 3), (1, 8, 97, 97, 2))
EXAMPLE_DOC_BREAK = "0.05"
EXAMPLE_AUX_FLOAT = "30.0"
EXAMPLE_AUX_INT = 17
# cuda.h's names of tma.TMA_DTYPE (the launcher static_asserts that they agree)
TMA_DTYPE_ENUM = {
    "fp16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
    "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
}
# Tensor-map strides must be multiples of this many bytes (cuTensorMapEncodeTiled's rule).
TMA_STRIDE_ALIGN = 16


class BundleError(ValueError):
    """A bundle request that cannot be honoured; the message names value, rule and fix."""


@dataclass(frozen=True)
class Variant:
    """One kernel of a bundle and everything its templates need."""

    spec: KernelSpec

    @property
    def short(self) -> str:
        """The kernel name without `flash_fwd_` (`flash_bwd_`): the middle of the C symbols."""
        return self.spec.name.removeprefix(NAME_PREFIXES[self.spec.direction])

    @property
    def symbol(self) -> str:
        """Prefix of this variant's C functions: `<symbol>_fwd`, `<symbol>_check` (forward);
        `<symbol>_bwd`, `<symbol>_bwd_check` (backward)."""
        return f"flashgen_{self.short}"

    def _common(self) -> dict[str, Any]:
        """The values both directions' templates use."""
        s = self.spec
        info = s.dtype_info
        return {
            "kernel": s.name,
            "symbol": self.symbol,
            "file": f"{KERNEL_DIR}/{s.name}.cu",
            "direction": s.direction,
            "family": s.family,
            "d": s.d,
            "dv": s.dv,
            "dv_text": f" dv={s.dv}" if s.dv != s.d else "",
            "br": s.br,
            "bc": s.bc,
            "warps": s.warps,
            "stages": s.stages,
            "threads": s.threads,
            "smem_bytes": s.smem_bytes,
            # a forward that stores O with the TMA (wgmma, O_TMA_STORE): O's map, 64-row boxes
            # (varlen: over the packed rows, as Q's; its stride check names the packed layout)
            "o_map": s.direction == "fwd" and any(p.name == "tm_o" for p in s.fam.fwd_prefix_of(s)),
            "varlen": "varlen" in s.features,
            "needs_opt_in": s.smem_bytes > STATIC_SMEM_LIMIT,
            # more than the smallest GPU of a shipped arch lets a block use (sm_86/89/120: 99
            # KiB): the launcher checks the device before it opts in
            "over_small_gpus": s.smem_bytes > min(a.smem_per_block for a in ARCHS.values()),
            "dtype": s.dtype,
            "dtype_enum": dtype_enum(s.dtype),
            "ctype": info.ctype,
            "elem_bytes": info.itemsize,
            "causal": s.causal,
            "causal_int": int(s.causal),
            "mask": "causal" if s.causal else "non-causal",
            "align_elems": s.align_elems,
            "align_bytes": s.align_elems * info.itemsize,
            "align_text": (
                f"{s.align_elems} element{'s' if s.align_elems > 1 else ''} "
                f"({s.align_elems * info.itemsize} B)"
            ),
            "archs": ", ".join(s.archs),
            "math": _math_text(s),
            "min_cc": _min_cc(s),
            "exact_cc": _arch_specific(s),
            "cc_text": _cc_text(s),
        }

    def context(self) -> dict[str, Any]:
        """The values the bundle templates use for this variant (no arithmetic in templates)."""
        if self.spec.direction == "bwd":
            return self.bwd_context()
        if self.spec.direction == "decode":
            return self.decode_context()
        if "varlen" in self.spec.features:
            return self.varlen_context()
        s = self.spec
        info = s.dtype_info
        feats = [f for f in s.features if f not in hook_tokens(s.features)]  # hooks: apart
        return {
            **self._common(),
            "features": feats,
            "features_list": ", ".join(feats) or "none",
            "features_text": "".join(f", {f}" for f in feats),
            "feature_bits": sum(FEATURE_BITS[f] for f in feats),
            "tensor_cores": info.tensor_core and s.fam.tensor_cores,
            "tma": s.fam.tensor_maps,
            "tma_enum": TMA_DTYPE_ENUM.get(s.dtype, ""),
            # the grid: its tile scheduler's C (templates/_scheduler.cuh.j2, generator/schedulers)
            "launch_grid_macro": s.fam.scheduler(s).launch_macro,
            # the kernel's parameters (generator/abi.py after the family's prefix)
            "kernel_params": abi.declarations(
                (*s.fam.fwd_prefix_of(s), *abi.FWD), elem=info.ctype, restrict=False
            ),
            "o_bound": EXAMPLE_O_BOUND[s.dtype],
            "ex_window": EXAMPLE_WINDOW[s.causal] if "window" in s.features else (-1, -1),
            "ex_use_window": int("window" in s.features),
            "ex_softcap": EXAMPLE_SOFTCAP if "softcap" in s.features else "0.0",
            "ex_alibi": EXAMPLE_ALIBI if "alibi" in s.features else "0.0",
            "o_relative": s.dtype == "fp32",
            "problems": [
                EXAMPLE_PROBLEM,
                *([EXAMPLE_CAUSAL_TALL] if s.causal else []),
                EXAMPLE_GQA,
            ],
            **self._hook_context(),
        }

    def _hook_context(self) -> dict[str, Any]:
        """A hooked forward's template values (none for any other variant): its hooks, their
        aux slots, the kernel's full parameter list (the aux block after the forward's), and
        the example's square problems. `hook` is what tells the templates a variant apart."""
        s = self.spec
        tokens = hook_tokens(s.features)
        if not tokens:
            return {"hook": None}
        hooks = hooks_of(s.features)
        ctx = hook_set_context(tokens, hooks)
        problems = list(EXAMPLE_HOOK_PROBLEMS)
        return {
            "hook": ctx,
            "kernel_params": abi.declarations(
                (*s.fam.fwd_prefix_of(s), *abi.forward(s.features)),
                elem=s.dtype_info.ctype,
                restrict=False,
            ),
            "problems": problems,
            # the example's generic aux tables reach every index the hooks read on its
            # problems (checked here with the float64 evaluator), else it runs no problem
            "ex_runnable": all(_example_aux_fits(hooks, ctx["slots"], pb) for pb in problems),
        }

    def _feature_context(self) -> dict[str, Any]:
        """The run-time features of a forward-like variant (forward, varlen, decode): what it
        is compiled with, its dispatch bits, and the values the example runs it with."""
        s = self.spec
        runtime = [f for f in s.features if f in FEATURE_BITS]
        return {
            "features": runtime,
            "features_list": ", ".join(runtime) or "none",
            "features_text": "".join(f", {f}" for f in runtime),
            "feature_bits": sum(FEATURE_BITS[f] for f in runtime),
            "o_bound": EXAMPLE_O_BOUND[s.dtype],
            "ex_window": EXAMPLE_WINDOW[s.causal] if "window" in s.features else (-1, -1),
            "ex_use_window": int("window" in s.features),
            "ex_softcap": EXAMPLE_SOFTCAP if "softcap" in s.features else "0.0",
            "ex_alibi": EXAMPLE_ALIBI if "alibi" in s.features else "0.0",
        }

    def varlen_context(self) -> dict[str, Any]:
        """A varlen forward's template values (family wgmma: packed sequences, `abi.VARLEN`
        after the features, the varlen_persistent grid)."""
        s = self.spec
        info = s.dtype_info
        return {
            **self._common(),
            **self._feature_context(),
            "tma": s.fam.tensor_maps,
            "tma_enum": TMA_DTYPE_ENUM.get(s.dtype, ""),
            "kernel_params": abi.declarations(
                (*s.fam.fwd_prefix_of(s), *abi.forward(s.features)), elem=info.ctype, restrict=False
            ),
            "problems": [
                _varlen_problem(EXAMPLE_VARLEN_LENGTHS, **EXAMPLE_VARLEN_GIVEN),
                _varlen_problem((), **EXAMPLE_VARLEN_RANDOM),
            ],
        }

    def decode_context(self) -> dict[str, Any]:
        """A decode variant's template values (family mma: `abi.DECODE`, grid (splits, row
        tiles x K/V heads, B), the split scratch in the caller's workspace)."""
        s = self.spec
        return {
            **self._common(),
            **self._feature_context(),
            "tma": False,
            "kernel_params": abi.declarations(abi.DECODE, elem=s.dtype_info.ctype, restrict=False),
            # the split merge as a kernel of its own (sm_90 binaries), in the same kernel file
            "combine_kernel": combine_name(s),
            "combine_params": abi.declarations(
                abi.DECODE_COMBINE, elem=s.dtype_info.ctype, restrict=False
            ),
            "problems": [_decode_problem(s, *pb) for pb in EXAMPLE_DECODE],
        }

    def bwd_context(self) -> dict[str, Any]:
        """A backward variant's template values: its three kernels, their grids' row blocks,
        and what the example judges it with."""
        s = self.spec
        pre, main, post = kernel_names(s)
        row_tile, planes = scratch_geometry(s)
        return {
            **self._common(),
            "pre_kernel": pre,
            "post_kernel": post,
            "pre_rows": pre_rows(s),
            "kernel_params": abi.declarations(
                (*s.fam.bwd_prefix, *abi.BWD), elem=s.dtype_info.ctype, restrict=False
            ),
            "tma": s.fam.tensor_maps,
            "tma_enum": TMA_DTYPE_ENUM.get(s.dtype, ""),
            # the workspace: rows per head Tq rounded up to ws_row_tile, ws_planes floats of
            # d_buf per row (scratch_geometry)
            "ws_row_tile": row_tile,
            "ws_planes": planes,
            "ws_text": _workspace_text(s),
            # one storage ulp at 1: the gradient rule's eps is that times max|g64|
            "machine_eps": repr(machine_eps(s.dtype)),
            "problems": [
                EXAMPLE_PROBLEM,
                *([EXAMPLE_CAUSAL_TALL] if s.causal else []),
                EXAMPLE_GQA,
            ],
        }


def hook_set_name(tokens: Sequence[str]) -> str:
    """The C name of a set of hooks: its tokens joined (`maskmod2575019a4012`); hooked
    variants of one set share its aux macros and its dispatch `flashgen_<set>_fwd`."""
    return "_".join(tokens)


def hook_set_context(tokens: Sequence[str], hooks: Sequence[Hook]) -> dict[str, Any]:
    """What the templates say of a set of hooks: each hook's kind, readable expression and
    host C++ (the example's reference calls it), and each aux slot by name: its field of
    `flashgen_hook_aux`, its macro, what reads it."""
    name = hook_set_name(tokens)
    block = slots(hooks)
    ptrs = [sl for sl in block if sl.kind == "ptr"]
    summarized = {sl.index for sl in summary_slots(hooks)}
    mapped = map_slot(hooks)
    nulled = summarized | ({mapped} if mapped is not None else set())
    macro = f"FLASHGEN_{name.upper()}"
    return {
        "name": name,
        "macro": macro,
        "tokens": list(tokens),
        "hooks": [
            {
                "kind": h.kind,
                "token": t,
                "digest": h.digest,
                "label": h.name or "?",
                "text": to_text(h.expr),
                "host_name": f"host_{h.kind}_{h.digest}",
                # host-only: the example computes its reference with exactly this code
                "host_source": emit_hook(h, f"host_{h.kind}_{h.digest}", qualifiers="inline"),
                "host_args": host_args(h, block),
            }
            for t, h in zip(tokens, hooks, strict=True)
        ],
        "slots": [_slot_context(sl, hooks, macro) for sl in block],
        # the example's aux per pointer slot: 0 unused, 1 an int32 tensor, 2 a float32 one;
        # and its rank (MAX_POINTERS slots, as flashgen_hook_aux has)
        "ptr_types": [
            next((1 if sl.aux.dtype == "int32" else 2 for sl in ptrs if sl.index == i), 0)
            for i in range(MAX_POINTERS)
        ],
        "ptr_ndims": [
            next((sl.aux.ndim for sl in ptrs if sl.index == i), 0) for i in range(MAX_POINTERS)
        ],
        # the launcher's pointer arguments: a slot that holds a range summary or a block map
        # in the runtime's launches (summary_slots, map_slot) is NULL here, whatever the caller
        # left in it: the bundle's tile verdicts are made in the kernel, without summaries
        # (docs/hooks.md)
        "ptr_args": ", ".join(
            "nullptr" if i in nulled else f"aux->ptr[{i}]" for i in range(MAX_POINTERS)
        ),
    }


def host_args(hook: Hook, block: Sequence[Slot], aux: str = "aux") -> str:
    """The C arguments that pass `hook` its aux values out of a `flashgen_hook_aux` named
    `aux` (`, static_cast<const int*>(aux.ptr[0])`): what the kernel reads from its aux block,
    spelled on the C struct."""
    return call_args(hook, block, lambda kind, i: f"{aux}.{kind}[{i}]")


def _slot_context(sl: Slot, hooks: Sequence[Hook], macro: str) -> dict[str, Any]:
    """One aux slot as the header names it: the struct field it travels in, its macro, and
    the reads of it in the hooks' expressions (`doc_ids[q_idx], doc_ids[kv_idx]`)."""
    a = sl.aux
    field = f"{'ptr' if sl.kind == 'ptr' else sl.kind[0]}[{sl.index}]"
    reads = sorted(
        {
            to_text(n)
            for h in hooks
            for n in postorder(h.expr)
            if n.op in ("load", "scalar") and n.value.name == a.name
        }
    )
    users = [h.kind for h in hooks if any(x.name == a.name for x in h.aux)]
    shape = {0: "scalar", 1: "1-D device array", 2: "2-D device array"}[a.ndim]
    return {
        "name": a.name,
        "dtype": a.dtype,
        "ndim": a.ndim,
        "kind": sl.kind,
        "index": sl.index,
        "ctype": a.ctype,
        "field": field,
        "macro": f"{macro}_{a.name.upper()}",
        "text": f"{a.dtype} {shape}",
        "reads": ", ".join(reads) or "nothing (declared, never read)",
        "users": " and ".join(f"the {u}" for u in users),
    }


def _example_aux_fits(hooks: Sequence[Hook], block: Sequence[dict[str, Any]], pb: tuple[int, ...]
                      ) -> bool:  # fmt: skip
    """Whether the example's generic aux tables (EXAMPLE_* above) hold every index the hooks
    read on problem `pb`: the float64 evaluator raises IndexError for one out of range (zeros
    stand in for the random values; an index computed from aux values may still leave them,
    which the example's reference would then read out of range too)."""
    b, h, tq, tk, _ = pb
    n = max(tq, tk, h, b)
    values: dict[str, Any] = {}
    for sl in block:
        if sl["ndim"] == 0:
            values[sl["name"]] = (
                float(EXAMPLE_AUX_FLOAT) if sl["dtype"] == "float32" else EXAMPLE_AUX_INT
            )
        else:
            dt = np.int32 if sl["dtype"] == "int32" else np.float32
            values[sl["name"]] = np.zeros((n,) * sl["ndim"], dt)
    score = np.zeros((h, tq, tk))
    try:
        for hook in hooks:
            mine = {a.name: values[a.name] for a in hook.aux}
            for bi in range(b):
                evaluate_hook(hook, heads=range(h), tq=tq, tk=tk, b=bi, aux=mine,
                              score=score if hook.kind == "score_mod" else None)  # fmt: skip
    except IndexError:
        return False
    return True


def _varlen_problem(
    lengths: Sequence[tuple[int, int]], *, heads: int, kv_heads: int, n_random: int = 0,
    longest: int = 0, pad_q: int = 0, pad_k: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """One varlen problem of the example: its (query, key) lengths given, or `n_random`
    sequences of random lengths in [0, longest] drawn by the example; `pad_q` and `pad_k`
    rows after the last sequence's (O must come back zero there, LSE -inf)."""
    return {
        "n_seqs": len(lengths) or n_random,
        "lens_q": [q for q, _ in lengths],
        "lens_k": [k for _, k in lengths],
        "longest": longest,
        "heads": heads,
        "kv_heads": kv_heads,
        "pad_q": pad_q,
        "pad_k": pad_k,
    }


def _decode_problem(
    spec: KernelSpec, b: int, tq: int, h: int, h_kv: int, columns: int, page: int,
    seqlens: Sequence[int] | None, splits: int,
) -> dict[str, Any]:  # fmt: skip
    """One decode problem of the example: the cache holds `columns` keys per sequence
    (contiguous, page 0) or `columns` pages of `page` keys; `seqlens` per sequence, or None
    for the whole cache; `splits` forced (0: the launcher's choice). Also the workspace the
    launcher must ask for when the split count is forced (-1: chosen on the device)."""
    tk = columns * (page or 1)
    tiles = row_tiles(spec, tq, h // h_kv)
    ws = -1
    if splits:
        n = min(splits, max(1, min(DECODE_MAX_SPLITS, -(-tk // spec.bc))))
        ws = decode_workspace_layout(spec, b, h_kv, tiles, n)[-1]
    return {
        "B": b, "Tq": tq, "H": h, "H_kv": h_kv, "columns": columns, "page": page,
        "seqlens": list(seqlens) if seqlens is not None else [], "splits": splits,
        "workspace": ws,
    }  # fmt: skip


def decode_workspace_layout(
    spec: KernelSpec, b: int, h_kv: int, tiles: int, splits: int
) -> tuple[int, int, int]:
    """(byte offset of lse_part, byte offset of the counters, total bytes) of a decode call's
    workspace: `runtime.decode.scratch_sizes`'s o_part (fp32), lse_part (fp32) and counters
    (int32), each at a multiple of BWD_WORKSPACE_ALIGN bytes; 0 in all when one split (the
    kernel then stores O itself and touches no scratch). The launcher's
    `<symbol>_decode_workspace_bytes` computes the same."""
    if splits == 1:
        return 0, 0, 0
    n_o, n_l, n_c = scratch_sizes(spec, b, h_kv, tiles, splits)
    a = BWD_WORKSPACE_ALIGN
    lse_at = -(-n_o * 4 // a) * a
    counters_at = lse_at + -(-n_l * 4 // a) * a
    return lse_at, counters_at, counters_at + n_c * 4


def machine_eps(dtype: str) -> float:
    """The spacing of the storage dtype at 1 (np.finfo refuses bfloat16): 2^-7 for bf16."""
    return float(np.spacing(np.ones((), np.dtype(DTYPES[dtype].numpy))))


def scratch_geometry(spec: KernelSpec) -> tuple[int, int]:
    """(row tile, planes) of backward variant `spec`'s fp32 scratch, read off
    backward.scratch_shapes: its rows per head are Tq rounded up to the row tile (mma 1,
    wgmma BR) and d_buf holds `planes` floats per row (mma: D; wgmma: D and LSE*log2(e)).
    The launcher's bwd_workspace_layout takes these two numbers."""
    tile = scratch_rows(spec, 1)
    d_buf, _ = scratch_shapes(spec, 1, 1, 1, spec.d)
    return tile, math.prod(d_buf) // tile


def bwd_workspace_layout(spec: KernelSpec, b: int, h: int, tq: int) -> tuple[int, int]:
    """(byte offset of the dQ accumulator, total bytes) of a backward call's workspace with
    variant `spec`: backward.scratch_shapes's d_buf at offset 0, then its dQ accumulator at the
    next multiple of BWD_WORKSPACE_ALIGN bytes. The launcher's `<symbol>_bwd_workspace_bytes`
    computes the same."""
    d_buf, accum = scratch_shapes(spec, b, h, tq, spec.d)
    offset = -(-math.prod(d_buf) * 4 // BWD_WORKSPACE_ALIGN) * BWD_WORKSPACE_ALIGN
    return offset, offset + (0 if accum is None else math.prod(accum) * 4)


def _workspace_text(spec: KernelSpec) -> str:
    """The header's words for a backward variant's workspace layout."""
    tile, planes = scratch_geometry(spec)
    rows = "Tq" if tile == 1 else "TQP"
    d_buf = "D (B*H*Tq floats)" if planes == 1 else f"D and LSE*log2(e) (B*H*{planes}*TQP floats)"
    text = f"{d_buf}, then the dQ accumulator (B*H*{rows}*d floats)"
    return text + (f", TQP = Tq rounded up to {tile}" if tile > 1 else "")


def _arch_specific(spec: KernelSpec) -> bool:
    """True for a family built for an `a` arch (sm_90a): its code runs on that arch only."""
    return any(a.endswith("a") for a in spec.archs)


def _min_cc(spec: KernelSpec) -> tuple[int, int]:
    """(major, minor) of the oldest arch the variant ships for: sm_90a -> (9, 0)."""
    n = min(int(a.removeprefix("sm_").rstrip("a")) for a in spec.archs)
    return (n // 10, n % 10)


def _cc_text(spec: KernelSpec) -> str:
    major, minor = _min_cc(spec)
    if _arch_specific(spec):
        return f"compute capability {major}.{minor} only"
    return f"compute capability {major}.{minor} or newer"


def _math_text(spec: KernelSpec) -> str:
    """The README's 'math' column."""
    if spec.fam.tensor_maps:
        return "tensor cores (wgmma, TMA loads), sm_90a: H100/H200 only"
    if spec.dtype_info.tensor_core and spec.fam.tensor_cores:
        return "tensor cores (mma.sync), sm_80+"
    return "CUDA cores, fp32"


def dtype_enum(dtype: str) -> str:
    """The C enumerator of a dtype: FLASHGEN_BF16."""
    return f"FLASHGEN_{dtype.upper()}"


def cuda_architectures(specs: Iterable[KernelSpec]) -> str:
    """CMake CUDA_ARCHITECTURES for the variants of plain-arch families (and the launcher):
    SASS for every arch they ship for, plus PTX of the newest so that later GPUs can
    JIT-compile it ("80-real;90-real;90-virtual"). Arch-specific families (wgmma) are built
    apart (`arch_specific_gencode`); a bundle of only those builds its host code for 90-real."""
    nums = sorted(
        {int(a.removeprefix("sm_")) for s in specs if not _arch_specific(s) for a in s.archs}
    )
    if not nums:
        return "90-real"
    return ";".join([*(f"{n}-real" for n in nums), f"{nums[-1]}-virtual"])


def arch_specific_gencode(specs: Iterable[KernelSpec]) -> str:
    """nvcc flags for the arch-specific variants: SASS for exactly their arch, no PTX (sm_90a
    code runs on compute capability 9.0 only): "-gencode=arch=compute_90a,code=sm_90a"."""
    archs = sorted({a for s in specs if _arch_specific(s) for a in s.archs})
    return " ".join(f"-gencode=arch=compute_{a.removeprefix('sm_')},code={a}" for a in archs)


def _check_unique(specs: Sequence[KernelSpec]) -> list[KernelSpec]:
    by_key: dict[tuple[str, int, int, str, bool, tuple[str, ...]], KernelSpec] = {}
    for s in sorted(set(specs), key=lambda s: s.name):
        key = (s.direction, s.d, s.dv, s.dtype, s.causal, s.features)
        if key in by_key:
            mask = "causal" if s.causal else "non-causal"
            feats = f" with {'+'.join(s.features)}" if s.features else ""
            raise BundleError(
                f"variants {by_key[key].name} and {s.name} both serve d={s.d} {s.dtype} {mask}"
                f"{feats}: flashgen_{s.direction} dispatches on (d, dtype, causal, features), "
                "so a bundle holds one variant per key; keep one of them"
            )
        by_key[key] = s
    return list(by_key.values())


# A feature's bit in the launcher's dispatch (flashgen_launch.cu.j2: feature_bits): by its
# place in the registry (window 1, softcap 2, alibi 4)
FEATURE_BITS = {f.token: 1 << i for i, f in enumerate(RUNTIME_FEATURES)}
# The run-time features whose backward variants bundles refuse for now: the backward launcher
# passes every feature off (window -1, -1; softcap 0; no ALiBi slopes)
BWD_FEATURES_LATER = TOKENS


def bundle_context(specs: Sequence[KernelSpec]) -> dict[str, Any]:
    """Everything the bundle templates receive (derived here; the templates only print)."""
    if not specs:
        raise BundleError("no variants: a bundle needs at least one kernel spec")
    for s in specs:
        _check_bundled(s)
    unique = _check_unique(specs)
    fwd = [s for s in unique if s.direction == "fwd"]
    # hooked variants compute another function: they have entry points of their own (with
    # the aux struct), never reached by flashgen_fwd's dispatch
    hooked = [s for s in fwd if hook_tokens(s.features)]
    fwd_plain = [s for s in fwd if s not in hooked]
    contexts = [Variant(s).context() for s in fwd_plain if "varlen" not in s.features]
    hook_contexts = [Variant(s).context() for s in hooked]
    varlen_contexts = [Variant(s).context() for s in fwd_plain if "varlen" in s.features]
    decode_contexts = [Variant(s).context() for s in unique if s.direction == "decode"]
    bwd_contexts = [Variant(s).context() for s in unique if s.direction == "bwd"]
    every = sorted(
        [*contexts, *hook_contexts, *varlen_contexts, *decode_contexts, *bwd_contexts],
        key=lambda c: c["kernel"],
    )
    fwd_keys = {(c["d"], c["dtype"], c["causal"]) for c in contexts if not c["features"]}
    for c in bwd_contexts:  # the example runs the bundle's forward first when it has one
        c["has_fwd"] = (c["d"], c["dtype"], c["causal"]) in fwd_keys
    headers = sorted({h for s in unique if (h := s.dtype_info.header)})
    names = " ".join(f"--name {s.name}" for s in unique)
    return {
        "version": __version__,
        "header": HEADER,
        "launcher": LAUNCHER,
        # the C constants of the forward variants' tile schedulers (their grid code reads them)
        "scheduler_constants": sorted(
            {c for s in fwd for c in s.fam.scheduler(s).launch_constants()}
        ),
        # dense forward variants (the templates' `variants`); varlen, decode, backward apart
        "variants": contexts,
        # hooked forward variants (a user score_mod / mask_mod and its aux block), and their
        # hook sets: per set the aux macros and a dispatch on (d, dtype, causal, features)
        "hook_variants": hook_contexts,
        "hook_sets": _hook_sets(hook_contexts),
        # the dense forward launchers: plain variants, then hooked ones (with the aux struct)
        "launch_variants": [*contexts, *hook_contexts],
        # the hooks' host C++ for the example's reference, once per hook (sets may share one)
        "hook_host_sources": sorted(
            {
                h["host_name"]: h["host_source"] for c in hook_contexts for h in c["hook"]["hooks"]
            }.items()
        ),
        "hook_helpers": helpers(),
        "ex_doc_break": EXAMPLE_DOC_BREAK,
        "ex_aux_float": EXAMPLE_AUX_FLOAT,
        "ex_aux_int": EXAMPLE_AUX_INT,
        "num_hook_variants": len(hook_contexts),
        "varlen_variants": varlen_contexts,
        "decode_variants": decode_contexts,
        "bwd_variants": bwd_contexts,
        # the launcher's shared forward checks serve the dense and the varlen launchers
        "fwd_checks": bool(contexts or varlen_contexts or hook_contexts),
        # dispatch order: fewest features first, so a call runs the least extra work
        "variants_by_features": sorted(contexts, key=lambda c: len(c["features"])),
        "varlen_by_features": sorted(varlen_contexts, key=lambda c: len(c["features"])),
        "decode_by_features": sorted(decode_contexts, key=lambda c: len(c["features"])),
        # every kernel file, every direction, for the build
        "plain_variants": [c for c in every if not c["exact_cc"]],
        "arch_specific_variants": [c for c in every if c["exact_cc"]],
        # TMA tensor maps: the launcher builds them for these (the docs say so per direction)
        "has_tma": any(c["tma"] for c in every),
        "has_fwd_tma": any(c["tma"] for c in [*contexts, *hook_contexts]),
        "has_bwd_tma": any(c["tma"] for c in bwd_contexts),
        "num_variants": len(unique),
        "num_fwd_variants": len(contexts),
        "num_varlen_variants": len(varlen_contexts),
        "num_decode_variants": len(decode_contexts),
        "num_bwd_variants": len(bwd_contexts),
        "bwd_workspace_align": BWD_WORKSPACE_ALIGN,
        "decode": {
            "max_splits": DECODE_MAX_SPLITS,
            "merge_max": DECODE_MERGE_MAX,
            "waves": DECODE_WAVES,
            "min_tiles_per_warp": DECODE_MIN_TILES_PER_WARP,
            "min_tiles_per_warp_merged": DECODE_MIN_TILES_PER_WARP_MERGED,
            "combine_threads": COMBINE_THREADS,
        },
        **_shared_context(unique, headers, names),
    }


def _check_bundled(s: KernelSpec) -> None:
    """BundleError naming value, rule and fix for a variant bundles do not take (yet)."""
    if s.direction == "decode" and s.family != "mma":
        raise BundleError(
            f"{s.name}: bundles launch the decode kernels of family mma only; bundle a "
            "decode variant of family mma"
        )
    if s.direction == "bwd" and not s.fam.bwd_template:
        with_bwd = sorted(f.name for f in FAMILIES.values() if f.bwd_template)
        raise BundleError(
            f"{s.name}: bundles launch the backward kernels of family "
            f"{'/'.join(with_bwd)} only; bundle a backward variant of family {with_bwd[0]}"
        )
    feats = [f for f in s.features if f in BWD_FEATURES_LATER]
    if s.direction == "bwd" and feats:  # the params have no feature values for them yet
        raise BundleError(
            f"{s.name}: backward variants with {', '.join(feats)} are not bundled yet (the "
            "bundle's backward launcher passes the features off); bundle the plain backward "
            "variant; backward features in bundles come later"
        )
    if s.direction == "bwd" and s.fam.bwd_whole_tiles and s.fam.d_pad(s) != s.d:
        raise BundleError(  # its dQ accumulator is d_pad wide; the launcher's workspace d wide
            f"{s.name}: wgmma backward variants with d={s.d} (not a multiple of 64) are not "
            f"bundled yet (their dQ accumulator is {s.fam.d_pad(s)} columns wide, the "
            "launcher's workspace d); bundle a d 64 or 128 variant, or family mma's"
        )
    if "deterministic" in s.features:  # mma's kernels are _pre, main, _dq; wgmma's scratch
        # holds dQ's semaphores after the accumulator: neither is the launcher's
        raise BundleError(
            f"{s.name}: deterministic backward variants are not bundled yet (the bundle's "
            "launcher runs _pre, main and _post over the fast mode's workspace); bundle the "
            "variant without deterministic"
        )
    if "varlen" in s.features and s.direction == "bwd":  # its scratch is per sequence
        raise BundleError(
            f"{s.name}: varlen backward variants are not bundled yet (the bundle's backward "
            "launcher takes dense batches); bundle the varlen forward, or the backward "
            "without varlen"
        )
    tokens = hook_tokens(s.features)
    if tokens and s.direction != "fwd":  # the backward launcher passes no aux block yet
        raise BundleError(
            f"{s.name}: {s.direction} variants with a user hook ({', '.join(tokens)}) are not "
            "bundled yet (only hooked forward variants take the aux struct); bundle the hooked "
            "forward, and train through flashgen.torch"
        )
    if tokens:
        try:
            hooks_of(s.features)
        except HookNotRegistered:  # the name carries digests, not expressions
            raise BundleError(
                f"{s.name}: its hook{'s' if len(tokens) > 1 else ''} {', '.join(tokens)} "
                "cannot be rendered (a kernel name carries a hook's digest, not its "
                "expression); pass the hooks with --score-mod / --mask-mod FILE:NAME"
            ) from None
    if "gqapack" in s.features:  # its grid is per K/V head: the launchers do not build it
        raise BundleError(
            f"{s.name}: gqapack variants are not bundled yet (their grid runs per K/V "
            "head); bundle the variant without gqapack: it serves the same calls"
        )


def _hook_sets(contexts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hook sets of the hooked variants, by name: the set's context (any of its variants'
    `hook`) with `variants`, its variants fewest features first (the dispatch order)."""
    sets: dict[str, dict[str, Any]] = {}
    for c in contexts:
        entry = sets.setdefault(c["hook"]["name"], {**c["hook"], "variants": []})
        entry["variants"].append(c)
    for entry in sets.values():
        entry["variants"].sort(key=lambda c: len(c["features"]))
    return [sets[k] for k in sorted(sets)]


def _shared_context(unique: Sequence[KernelSpec], headers: list[str], names: str) -> dict[str, Any]:
    """The bundle-wide template values that do not depend on which kinds of variant it holds."""
    return {
        "grad_factor": repr(GRAD_FACTOR),
        "grad_eps_ulps": repr(GRAD_EPS_ULPS),
        "cancel_ulps": repr(CANCEL_ULPS),
        # fp32 machine epsilon: the cancellation floor is CANCEL_ULPS of it (oracle_bwd)
        "fp32_eps": repr(float(np.finfo(np.float32).eps)),
        "dtype_headers": headers,
        # the example converts every dtype of the enum on the host
        "all_dtype_headers": sorted({h for i in DTYPES.values() if (h := i.header)}),
        "dtypes": [
            {
                "name": name,
                "enum": dtype_enum(name),
                "value": i,
                "ctype": info.ctype,
                # host+device conversions of cuda_fp16.h / cuda_bf16.h ("" for float: a no-op)
                "to_float": info.to_float,
                "from_float": info.from_float,
            }
            for i, (name, info) in enumerate(DTYPES.items())
        ],
        "cuda_architectures": cuda_architectures(unique),
        "arch_specific_gencode": arch_specific_gencode(unique),
        "tma": {
            "dtypes": [
                {"name": n, "value": v, "enum": TMA_DTYPE_ENUM[n]} for n, v in TMA_DTYPE.items()
            ],
            "swizzle_128b": SWIZZLE_128B,
            "l2_promotion_128b": L2_PROMOTION_128B,
            "box_cols": BOX_COLS,
            "stride_limit": TMA_STRIDE_LIMIT,
            "stride_limit_text": f"2^{TMA_STRIDE_LIMIT.bit_length() - 1}",
            "stride_align": TMA_STRIDE_ALIGN,
        },
        "regenerate": f"flashgen bundle DIR {names}",
        "log2e": LOG2E,
        "max_length": MAX_LENGTH,
        "smem_opt_in_limit": STATIC_SMEM_LIMIT,
        "lse_bound": EXAMPLE_LSE_BOUND,
        "bounds_summary": _bounds_summary(unique),
    }


def _bounds_summary(specs: Sequence[KernelSpec]) -> str:
    """The example's pass bounds for the bundle's dtypes, as one line of plain text."""
    parts: list[str] = []
    grads = (
        [
            f"dQ/dK/dV max abs error <= {GRAD_FACTOR:g}x a same-precision reference's "
            f"+ {GRAD_EPS_ULPS:g} storage ulp of max|g| + an fp32 cancellation floor"
        ]
        if any(s.direction == "bwd" for s in specs)
        else []
    )
    specs = [s for s in specs if s.direction in ("fwd", "decode")]
    if not specs:
        return ", ".join(grads)
    for relative in (False, True):
        dts = sorted({s.dtype for s in specs if (s.dtype == "fp32") == relative})
        bounds = sorted({EXAMPLE_O_BOUND[t] for t in dts})
        if dts:
            kind = "relative (Frobenius)" if relative else "max abs"
            parts.append(f"O {kind} error {'/'.join(bounds)} for {'/'.join(dts)}")
    return ", ".join([*parts, f"LSE max abs error {EXAMPLE_LSE_BOUND}", *grads])


def bundle_files(specs: Sequence[KernelSpec]) -> dict[str, str]:
    """Render a bundle of `specs`: {path relative to the bundle folder: text}, sorted by path.

    Pure and byte-deterministic: the same variants (in any order) give the same bytes.
    Raises BundleError for an empty list or two variants of one direction with the same
    (d, dtype, causal, features).
    """
    ctx = bundle_context(specs)
    env = environment()
    files = {out: env.get_template(tpl).render(**ctx) for out, tpl in TEMPLATES.items()}
    for s in _check_unique(specs):
        rendered = render(s)
        files[f"{KERNEL_DIR}/{rendered.filename}"] = rendered.source
    return dict(sorted(files.items()))


def write_bundle(files: dict[str, str], out: Path) -> list[tuple[Path, bool]]:
    """Write `files` under `out` (created if needed); return (path, changed) per file.

    A file is rewritten only when its bytes change. Paths must be relative and stay inside
    `out` (BundleError otherwise, before anything is written).
    """
    root = out.resolve()
    targets: list[tuple[Path, bytes]] = []
    for rel, text in files.items():
        path = (root / rel).resolve()
        if Path(rel).is_absolute() or not path.is_relative_to(root) or path == root:
            raise BundleError(f"{rel}: a bundle file must stay inside {out}; use a relative path")
        targets.append((path, text.encode()))
    written: list[tuple[Path, bool]] = []
    for path, data in targets:
        try:
            changed = path.read_bytes() != data
        except OSError:
            changed = True
        if changed:
            atomic_write(path, data)
        written.append((out / path.relative_to(root), changed))
    return written


def stale_kernels(files: dict[str, str], out: Path) -> list[Path]:
    """Kernel sources in `out/kernels` that this bundle does not hold (left by an earlier
    bundle; the CMakeLists lists its sources, so they are not built)."""
    folder = out / KERNEL_DIR
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(KERNEL_GLOB) if f"{KERNEL_DIR}/{p.name}" not in files)


def select_variants(
    *,
    names: Sequence[str] = (),
    families: Sequence[str] = (),
    ds: Sequence[int] = (),
    dtypes: Sequence[str] = (),
    causal: bool | None = None,
    gpu_name: str | None = None,
    features: Sequence[tuple[str, ...]] = (),
    arch: str | None = None,
    hooks: Sequence[str] = (),
) -> list[KernelSpec]:
    """The variants of a `flashgen bundle` request, one per (d, dtype, causal), sorted by name,
    and beside each plain one the same tile compiled with each feature set of `features`.
    `arch` chooses them for that GPU (its shared memory per block: the 99 KiB of sm_86, sm_89
    and sm_120 take smaller tiles than sm_80's 163 KiB), from the families that run on it;
    None: a portable bundle (see below).

    Either `names` (exact kernels) or filters: every d in `ds` x dtype in `dtypes` (default
    bf16) x causal (None: both), each served by the variant `select` prefers among the shipped
    variants of `families` (default: all), or where none of them serves the key (d=80) among
    those families' default tiles, generated as flashgen.attention generates them; or by the
    tuning table of `gpu_name` when it has an entry in those families. Raises BundleError (or
    SpecError for a bad name).

    `hooks` (feature tokens of registered hooks, `--score-mod` / `--mask-mod`) go into every
    variant: the forward ones the filters pick, or each named kernel (a name that carries hook
    tokens already must carry exactly these).
    """
    picked = _select_plain(names, families, ds, dtypes, causal, gpu_name, features, arch)
    return _check_unique([_with_hooks(s, hooks) for s in picked]) if hooks else picked


def _with_hooks(spec: KernelSpec, hooks: Sequence[str]) -> KernelSpec:
    """`spec` compiled with the hooks of `hooks` (BundleError when it cannot be)."""
    given = ", ".join(hooks)
    named = hook_tokens(spec.features)
    if named:
        if set(named) != set(hooks):
            raise BundleError(
                f"{spec.name} carries {', '.join(named)}, not the hooks given ({given}); pass "
                "the hooks whose digests the name carries, or name the kernel without them"
            )
        return spec
    if spec.direction != "fwd":
        raise BundleError(
            f"hooks {given}: {spec.name} is a {spec.direction} variant; bundles take hooked "
            "forward variants only (drop the hooks, or name forward kernels)"
        )
    try:
        return spec.replace(features=(*spec.features, *hooks))
    except ValueError as exc:
        raise BundleError(
            f"hooks {given}: {spec.name} cannot take them ({exc}); hooks compile into families "
            "mma and wgmma (fp16/bf16): add --family mma, or drop --dtype fp32"
        ) from None


def _select_plain(
    names: Sequence[str],
    families: Sequence[str],
    ds: Sequence[int],
    dtypes: Sequence[str],
    causal: bool | None,
    gpu_name: str | None,
    features: Sequence[tuple[str, ...]],
    arch: str | None,
) -> list[KernelSpec]:
    """`select_variants` without the hooks."""
    if names:
        clash = [
            opt
            for opt, given in (("--family", families), ("--d", ds), ("--dtype", dtypes))
            if given
        ]
        if clash or causal is not None or gpu_name is not None or features or arch is not None:
            clash += ["--causal/--no-causal"] if causal is not None else []
            clash += ["--gpu"] if gpu_name is not None else []
            clash += ["--features"] if features else []
            clash += ["--arch"] if arch is not None else []
            raise BundleError(
                f"--name already fixes every variant; drop {', '.join(clash)} or drop --name"
            )
        return _check_unique([KernelSpec.from_name(n) for n in names])
    if not ds:
        raise BundleError(
            "--d is required (head dims to bundle, e.g. --d 64 --d 128), or name kernels "
            "with --name"
        )
    fams = list(dict.fromkeys(families)) or list(FAMILIES)
    if arch is not None:
        fams = _families_on(arch, fams, named=bool(families))
    pool = [s for f in fams for s in shipped(f)]
    # Without --family the bundle is portable: chosen as for sm_80, the oldest arch every
    # plain family runs on (so never an arch-specific family). Naming an arch-specific family
    # (--family wgmma) asks for a bundle of its arch: chosen as for sm_90, where wgmma is
    # preferred and the other named families serve what it does not. --arch names the GPU.
    named_specific = [f for f in dict.fromkeys(families) if _family_arch_specific(f)]
    if arch is None:
        arch = "sm_90" if named_specific else "sm_80"
    picked: list[KernelSpec] = []
    missing: list[str] = []
    masks = [False, True] if causal is None else [causal]
    for d, dtype, mask in itertools.product(
        dict.fromkeys(ds), dict.fromkeys(dtypes or ["bf16"]), masks
    ):
        spec = _tuned(gpu_name, d, dtype, mask, fams)
        if spec is None:
            try:
                spec = _select(d, dtype, mask, arch, fams, pool)
            except ValueError:
                missing.append(f"d={d} {dtype} {'causal' if mask else 'non-causal'}")
                continue
        picked.append(spec)
        for feats in dict.fromkeys(features):
            try:
                picked.append(spec.replace(features=feats))
            except ValueError as exc:
                raise BundleError(f"--features {','.join(feats)}: {exc}") from None
    if missing:
        dims = sorted({s.d for s in pool})
        raise BundleError(
            f"{', '.join(missing)}: no shipped variant of family {'/'.join(fams)} serves it, "
            f"nor one generated on demand; their head dims are {dims} (and any other multiple "
            "of 8 up to 256, generated; families mma and wgmma: fp16/bf16 only); change --d, "
            "--dtype or --family"
        )
    return _check_unique(picked)


def _select(
    d: int, dtype: str, causal: bool, arch: str, families: Sequence[str], pool: list[KernelSpec]
) -> KernelSpec:
    """`select` among the shipped variants of `families`; where none serves the key (a head
    dim nothing ships: d=80), what flashgen.attention generates on demand when it is of those
    families, else the best of their default tiles. ValueError when none serves."""
    try:
        return select(d, dtype, causal, arch, candidates=pool)
    except ValueError:
        pass
    try:
        spec = select(d, dtype, causal, arch)  # flashgen.attention's choice, on demand
    except ValueError:
        spec = None
    if spec is not None and spec.family in families:
        return spec
    fresh = _on_demand(families, pool, d, dtype, causal)
    return select(d, dtype, causal, arch, candidates=pool + fresh)


def _on_demand(
    families: Sequence[str], pool: Sequence[KernelSpec], d: int, dtype: str, causal: bool
) -> list[KernelSpec]:
    """The default tile of each family with no shipped variant for (d, dtype, causal): what
    `select` generates on demand for a head dim nothing ships, for it to rank the families
    over as it does for flashgen.attention."""
    out = []
    for fam in families:
        if any(
            s.family == fam and s.d == d and s.dtype == dtype and s.causal == causal
            and not s.features
            for s in pool
        ):  # fmt: skip
            continue
        try:
            out.append(KernelSpec(family=fam, d=d, dtype=dtype, causal=causal))
        except ValueError:  # not a head dim or dtype this family takes
            continue
    return out


def _families_on(arch: str, families: Sequence[str], named: bool) -> list[str]:
    """The families of `families` that run on `arch` (BundleError for an unknown arch, or for a
    named family that does not run there)."""
    if arch not in ARCHS:
        raise BundleError(f"--arch {arch}: unknown arch; choose one of {', '.join(ARCHS)}")
    # a GPU of arch sm_XY also runs its arch-specific sm_XYa code (wgmma on an sm_90 GPU)
    targets = [arch] + ([arch + "a"] if arch + "a" in ARCHS else [])
    runs = [f for f in families if any(runs_on(FAMILIES[f].archs, t) for t in targets)]
    off = [f for f in families if f not in runs]
    if named and off:
        where = "; ".join(f + " " + "/".join(FAMILIES[f].archs) for f in off)
        raise BundleError(
            f"--family {'/'.join(off)}: does not run on {arch} (shipped for {where}); drop it "
            "or choose another --arch"
        )
    return runs


def _family_arch_specific(name: str) -> bool:
    fam = FAMILIES.get(name)
    return fam is not None and any(a.endswith("a") for a in fam.archs)


def _tuned(
    gpu_name: str | None, d: int, dtype: str, causal: bool, families: Sequence[str]
) -> KernelSpec | None:
    if gpu_name is None:
        return None
    from flashgen.generator.select import lookup
    from flashgen.generator.tables import gpu_slug, load_table, table_dir

    if not load_table(gpu_name):
        tables = sorted(p.stem for p in table_dir().glob("*.json"))
        raise BundleError(
            f"--gpu {gpu_name!r}: flashgen has no tuning table {gpu_slug(gpu_name)}.json; "
            f"choose one of {', '.join(tables) or 'none'} (or run `flashgen tune` on that GPU)"
        )
    spec = lookup(gpu_name, d, dtype, causal)
    return spec if spec is not None and spec.family in families else None
