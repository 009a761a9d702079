"""The launcher binds a hooked variant's aux block (on a fake driver: no GPU)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from flashgen.generator import abi
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import library
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import launch, validate

MMA = KernelSpec(family="mma", d=64, dtype="fp16", causal=True)


@pytest.fixture
def fake_gpu(monkeypatch):
    from _fakecuda import install_libcuda, install_pycuda

    install_pycuda(monkeypatch, cc=(8, 0))
    return install_libcuda(monkeypatch)


def _plan(spec: KernelSpec) -> launch.LaunchPlan:
    return launch.LaunchPlan(spec, "sm_80", 0, 1, 2, 3, (spec.threads, 1, 1), 0)


_QKV = [np.zeros((1, 4, 8, 64), np.float16) for _ in range(4)]
PROBLEM = validate.check_layout(*_QKV[:3], o=_QKV[3], lse=np.zeros((1, 4, 8), np.float32))


def test_a_hooked_variant_takes_the_aux_block_after_the_features(fake_gpu):
    alibi, doc = library.alibi_hook(), library.document_hook()
    spec = MMA.replace(features=(fh.token_of(alibi), fh.token_of(doc)))
    hooks = fh.HookArgs((alibi, doc), {"alibi_slopes": 0x7000, "doc_ids": 0x8000})
    bound = _plan(spec).bind(PROBLEM, 1.0, hooks=hooks)
    assert len(bound.params) == len(abi.forward(spec.features)) == len(abi.FWD) + 16
    tail = [int(bound.params[i]) for i in range(len(abi.FWD), len(abi.FWD) + 2)]
    assert [ctypes.c_void_p.from_address(a).value for a in tail] == [0x7000, 0x8000]
    assert _block(bound) == hooks.kernel_args()


def test_hook_values_must_match_the_variants_hooks(fake_gpu):
    alibi = library.alibi_hook()
    spec = MMA.replace(features=(fh.token_of(alibi),))
    with pytest.raises(ValueError, match="missing alibi_slopes"):
        _plan(spec).bind(PROBLEM, 1.0)
    other = fh.HookArgs((library.softcap_hook(),), {"softcap": 1.0})
    with pytest.raises(ValueError, match="the hook values are for"):
        _plan(spec).bind(PROBLEM, 1.0, hooks=other)
    with pytest.raises(ValueError, match="the variant has no hook"):
        _plan(MMA).bind(PROBLEM, 1.0, hooks=other)
    causal = library.causal_hook()  # no aux: no values needed
    plain = _plan(MMA.replace(features=(fh.token_of(causal),))).bind(PROBLEM, 1.0)
    assert _block(plain) == (0,) * 8 + (0.0,) * 4 + (0,) * 4


def test_a_call_sets_its_own_aux_pointers_and_nothing_else(fake_gpu, monkeypatch):
    # one bound signature, each call's tables at their own addresses (launch.Bound hook_ptrs)
    launched: list[tuple[int | None, ...]] = []
    at = len(abi.FWD)

    class Driver:  # records the aux pointers each launch passes
        def cuCtxGetCurrent(self, ref):
            ctypes.cast(ref, ctypes.POINTER(ctypes.c_void_p))[0] = 1  # the plan's context
            return 0

        def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            addrs = [int(params[i]) for i in range(at, at + 2)]
            launched.append(tuple(ctypes.c_void_p.from_address(a).value for a in addrs))
            return 0

    alibi, doc = library.alibi_hook(), library.document_hook()
    spec = MMA.replace(features=(fh.token_of(alibi), fh.token_of(doc)))
    first = fh.HookArgs((alibi, doc), {"alibi_slopes": 0x7000, "doc_ids": 0x8000})
    monkeypatch.setattr(launch, "driver", lambda: Driver())
    bound = _plan(spec).bind(PROBLEM, 1.0, hooks=first)
    other = fh.HookArgs((alibi, doc), {"alibi_slopes": 0x9100, "doc_ids": 0xA200})
    assert other.pointers() == (0x9100, 0xA200, 0, 0)
    bound(0x100, 0x200, 0x300, 0x400, 0x500)  # None: the bound ones
    bound(0x100, 0x200, 0x300, 0x400, 0x500, hook_ptrs=other.pointers())
    assert launched == [(0x7000, 0x8000), (0x9100, 0xA200)]
    assert _block(bound) == other.kernel_args()  # the rest of the block as bound
    for bad in ((0x9100, 0xA200, 0), (0x9102, 0xA200, 0, 0), (0x9100, 0, 0, 0),
                (0x9100, 0xA200, 0x10, 0)):  # fmt: skip
        with pytest.raises(ValueError, match="hook_ptrs=.*aux pointers, nonzero and 4-byte"):
            bound(0x100, 0x200, 0x300, 0x400, 0x500, hook_ptrs=bad)
        assert _block(bound) == other.kernel_args()  # nothing written, nothing launched
    assert len(launched) == 2


def _block(bound: launch.Bound) -> tuple[int | float, ...]:
    """The bound aux block (a NULL pointer reads back as None from ctypes: 0 here)."""
    return tuple(0 if a is None else a for a in bound.scalar_args()[-16:])


# ---- the backward: all three kernels take the block after the forward's features -------------
BWD = KernelSpec(family="mma", d=64, dtype="fp16", causal=True, direction="bwd")


def _prepared_params(
    monkeypatch, spec: KernelSpec, hooks: fh.HookArgs | None,
    calls: tuple[tuple[int, ...] | None, ...] = (None,),
) -> list[list[int]]:  # fmt: skip
    """The kernelParams of each launch of a Prepared backward on a fake driver."""
    from types import SimpleNamespace

    from flashgen.runtime import backward

    seen: list[list[int]] = []

    class Driver:
        def cuCtxGetCurrent(self, ref):
            ctypes.cast(ref, ctypes.POINTER(ctypes.c_void_p))[0] = 7
            return 0

        def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            seen.append([int(a) for a in params])
            return 0

    monkeypatch.setattr(launch, "driver", lambda: Driver())
    monkeypatch.setattr(backward, "_functions", lambda plan, spec: (101, 102, 103))
    fwd = validate.Problem(2, 4, 100, 130, 64, spec.dtype, (25600, 6400, 64), (16640, 8320, 64),
                           (16640, 8320, 64), (25600, 6400, 64), h_kv=2)  # fmt: skip
    s = fwd.q_strides
    bp = backward.BackwardProblem(fwd, s, s, fwd.k_strides, fwd.v_strides, 0, 0, 0, 0)
    plan = SimpleNamespace(context=7, smem=spec.smem_bytes)
    prepared = backward.Prepared(plan, spec, bp, 0.5, hooks=hooks)
    for ptrs in calls:  # each call with its aux pointers (None: those bound)
        prepared(tuple(range(16, 16 * 12, 16)), 0, hook_ptrs=ptrs)
    # the addresses in `seen` point into prepared's argument objects: kept alive for the
    # reads that follow (freed, they were read after reuse: a flaky failure in CI)
    _ALIVE.append(prepared)
    return seen


_ALIVE: list[object] = []


@pytest.mark.parametrize("det", [(), ("deterministic",)])
def test_a_hooked_backward_binds_the_aux_block_for_every_kernel(monkeypatch, det):
    from flashgen.runtime import backward

    alibi, doc = library.alibi_hook(), library.document_hook()
    spec = BWD.replace(features=(*det, fh.token_of(alibi), fh.token_of(doc)))
    hooks = fh.HookArgs((alibi, doc), {"alibi_slopes": 0x7000, "doc_ids": 0x8000})
    seen = _prepared_params(monkeypatch, spec, hooks)
    fmt = backward.abi_format(spec)
    assert fmt == backward.ABI_FORMAT + abi.struct_format(abi.HOOK_PARAMS)
    readers = {"P": ctypes.c_void_p, "i": ctypes.c_int, "q": ctypes.c_longlong,
               "f": ctypes.c_float}  # fmt: skip
    assert len(seen) == 3 and all(len(call) == len(fmt) for call in seen)
    for call in seen:  # one argument list for the three kernels
        tail = [readers[c].from_address(a).value or 0 for c, a in zip(fmt, call, strict=True)]
        assert tuple(tail[len(backward.ABI_FORMAT) :]) == hooks.kernel_args()


def test_a_hooked_backward_call_sets_its_own_aux_pointers(monkeypatch):
    from flashgen.runtime import backward

    alibi, doc = library.alibi_hook(), library.document_hook()
    spec = BWD.replace(features=(fh.token_of(alibi), fh.token_of(doc)))
    hooks = fh.HookArgs((alibi, doc), {"alibi_slopes": 0x7000, "doc_ids": 0x8000})
    other = fh.HookArgs((alibi, doc), {"alibi_slopes": 0x9100, "doc_ids": 0xA200})
    seen = _prepared_params(monkeypatch, spec, hooks, (other.pointers(),))
    fmt, at = backward.abi_format(spec), len(backward.ABI_FORMAT)
    blocks = [
        tuple(ctypes.c_void_p.from_address(a).value for a in call[at : at + 2]) for call in seen
    ]
    assert blocks == [(0x9100, 0xA200)] * 3  # all three kernels, this call's
    assert all(len(call) == len(fmt) for call in seen)
    with pytest.raises(ValueError, match="hook_ptrs="):
        _prepared_params(monkeypatch, spec, hooks, ((0x9100,),))


def test_a_hooked_backward_checks_its_hook_values(monkeypatch):
    alibi = library.alibi_hook()
    spec = BWD.replace(features=(fh.token_of(alibi),))
    with pytest.raises(ValueError, match="missing alibi_slopes"):
        _prepared_params(monkeypatch, spec, None)
    other = fh.HookArgs((library.softcap_hook(),), {"softcap": 1.0})
    with pytest.raises(ValueError, match="the hook values are for"):
        _prepared_params(monkeypatch, spec, other)
    with pytest.raises(ValueError, match="the variant has no hook"):
        _prepared_params(monkeypatch, BWD, other)
    # an unhooked backward's argument list is unchanged: no block
    assert all(len(c) == len(abi.BWD) for c in _prepared_params(monkeypatch, BWD, None))


def test_launch_backward_refuses_missing_hook_values_before_the_gpu(monkeypatch):
    from flashgen.runtime import backward
    from flashgen.runtime import gpu as runtime

    def unreachable(spec):
        raise AssertionError("the GPU was reached")

    monkeypatch.setattr(runtime, "get_function", unreachable)
    doc = library.document_hook()
    spec = BWD.replace(features=(fh.token_of(doc),))
    q, k = np.zeros((1, 4, 32, 64), np.float16), np.zeros((1, 2, 40, 64), np.float16)
    lse = np.zeros((1, 4, 32), np.float32)
    args = (spec, q, k, k, q.copy(), lse, q.copy(), q.copy(), k.copy(), k.copy())
    with pytest.raises(ValueError, match="missing doc_ids"):
        backward.launch_backward(*args)


# ---- family wgmma: the tensor maps, heads and batch first, then the ABI, then the block ---------
def test_a_hooked_wgmma_forward_binds_prefix_abi_and_block_in_the_kernels_order(monkeypatch):
    from flashgen.generator.render import abi_params
    from flashgen.runtime import tma

    class Encoder:  # cuTensorMapEncodeTiled: records nothing, succeeds
        @staticmethod
        def cuTensorMapEncodeTiled(*args):
            return 0

    seen: list[list[int]] = []

    class Driver:
        def cuCtxGetCurrent(self, ref):
            ctypes.cast(ref, ctypes.POINTER(ctypes.c_void_p))[0] = 7
            return 0

        def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            seen.append([int(params[i]) for i in range(n_args)])
            return 0

    monkeypatch.setattr(tma, "_libcuda", lambda: Encoder)
    monkeypatch.setattr(launch, "driver", lambda: Driver())
    alibi, doc = library.alibi_hook(), library.document_hook()
    spec = KernelSpec(
        family="wgmma", d=64, dtype="bf16", causal=True,
        features=("window", fh.token_of(alibi), fh.token_of(doc)),
    )  # fmt: skip
    kernel_params = abi_params(spec)  # what the kernel's signature declares, in order
    n_args = len(kernel_params)
    assert n_args == len(spec.fam.fwd_prefix) + len(abi.FWD) + len(abi.HOOK_PARAMS)
    strides = (4 * 128 * 64, 128 * 64, 64)
    problem = validate.Problem(2, 4, 128, 128, 64, "bf16", strides, strides, strides, strides)
    plan = launch.LaunchPlan(
        spec, "sm_90a", 0, 7, 2, 3, (spec.threads, 1, 1), 0, tma.prefix_args, (0, 1, 2), 132
    )
    hooks = fh.HookArgs((alibi, doc), {"alibi_slopes": 0x7000, "doc_ids": 0x8000})
    bound = plan.bind(problem, 1.0, hooks=hooks)
    bound(0x1000, 0x2000, 0x3000, 0x4000, 0x5000)
    (params,) = seen
    # tensor maps (128-byte blobs), n_heads, n_batch, q .. lse, then the scalars and the block
    assert [ctypes.c_int.from_address(a).value for a in params[3:5]] == [4, 2]
    assert [ctypes.c_void_p.from_address(a).value for a in params[5:10]] == [
        0x1000, 0x2000, 0x3000, 0x4000, 0x5000,
    ]  # fmt: skip
    assert kernel_params[5]["decl"].endswith(" q") and "hook_ptr0" in kernel_params[-16]["decl"]
    block = [ctypes.c_void_p.from_address(a).value for a in params[-16:-14]]
    assert block == [0x7000, 0x8000]
    assert _block(bound) == hooks.kernel_args()
