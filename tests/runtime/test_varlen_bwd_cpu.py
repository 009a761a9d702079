"""The varlen backward (family wgmma) without a GPU: its spec and name, the VARLEN block in all
three kernels' ABI, that no other backward's source changed, the padded scratch and the
grids, the launch arguments, what refuses it, and the torch op's fake implementation."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.generator import abi
from flashgen.generator.backward import (
    VARLEN_PAD_ALIGN,
    kernel_names,
    scratch_rows,
    scratch_shapes,
    varlen_pad_start,
)
from flashgen.generator.compile import compile_kernel
from flashgen.generator.families.wgmma.bwd import VARLEN_SEQ_BYTES
from flashgen.generator.render import render
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime import backward

NAME = "flash_bwd_wgmma_d128_br64_bc128_bf16_causal_varlen_s2"
PLAIN = NAME.replace("_varlen", "")


def test_a_varlen_backward_spec_has_a_name_that_reads_back():
    s = KernelSpec.from_name(NAME)
    assert s.direction == "bwd" and "varlen" in s.features and s.name == NAME
    w = KernelSpec.from_name(NAME.replace("causal", "causal_window_softcap_alibi"))
    assert w.features == ("window", "softcap", "alibi", "varlen")


def test_the_mma_backward_refuses_varlen():
    with pytest.raises(SpecError, match="the mma backward supports .*; drop varlen"):
        KernelSpec(family="mma", direction="bwd", d=128, features=("varlen",))


def test_all_three_kernels_take_the_sequences_block_after_the_features():
    assert abi.backward(("window",)) == abi.BWD
    assert abi.backward(("varlen",)) == (*abi.BWD, *abi.VARLEN)
    assert abi.backward(("window", "varlen"))[-3:] == abi.VARLEN
    src = render(KernelSpec.from_name(NAME)).source
    for name in kernel_names(KernelSpec.from_name(NAME)):
        # each signature ends with the VARLEN block
        sig = src[src.index(f" {name}(\n") :]
        sig = sig[: sig.index("\n{")]
        assert re.search(r"cu_seqlens_q,.*\n.*cu_seqlens_k,.*\n\s*const int n_seqs\).*$", sig), name
    assert "q_start + q0" in src and "k_start + kv0" in src


def test_no_other_backward_source_mentions_the_sequences():
    # the varlen code is all behind `{% if varlen %}`: every other backward renders as before
    # (the byte-for-byte comparison against the previous templates is in the commit message)
    for spec in shipped(direction="bwd"):
        src = render(spec).source
        assert "cu_seqlens" not in src and "VARLEN" not in src and "seq_info" not in src, spec.name


def test_the_scratch_is_padded_per_sequence():
    s = KernelSpec.from_name(NAME)
    assert scratch_rows(s, 1000, 3) == 1024 + 3 * 96  # b's tiles from align32(cu_q[b]) + 96 b
    assert scratch_shapes(s, 1, 16, 1000, 128, 3) == ((1, 16, 2, 1312), (1, 16, 1312, 128))
    plain = KernelSpec.from_name(PLAIN)
    assert scratch_rows(plain, 1000, 3) == 1024  # n_seqs means nothing to a dense variant
    assert s.smem_bytes == plain.smem_bytes + VARLEN_SEQ_BYTES


@pytest.mark.parametrize("seed", range(20))
def test_padded_sequences_keep_apart_on_aligned_rows(seed: int) -> None:
    # the template's pad_start is varlen_pad_start: same constant, and the starts it gives
    # are aligned (float2 reads of D and LSE), keep whole tiles apart and end in the scratch
    s = KernelSpec.from_name(NAME)
    assert f"constexpr int PAD_ALIGN = {VARLEN_PAD_ALIGN};" in render(s).source
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 300, rng.integers(1, 40)).tolist()
    cu = np.concatenate([[0], np.cumsum(lens)]).tolist()
    rows = scratch_rows(s, cu[-1], len(lens))
    end = 0
    for b, n in enumerate(lens):
        start = varlen_pad_start(s, b, cu[b])
        assert start % VARLEN_PAD_ALIGN == 0 and start >= end
        end = start + -(-n // s.br) * s.br
    assert end <= rows and rows % VARLEN_PAD_ALIGN == 0


def _arrays(total_q: int, total_k: int, h: int = 4, h_kv: int = 2, d: int = 128) -> list[Any]:
    bf = ml_dtypes.bfloat16
    q = np.zeros((1, h, total_q, d), bf)
    k = np.zeros((1, h_kv, total_k, d), bf)
    lse = np.zeros((1, h, total_q), np.float32)
    return [q, k, k.copy(), q.copy(), lse, q.copy(), q.copy(), k.copy(), k.copy()]


def test_the_grids_bound_the_work_by_the_totals():
    s = KernelSpec.from_name(NAME)
    bp = backward.validate_backward(s, *_arrays(1000, 3000), check_pointers=False, n_seqs=3)
    pre, main, post = bp.grids(s)
    rows = s.threads // 8  # PRE_LANES_PER_ROW
    assert pre == (-(-1312 // rows), 4, 1)  # every padded scratch row
    assert main == (-(-3000 // 128) + 3, 2, 1)  # key tiles of every sequence, per K/V head
    assert post == (-(-1000 // rows), 4, 1)  # every packed query row
    empty = backward.validate_backward(s, *_arrays(1, 1), check_pointers=False, n_seqs=0)
    assert all(g[0] >= 1 for g in empty.grids(s))  # never an empty launch


def test_the_launch_arguments_end_with_the_sequences():
    s = KernelSpec.from_name(NAME)
    bp = backward.validate_backward(s, *_arrays(100, 90), check_pointers=False, n_seqs=5)
    _, args = backward.kernel_params(bp, (0,) * backward.N_POINTERS, 1.0)
    n = len(backward.ABI_FORMAT)
    assert len(args) == n + 3 and backward.abi_format(s) == backward.ABI_FORMAT + "PPi"
    assert isinstance(args[n], ctypes.c_void_p) and args[n + 2].value == 5


@pytest.mark.parametrize(
    "name, n_seqs, arrays, rule",
    [
        (NAME, None, (10, 10), "a varlen variant runs packed sequences"),
        (PLAIN, 2, (10, 10), "sequences given .n_seqs., but the variant is not varlen"),
        (NAME, -1, (10, 10), "n_seqs=-1: must be an int >= 0"),
        (NAME, 2**31 // 64, (10, 10), "must stay below 2\\^31 rows"),
    ],
)
def test_bad_varlen_launches_are_refused_by_name(name, n_seqs, arrays, rule):
    with pytest.raises(ValueError, match=rule):
        backward.validate_backward(
            KernelSpec.from_name(name), *_arrays(*arrays), check_pointers=False, n_seqs=n_seqs
        )


def test_a_batch_of_two_is_refused():
    a = _arrays(10, 10)
    two = [np.concatenate([x, x]) for x in a]
    with pytest.raises(ValueError, match="b=2: a varlen backward sees its packed tensors"):
        backward.validate_backward(KernelSpec.from_name(NAME), *two, check_pointers=False,
                                   n_seqs=1)  # fmt: skip


def test_the_varlen_backward_op_traces_with_fake_tensors():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import flashgen.torch  # noqa: F401  (registers the ops)

    with FakeTensorMode():
        q = torch.empty(100, 4, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(90, 2, 64, dtype=torch.bfloat16, device="cuda")
        cu = torch.empty(3, dtype=torch.int32, device="cuda")
        o, lse = torch.ops.flashgen.varlen_attention(q, k, k, cu, cu, 60, 60, True)
        dq, dk, dv = torch.ops.flashgen.varlen_attention_backward(q, k, k, o, lse, o, cu, cu)
    assert tuple(dq.shape) == (100, 4, 64) and tuple(dk.shape) == tuple(dv.shape) == (90, 2, 64)


PLAIN_VARIANTS = [
    f"flash_bwd_wgmma_d{d}_br64_bc128_{dt}_{c}_varlen_s{3 if d == 64 else 2}"
    for d in (64, 128) for dt in ("bf16", "fp16") for c in ("causal", "noncausal")
]  # fmt: skip


@pytest.mark.compile_all  # nvcc runs: the compile-everything check's, not the default's
@pytest.mark.parametrize("name", PLAIN_VARIANTS)
def test_varlen_backward_variants_compile_without_spills(nvcc_required: Path, name: str):
    k = compile_kernel(KernelSpec.from_name(name), "sm_90a")
    assert k.report.spill_bytes == 0, (name, k.report)
