"""The backward pass (dQ, dK, dV) on the host: validation, scratch, and the three launches.

The kernels' shape (names, scratch, the deterministic mode) is generator/backward.py; each
family's rules are in its folder (families/mma/bwd.py, families/wgmma/bwd.py).

**Host side** (`launch_backward`): validate q, k, v, o, lse (the forward's), dO, the three
gradient arrays and the call's feature values (as the forward does: `backward_features`);
allocate the fp32 scratch (D = rowsum(dO ∘ O), (B, H, Tq), and the dQ accumulator,
(B, H, Tq, d): family mma's shapes, `scratch_shapes` has wgmma's); launch the three kernels of
the one cubin in order on one stream:

  `<name>_pre`   D, and zeroes the dQ accumulator        grid (ceil(Tq/PRE_ROWS), H, B)
  `<name>`       dK, dV (stored once) and dQ (atomicAdd)  grid (ceil(Tk/BC), H_kv, B)
  `<name>_post`  dQ = the accumulator in the storage dtype  grid (ceil(Tq/PRE_ROWS), H, B)

**Deterministic mode** (feature token `deterministic`): dQ, dK and dV are bit-identical run
to run. The order in which blocks add into the fp32 dQ accumulator is the only run-to-run
freedom of the fast mode. Family mma gives dQ a kernel of its own, a block per query tile (as
the forward), which recomputes P and dS for every key tile it sees, in a fixed order, and sums
dS·K in registers. No accumulator, no `_post`:

  `<name>_pre`   D only                                   grid (ceil(Tq/PRE_ROWS), H, B)
  `<name>`       dK, dV (stored once); no dQ              grid (ceil(Tk/BC), H_kv, B)
  `<name>_dq`    dQ, stored in the storage dtype          grid (ceil(Tq/BR), H, B)

It recomputes S, P and dP once more (about 2/7 more tensor-core work than the fast mode's
five GEMMs per tile pair), which is the price of the fixed order. Family wgmma
(`Family.bwd_ordered_dq`) keeps the fast mode's three kernels and accumulator: its blocks add
into a query tile's accumulator one after another, key tiles in descending order, waiting on a
semaphore per (batch, head, query tile) that the accumulator's scratch holds after it
(`scratch_shapes`; templates/wgmma_bwd.cu.j2 says how).

All three take one argument list (templates/mma_bwd.cu.j2 documents it; `ABI_FORMAT` here):
pointers q, k, v, o, do, lse, d_buf, dq_accum, dq, dk, dv; int tq, tk; 24 long long strides
in elements (q, k, v, o, do, dq, dk, dv x batch, head, token); float scale_log2; int kv_group;
then the forward's four feature values: int window_left, window_right; float softcap; const
float* alibi_slopes (`features.FeatureArgs.kernel_args`: -1 an unbounded side, softcap 0.0 and
a NULL pointer when off). Every variant takes all four, with features or without. A variant
with a user hook (`scoremod<digest>` / `maskmod<digest>`, family mma) then takes the hooks'
aux block, as its forward does (`abi.backward`: `features.hook.HOOK_PARAMS`, the values from a
`features.hook.HookArgs`); `kernel_params` appends it for all three kernels.

**Family wgmma** (`families/wgmma/bwd.py` has its rules) launches the same three kernels with
the same argument list -- its scratch padded to whole query tiles (`scratch_shapes`), the pre
kernel's grid over those rows -- each preceded by by-value arguments a registered builder
supplies (`register_prefix_args`; `BWD_PREFIX_PROVIDERS` names the module
that registers it): tma.py's four tensor maps tm_q, tm_k, tm_v, tm_do. `Prepared` builds them
on a call's pointers and again only when q, k, v or dO move.

**Packed sequences** (family wgmma's `varlen` variants; flashgen.varlen's autograd runs them):
the arrays are the packed tensors as (1, H, total, d) views and lse (1, H, total_q);
`validate_backward(..., n_seqs=)` records the sequences, the scratch is padded per sequence
(`scratch_shapes(..., n_seqs)`: about total_q + n_seqs * (BR + 32) rows per head), the grids
come from the totals (`BackwardProblem.grids`), and the kernels take abi.VARLEN after the
features: n_seqs bound, cu_seqlens_q and cu_seqlens_k per call (`Prepared.__call__(...,
cu_q=, cu_k=)`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flashgen.generator import abi
from flashgen.generator.arch import STATIC_SMEM_LIMIT
from flashgen.generator.backward import (
    has_dq_kernel,
    is_varlen,
    kernel_names,
    pre_rows,
    scratch_rows,
    scratch_shapes,
    smems,
)
from flashgen.generator.families import FAMILIES
from flashgen.generator.features import (
    NO_FEATURES,
    Feature,
    FeatureArgs,
    FeatureKeywords,
    check_fits,
)
from flashgen.generator.features.hook import HOOK_PARAMS, MAX_POINTERS, HookArgs
from flashgen.generator.numerics import LOG2E
from flashgen.runtime import feature_values
from flashgen.runtime.prefix import PrefixRegistry
from flashgen.runtime.validate import (
    Problem,
    _check_no_overlap,
    _check_operand,
    cai_stream,
    check_layout,
    check_scale,
    describe,
)
from flashgen.runtime.validate import check_spec as _check_spec

if TYPE_CHECKING:
    from typing_extensions import Unpack  # Python 3.10 has no typing.Unpack

    from flashgen.generator.spec import KernelSpec
    from flashgen.runtime.launch import LaunchPlan

# ---- the host side ---------------------------------------------------------------------------
# The kernels' argument list as struct codes: 11 pointers, tq, tk, 24 strides, scale_log2,
# kv_group, and the forward's four feature values (window_left, window_right, softcap, the
# ALiBi slopes pointer), as launch.Bound packs them. A hooked variant's list goes on with the
# hooks' aux block: `abi_format(spec)`.
ABI_FORMAT = abi.struct_format(abi.BWD)
# q, k, v, o, dout, lse, d_buf, dq_accum, dq, dk, dv: the per-call arguments
POINTERS = abi.pointers(abi.BWD)
N_POINTERS = len(POINTERS)

Strides3 = tuple[int, int, int]


def abi_format(spec: KernelSpec) -> str:
    """The struct codes of backward variant `spec`'s arguments: `ABI_FORMAT`, then the hooks'
    aux block for a hooked variant (`abi.backward`)."""
    return abi.struct_format(abi.backward(spec.features))


@dataclass(frozen=True)
class BackwardProblem:
    """A validated backward problem: the forward's Problem (q, k, v, o, lse) plus dO and the
    gradients' element strides (batch, head, token) and pointers."""

    fwd: Problem
    do_strides: Strides3
    dq_strides: Strides3
    dk_strides: Strides3
    dv_strides: Strides3
    do_ptr: int | None
    dq_ptr: int | None
    dk_ptr: int | None
    dv_ptr: int | None
    n_seqs: int | None = None  # a varlen call's sequences (fwd is the packed (1, H, T, d) views)

    def kernel_strides(self) -> tuple[int, ...]:
        """The 24 stride arguments: q, k, v, o, do, dq, dk, dv (batch, head, token)."""
        f = self.fwd
        assert f.o_strides is not None
        return (
            *f.q_strides, *f.k_strides, *f.v_strides, *f.o_strides, *self.do_strides,
            *self.dq_strides, *self.dk_strides, *self.dv_strides,
        )  # fmt: skip

    def grids(self, spec: KernelSpec) -> tuple[tuple[int, int, int], ...]:
        """Grids of (pre, main, post), or with a dQ kernel (family mma's deterministic mode:
        pre, main, dq) dq a block per query tile of BR rows of one query head, like the
        forward. A varlen call (`n_seqs`): pre over the padded scratch rows, main over
        ceil(total_k / BC) + n_seqs key tiles per K/V head (an upper bound: blocks past the
        last sequence's tiles end at once), post over the packed query rows (each at least
        one block)."""
        f = self.fwd
        if self.n_seqs is not None:
            per_block = pre_rows(spec)
            pre = (max(1, -(-scratch_rows(spec, f.tq, self.n_seqs) // per_block)), f.h, 1)
            main = (max(1, -(-f.tk // spec.bc) + self.n_seqs), f.kv_heads, 1)
            return pre, main, (max(1, -(-f.tq // per_block)), f.h, 1)
        pre = (-(-scratch_rows(spec, f.tq) // pre_rows(spec)), f.h, f.b)  # all scratch rows
        rows = (-(-f.tq // pre_rows(spec)), f.h, f.b)
        last = (-(-f.tq // spec.br), f.h, f.b) if has_dq_kernel(spec) else rows
        return pre, (-(-f.tk // spec.bc), f.kv_heads, f.b), last


def _like(name: str, x: Any, shape: tuple[int, ...], dtype: Any, what: str) -> tuple[Strides3, Any]:
    info = describe(name, x)
    if info.shape != shape or info.dtype != dtype:
        raise ValueError(
            f"{name}: shape {info.shape} dtype {info.dtype}: must be {shape} {dtype} ({what}); "
            f"allocate {name} like that"
        )
    return _check_operand(info), info


def validate_backward(
    spec: KernelSpec, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, dq: Any, dk: Any,
    dv: Any, *, check_pointers: bool = True, n_seqs: int | None = None,
) -> BackwardProblem:  # fmt: skip
    """Every check for launching backward variant `spec`; ValueError naming value, rule, fix.

    q, k, v, o, lse are the forward's (o and lse as the forward wrote them); do has o's shape
    and dtype; dq, dk, dv have q's, k's and v's. Every operand has a contiguous d axis and
    strides (and pointers) that are multiples of 16 bytes; the gradients must not overlap
    themselves (a zero stride on a real axis). A varlen variant takes `n_seqs` (its packed
    sequences; the arrays are then (1, H, total, d) views and lse (1, H, total_q)), and only it.
    """
    if spec.direction != "bwd":
        raise ValueError(f"spec {spec.name}: a forward variant; pass spec.replace(direction='bwd')")
    if is_varlen(spec) != (n_seqs is not None):
        raise ValueError(
            f"spec {spec.name}: "
            + ("a varlen variant runs packed sequences: flashgen.torch.flash_attn_varlen_func's "
               "gradients (n_seqs=)" if n_seqs is None else
               "sequences given (n_seqs), but the variant is not varlen")
            + "; launch packed sequences with a varlen variant and dense batches without"
        )  # fmt: skip
    if o is None or lse is None:
        raise ValueError("o, lse: the forward's output and LSE are required by the backward")
    fwd = check_layout(q, k, v, o=o, lse=lse, outputs=False)  # the forward's o, lse: read here
    _check_spec(spec, fwd, check_pointers=check_pointers)
    qi, ki, vi, oi = (describe(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("o", o)))
    do_s, doi = _like("do", do, oi.shape, oi.dtype, "o's shape and dtype: dL/dO")
    dq_s, dqi = _like("dq", dq, qi.shape, qi.dtype, "q's shape and dtype")
    dk_s, dki = _like("dk", dk, ki.shape, ki.dtype, "k's shape and dtype")
    dv_s, dvi = _like("dv", dv, vi.shape, vi.dtype, "v's shape and dtype")
    for g in (dqi, dki, dvi):
        _check_no_overlap(g)
    align, size = spec.align_elems, fwd.itemsize
    for info, strides in ((doi, do_s), (dqi, dq_s), (dki, dk_s), (dvi, dv_s)):
        for axis, stride in zip(("batch", "head", "token"), strides, strict=True):
            if stride % align:
                raise ValueError(
                    f"{info.name} {axis} stride={stride} elements: family {spec.family} needs "
                    f"multiples of {align} ({align * size} bytes); pass a contiguous array"
                )
        if check_pointers and info.ptr is not None and info.ptr % (align * size):
            raise ValueError(
                f"{info.name} pointer {info.ptr:#x}: family {spec.family} needs "
                f"{align * size}-byte alignment; pass a fresh array"
            )
    if n_seqs is not None:
        if fwd.b != 1:
            raise ValueError(
                f"b={fwd.b}: a varlen backward sees its packed tensors as one batch; pass "
                "(1, H, total, d) views"
            )
        if isinstance(n_seqs, bool) or not isinstance(n_seqs, int) or n_seqs < 0:
            raise ValueError(f"n_seqs={n_seqs!r}: must be an int >= 0 (the packed sequences)")
        if scratch_rows(spec, fwd.tq, n_seqs) >= 2**31:
            raise ValueError(
                f"total_q={fwd.tq}, n_seqs={n_seqs}: the padded scratch (total_q + n_seqs * "
                f"{spec.br} rows) must stay below 2^31 rows; split the batch"
            )
    return BackwardProblem(
        fwd, do_s, dq_s, dk_s, dv_s, doi.ptr, dqi.ptr, dki.ptr, dvi.ptr, n_seqs,
    )  # fmt: skip


@dataclass(eq=False)
class BackwardLaunch:
    """One issued backward: the problem and the fp32 scratch it uses (D and the dQ
    accumulator; None with a dQ kernel, which needs none). Keep it until the stream has
    finished when launching with sync=False."""

    problem: BackwardProblem
    d_buf: Any
    dq_accum: Any | None


def _functions(plan: LaunchPlan, spec: KernelSpec) -> tuple[int, int, int]:
    """(pre, main, post|dq) CUfunctions, all from the plan's one module (cached on the plan's
    key: the module stays loaded for the life of the process). The plan raised the main
    kernel's dynamic shared-memory limit; the dQ kernel's is raised here."""
    from flashgen.runtime import launch as _launch

    key = (spec, plan.arch, plan.device)
    hit = _function_cache.get(key)
    if hit is not None:
        return hit
    drv = _launch.driver()
    found = []
    drv.check(drv.cuCtxPushCurrent(plan.context), "making the kernel's context current")
    try:
        for name, smem in zip(kernel_names(spec), smems(spec), strict=True):
            if name == spec.name:
                found.append(plan.function)
                continue
            func = ctypes.c_void_p()
            drv.check(
                drv.lib.cuModuleGetFunction(ctypes.byref(func), plan.module, name.encode()),
                f"finding {name} in the cubin",
            )
            if smem > STATIC_SMEM_LIMIT:  # the check rule kept it within every arch's
                drv.check(
                    drv.lib.cuFuncSetAttribute(
                        func, _launch.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem
                    ),
                    f"raising the dynamic shared-memory limit of {name}",
                )
            found.append(int(func.value or 0))
    finally:
        drv.cuCtxPopCurrent(ctypes.byref(ctypes.c_void_p()))
    out = (found[0], found[1], found[2])
    _function_cache[key] = out
    return out


_function_cache: dict[tuple[Any, str, int], tuple[int, int, int]] = {}


# ---- leading by-value arguments (family wgmma: the TMA tensor maps) ------------------------
# A builder gets the spec, the problem and the eleven pointers (POINTERS order) and returns
# ctypes objects, one kernelParams entry each, ahead of the ABI's arguments.
BwdPrefixArgs = Callable[["KernelSpec", BackwardProblem, tuple[int, ...]], Sequence[Any]]
# family -> module whose import registers that family's backward prefix builder
BWD_PREFIX_PROVIDERS: dict[str, str] = {
    f.name: f.host_provider for f in FAMILIES.values() if f.host_provider and f.bwd_template
}
_prefixes: PrefixRegistry[BwdPrefixArgs] = PrefixRegistry(
    POINTERS, BWD_PREFIX_PROVIDERS, "backward kernels"
)


def register_prefix_args(
    family: str, builder: BwdPrefixArgs, uses: Sequence[str] = POINTERS
) -> None:
    """Make `builder(spec, problem, pointers)` supply the leading by-value arguments of
    `family`'s backward kernels; it is called again only when a pointer it `uses` changes."""
    _prefixes.register(family, builder, uses)


def prefix_builder(family: str) -> tuple[BwdPrefixArgs, tuple[int, ...]] | None:
    """(builder, indices of the pointers it uses) of the family's backward, or None (mma)."""
    return _prefixes.get(family)


def kernel_params(
    problem: BackwardProblem, pointers: tuple[int, ...], scale_log2: float,
    prefix: Sequence[Any] = (), features: FeatureArgs = NO_FEATURES,
    hooks: HookArgs | None = None,
) -> tuple[Any, list[Any]]:  # fmt: skip
    """The kernelParams array of the three kernels (and the ctypes objects of the ABI's
    arguments it points at): the `prefix` objects' addresses first (the caller keeps them
    alive), then the ABI's arguments, the call's feature values, for a varlen problem
    (`problem.n_seqs`) abi.VARLEN (cu_seqlens_q, cu_seqlens_k as NULL: the caller sets them
    per call, then n_seqs), and for a hooked variant (`hooks`, checked against the variant by
    the caller) the hooks' aux block last."""
    c = ctypes
    f = problem.fwd
    left, right, cap, slopes = features.kernel_args(f.tq, f.tk)
    args: list[Any] = [c.c_void_p(p) for p in pointers]
    args += [c.c_int(f.tq), c.c_int(f.tk)]
    args += [c.c_longlong(s) for s in problem.kernel_strides()]
    args += [c.c_float(scale_log2), c.c_int(f.kv_group)]
    args += [c.c_int(left), c.c_int(right), c.c_float(cap), c.c_void_p(slopes)]
    assert len(args) == len(ABI_FORMAT)
    if problem.n_seqs is not None:  # abi.VARLEN: the cu pointers are the call's
        args += [c.c_void_p(0), c.c_void_p(0), c.c_int(problem.n_seqs)]
    if hooks is not None:  # a hooked variant: the aux block after the features
        for p, value in zip(HOOK_PARAMS, hooks.kernel_args(), strict=True):
            if p.code == "f":
                args.append(c.c_float(float(value)))
            else:
                args.append(c.c_void_p(int(value)) if p.code == "P" else c.c_int(int(value)))
    addrs = [c.addressof(a) for a in (*prefix, *args)]
    params = (c.c_void_p * len(addrs))(*addrs)
    return params, args


class Prepared:
    """The launches of one backward variant on one problem signature, ready to issue: the
    functions, grids, shared memory and a kernelParams array whose eleven pointer slots are
    the only thing a call writes (the forward's `launch.Bound`, for the three kernels).

    Built once per signature (validation happens before, on the first call's arrays); a later
    call with the same shapes, strides and pointer alignment only sets the pointers. The
    call's feature values (`features`: window, softcap, the ALiBi slopes' pointer; checked
    against the variant with `features.check_fits` here) and a hooked variant's aux values
    (`hooks`, a `features.hook.HookArgs` checked against the variant's hooks here; None is
    enough for hooks without aux) are bound like the scale: a call with other values needs
    another Prepared. A family with leading arguments (wgmma: tensor
    maps of q, k, v and dO) rebuilds them when a pointer they depend on changes, and only
    then.
    """

    def __init__(
        self, plan: LaunchPlan, spec: KernelSpec, problem: BackwardProblem, scale_log2: float,
        features: FeatureArgs = NO_FEATURES, hooks: HookArgs | None = None,
    ) -> None:  # fmt: skip
        from flashgen.runtime import launch as _launch

        check_fits(spec, features)
        features.check()  # each value by its feature's rule (ALiBi: an aligned pointer)
        hooks = _launch.check_hook_args(spec, hooks)  # the forward's rule: by hook identity
        self.plan, self.spec, self.features = plan, spec, features
        self.launches = list(
            zip(kernel_names(spec), _functions(plan, spec), problem.grids(spec), smems(spec),
                strict=True)
        )  # fmt: skip
        self.problem = problem
        self._params, self._args = kernel_params(
            problem, (0,) * N_POINTERS, scale_log2, features=features, hooks=hooks
        )
        self._ptrs = self._args[: N_POINTERS]  # the c_void_p objects params points at
        # a varlen problem: the cu_seqlens_q/k slots (abi.VARLEN, after the features)
        at = len(ABI_FORMAT)
        self._cu = self._args[at : at + 2] if problem.n_seqs is not None else None
        # a hooked variant: the aux block's pointer slots (first in the block), set per call
        # with `hook_ptrs` (launch.Bound's rule)
        at += 3 if problem.n_seqs is not None else 0
        self._hook_ptrs = self._args[at : at + MAX_POINTERS] if hooks is not None else []
        self._set_pointers = _launch.set_pointers
        self._prefix = prefix_builder(spec.family)
        self._prefix_keep: Sequence[Any] = ()  # the objects the prefix entries point at
        self._last_key: tuple[int, ...] | None = None
        self._drv = _launch.driver()
        self._cur = ctypes.c_void_p()
        self._lock = threading.Lock()

    def _set_prefix(self, pointers: tuple[int, ...], key: tuple[int, ...]) -> None:
        assert self._prefix is not None
        blobs = list(self._prefix[0](self.spec, self.problem, pointers))
        addrs = [ctypes.addressof(b) for b in blobs]
        n = len(self._args)  # the ABI's arguments (a hooked variant's aux block included)
        if len(self._params) == len(addrs) + n:
            for i, a in enumerate(addrs):
                self._params[i] = a
        else:
            common = list(self._params)[len(self._params) - n :]
            self._params = (ctypes.c_void_p * (len(addrs) + n))(*addrs, *common)
        self._prefix_keep = blobs
        self._last_key = key

    def __call__(
        self, pointers: tuple[int, ...], stream_handle: int, cu_q: int = 0, cu_k: int = 0,
        hook_ptrs: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        """Launch the kernels in order on the stream (a CUstream; 0: the legacy default); a
        varlen variant with the device pointers of its int32 cu_seqlens_q and cu_seqlens_k; a
        hooked variant with this call's aux pointers (`hook_ptrs`, as `launch.Bound`)."""
        drv, threads = self._drv, self.spec.threads
        if self._cu is not None and not (cu_q and cu_k):
            raise ValueError(
                f"kernels of {self.spec.name}: a varlen launch needs the cu_seqlens_q and "
                "cu_seqlens_k device pointers (cu_q=, cu_k=)"
            )
        with self._lock:  # the pointer slots are shared: set them and launch as one step
            for slot, ptr in zip(self._ptrs, pointers, strict=True):
                slot.value = int(ptr or 0)
            if self._cu is not None:
                self._cu[0].value, self._cu[1].value = int(cu_q), int(cu_k)
            if hook_ptrs is not None:
                self._set_pointers(self._hook_ptrs, hook_ptrs, self.spec.name)
            if self._prefix is not None:
                key = tuple(int(pointers[i] or 0) for i in self._prefix[1])
                if key != self._last_key:
                    self._set_prefix(tuple(int(p or 0) for p in pointers), key)
            drv.cuCtxGetCurrent(ctypes.byref(self._cur))
            pushed = self._cur.value != self.plan.context
            if pushed:
                drv.check(
                    drv.cuCtxPushCurrent(self.plan.context), "making the kernel's context current"
                )
            try:
                for name, func, grid, smem in self.launches:
                    rc = drv.cuLaunchKernel(
                        func, grid[0], grid[1], grid[2], threads, 1, 1, smem, stream_handle,
                        self._params, None,
                    )  # fmt: skip
                    if rc:
                        raise RuntimeError(
                            f"kernel {name} failed to launch (grid {grid}, block {threads}, "
                            f"{smem} B shared memory): {drv.error(rc)}"
                        )
            finally:
                if pushed:
                    drv.cuCtxPopCurrent(ctypes.byref(ctypes.c_void_p()))


def issue(
    plan: LaunchPlan, spec: KernelSpec, problem: BackwardProblem, pointers: tuple[Any, ...],
    scale_log2: float, stream_handle: int, features: FeatureArgs = NO_FEATURES,
    hooks: HookArgs | None = None,
) -> None:  # fmt: skip
    """Launch the kernels of `spec` in order on the stream `stream_handle` (a CUstream; 0: the
    legacy default stream): `pointers` are q, k, v, o, dout, lse, d_buf, dq_accum, dq, dk, dv
    (the two fp32 scratch arrays shaped as `scratch_shapes` says; dq_accum is never read with a
    dQ kernel: pass 0); `features` the call's window, softcap and ALiBi slopes
    (default: none); `hooks` a hooked variant's aux values. Nothing waits."""
    prepared = Prepared(plan, spec, problem, scale_log2, features, hooks)
    prepared(tuple(int(p or 0) for p in pointers), stream_handle)


def backward_features(
    spec: KernelSpec, problem: BackwardProblem, values: feature_values.Values
) -> FeatureArgs:
    """A call's feature values (`feature_values.from_keywords`), validated as the forward's
    (`flashgen.attention`) are, and fitted to backward variant `spec` (`features.check_fits`:
    a call may not use a feature the variant lacks, and a softcap variant needs softcap > 0);
    ValueError naming value, rule and fix. An array feature's value (ALiBi's slopes) is a
    contiguous float32 device array (GPUArray, CUDA-array-interface object or torch tensor):
    its pointer is what the kernels read."""
    infos = {}
    for feature, array in feature_values.arrays(values):
        info = describe(feature.keyword, array)
        feature.check_array(info.shape, info.dtype, problem.fwd.h)
        if info.shape[0] > 1 and info.strides[0] != info.dtype.itemsize:
            raise ValueError(f"{feature.keyword}: must be contiguous; copy it first")
        if info.ptr and not isinstance(array, np.ndarray):
            feature.check(info.ptr)
        infos[feature.token] = info
    try:  # the variant against the call, before any pointer is required
        check_fits(spec, feature_values.uses(values))
    except ValueError as exc:  # launch_backward always names its variant: no spec=None here
        raise ValueError(str(exc).replace(" (or spec=None to let flashgen choose)", "")) from None

    def pointer(feature: Feature, array: Any) -> int:
        ptr = infos[feature.token].ptr
        if isinstance(array, np.ndarray) or not ptr:
            raise ValueError(
                f"{feature.keyword}={type(array).__name__}: the kernels read it on the GPU; "
                "pass it as a device array (a GPUArray) like q"
            )
        return ptr

    return feature_values.bind(values, pointer)


def launch_backward(
    spec: KernelSpec,
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    lse: Any,
    do: Any,
    dq: Any,
    dk: Any,
    dv: Any,
    scale: float | None = None,
    stream: Any = None,
    *,
    sync: bool = True,
    hooks: HookArgs | None = None,
    **features: Unpack[FeatureKeywords],
) -> BackwardLaunch:
    """Compute dq, dk, dv of attention on device arrays (PyCUDA GPUArrays or CUDA-array-
    interface objects) with backward variant `spec`.

    q, k, v are the forward's inputs, o and lse what the forward wrote for them (with the
    same `scale`, default 1/sqrt(d), and the same features), do = dL/dO. The features are the
    forward's (`flashgen.attention`): `window=(left, right)` (-1: unbounded on that side),
    `softcap=c` (c > 0), `alibi_slopes` a float32 (H,) device array (kept alive by the caller
    until the kernels are done); a call runs a variant compiled with every feature it uses
    (a softcap variant needs softcap > 0). A hooked variant (family mma) takes its hooks' aux
    values as `hooks` (`features.hook.HookArgs`: device pointers and scalars, the forward's
    values, kept alive by the caller as the slopes are). Everything is validated before
    anything is issued; the fp32 scratch is allocated here (with a dQ kernel, family mma's
    deterministic mode, only D's) and the three kernels are launched in order on `stream` (None:
    the legacy default stream). With `sync` (default) the call waits and raises RuntimeError
    naming the kernel when one fails; without, keep the returned BackwardLaunch (it owns the
    scratch) until the stream is done.
    """
    from flashgen.runtime import gpu as runtime
    from flashgen.runtime import launch as _launch

    problem = validate_backward(spec, q, k, v, o, lse, do, dq, dk, dv)
    value = check_scale(scale, spec.d)
    values = feature_values.from_keywords(features, "launch_backward")
    feats = backward_features(spec, problem, values)
    hooks = _launch.check_hook_args(spec, hooks)  # before any GPU work, as the features
    f = problem.fwd
    ptrs = (f.q_ptr, f.k_ptr, f.v_ptr, f.o_ptr, problem.do_ptr, f.lse_ptr, problem.dq_ptr,
            problem.dk_ptr, problem.dv_ptr)  # fmt: skip
    if any(p is None for p in ptrs):
        raise ValueError("q, k, v, o, do, lse, dq, dk, dv: device arrays with pointers required")
    arrays = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "dq": dq, "dk": dk, "dv": dv}
    producers = [cai_stream(name, x) for name, x in arrays.items()]
    plan = runtime.get_function(spec)
    # CUDA-array-interface arrays: the kernels follow the work queued on the stream they name
    _launch.wait_for_streams(producers, runtime.stream_handle(stream))
    d_shape, dq_shape = scratch_shapes(spec, f.b, f.h, f.tq, f.d)
    d_buf = runtime.empty(d_shape, "fp32", pooled=True)
    # a dQ kernel (family mma's deterministic mode) needs no accumulator
    dq_accum = None if dq_shape is None else runtime.empty(dq_shape, "fp32", pooled=True)
    pointers = (
        f.q_ptr, f.k_ptr, f.v_ptr, f.o_ptr, problem.do_ptr, f.lse_ptr, int(d_buf.gpudata),
        0 if dq_accum is None else int(dq_accum.gpudata), problem.dq_ptr, problem.dk_ptr,
        problem.dv_ptr,
    )  # fmt: skip
    issue(
        plan, spec, problem, pointers, value * LOG2E, runtime.stream_handle(stream), feats, hooks
    )
    if sync:
        runtime.wait(stream, f"backward kernels of {spec.name} failed")
    return BackwardLaunch(problem, d_buf, dq_accum)
