"""The forward launchers' argument checks, run: from a host-only program linked with the
launchers of the stand-in bundle (every refusal happens before any CUDA call or kernel: there is
no driver) and, in CI's compile check, with the CMake-built library; and the length limit
through the CPU stand-ins."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from _nvcc import require_nvcc

from flashgen.runtime.validate import MAX_LENGTH, check_layout

from ._support import (
    INVALID,
    MMA,
    NOT_SUPPORTED,
    SIMT,
    WGMMA,
    compile_all,
    cuda_includes,
    fill,
    rows,
    run_program,
    symbol,
    tool,
)
from .conftest import StandIns

TMA = "stride is not a positive multiple of 16 bytes below 2^40 (family wgmma loads q, k and v"
# label -> (refused by simt (4-byte alignment), by mma (16-byte), by wgmma (16-byte, and TMA:
# q/k/v strides positive, below 2^40 bytes, an extent-1 axis' stride replaced by the packed
# one), word in the reason)
EXPECTED = {
    "ok": (False, False, False, "NULL"),
    "null_q": (True, True, True, "q is NULL"),
    "null_k": (True, True, True, "k is NULL"),
    "null_v": (True, True, True, "v is NULL"),
    "null_o": (True, True, True, "o is NULL"),
    "null_lse": (True, True, True, "lse is NULL"),
    "B0": (True, True, True, "B < 1"),
    "Tk0": (True, True, True, "Tk < 1"),
    "B_grid": (True, True, True, "grid z"),
    "H_grid": (True, True, True, "grid y"),
    "d": (True, True, True, "head dimension"),
    "scale0": (True, True, True, "scale"),
    "scale_neg": (True, True, True, "scale"),
    "scale_nan": (True, True, True, "scale"),
    "scale_inf": (True, True, True, "scale"),
    "scale_huge": (True, True, True, "log2(e) overflows"),
    "scale_subnormal_product": (True, True, True, "smallest normal float"),
    "scale_small_normal_product": (False, False, False, "NULL"),  # 1.44e-38 > FLT_MIN
    "lse_misaligned": (True, True, True, "lse is not 4-byte aligned"),
    "q_plus_1_byte": (True, True, True, "q is not"),
    "q_plus_4_bytes": (False, True, True, "q is not 16-byte aligned"),
    "k_plus_2_bytes": (True, True, True, "k is not"),  # simt fp32: 4-byte elements
    "k_plus_4_bytes": (False, True, True, "k is not 16-byte aligned"),
    "v_plus_4_bytes": (False, True, True, "v is not 16-byte aligned"),
    "o_plus_2_bytes": (True, True, True, "o is not"),
    "o_plus_4_bytes": (False, True, True, "o is not 16-byte aligned"),
    "alibi_misaligned": (True, True, True, "alibi_slopes is not 4-byte aligned"),
    "v_token_stride_odd": (False, True, True, "v stride is not a multiple of 8"),
    "o_token_stride_zero": (True, True, True, "an o stride is 0 on an axis longer than 1"),
    "o_head_stride_zero": (True, True, True, "an o stride is 0 on an axis longer than 1"),
    "o_batch_stride_zero": (True, True, True, "an o stride is 0 on an axis longer than 1"),
    "o_batch_stride_zero_B1": (False, False, False, "NULL"),  # extent 1 is never stepped
    # o's rows overlap each other without a zero stride: a token steps half a row, or the
    # heads step one row while the tokens do too (token 1 of head 0 is token 0 of head 1)
    "o_rows_overlap": (True, True, True, "o's strides make its elements overlap"),
    "o_heads_interleaved_with_tokens": (True, True, True, "o's strides make its elements"),
    "o_model_layout": (False, False, False, "NULL"),  # (B, T, H, d): heads inside tokens
    # the outputs may not overlap an input (read while other blocks write) or each other
    "o_equals_q": (True, True, True, "o overlaps q, k or v"),
    "o_equals_k": (True, True, True, "o overlaps q, k or v"),
    "o_inside_v": (True, True, True, "o overlaps q, k or v"),
    "lse_inside_k": (True, True, True, "lse overlaps q, k or v"),
    "lse_on_q_last_bytes": (True, True, True, "lse overlaps q, k or v"),
    "lse_inside_o": (True, True, True, "o and lse overlap"),
    "o_after_q": (False, False, False, "NULL"),  # right after q's last byte
    "alibi_on_lse": (True, True, True, "o or lse overlaps alibi_slopes"),
    "alibi_on_o_last_row": (True, True, True, "o or lse overlaps alibi_slopes"),
    "k_equals_v": (False, False, False, "NULL"),  # inputs may share memory
    "k_batch_stride_4": (False, True, True, "k stride"),
    # any sign as long as it is aligned, but a tensor map takes positive strides only
    "negative_q_stride_8": (False, False, True, f"a q {TMA}"),
    "odd_token_strides_Tq1": (False, False, False, "NULL"),  # one query: stride never used
    "k_head_stride_zero": (False, False, True, f"a k {TMA}"),  # heads sharing K: no TMA
    "v_batch_stride_2_40_bytes": (False, False, True, f"a v {TMA}"),
    "q_strides_zero_B1_H1": (False, False, False, "NULL"),  # packed strides replace them
    "k_token_stride_zero_Tk1": (False, False, False, "NULL"),
    "q_head_stride_2_40_bytes_H1": (False, False, False, "NULL"),  # replaced: never used
    # the packed batch stride (token stride * Tk = 2^40 elements) is past the TMA limit
    "packed_k_batch_stride_too_big_B1_H1": (False, False, True, f"a k {TMA}"),
}
COLUMN = {"simt": 0, "mma": 1, "wgmma": 2}


def _validate_source() -> str:
    return fill(
        "validate_fwd.cu", SIMT=symbol(SIMT), MMA=symbol(MMA), WGMMA=symbol(WGMMA),
        SIMT_EB=SIMT.dtype_info.itemsize, MMA_EB=MMA.dtype_info.itemsize,
        WGMMA_EB=WGMMA.dtype_info.itemsize,
    )  # fmt: skip


def test_launchers_refuse_bad_parameters_without_touching_the_gpu(
    stand_ins: StandIns, tmp_path: Path
) -> None:
    """The launchers of the stand-in bundle (which holds SIMT, MMA and WGMMA, and no variant
    the dispatch cases below may find), compiled by nvcc in the stand_ins fixture; the program
    has no device code, so g++ compiles it."""
    (tmp_path / "validate.cpp").write_text(_validate_source())
    compile_all(
        [[tool("g++"), "-std=c++17", f"-I{stand_ins.root}", *cuda_includes(), "validate.cpp",
          *stand_ins.objects, "-o", "validate"]],
        tmp_path,
    )  # fmt: skip
    _check_refusals(run_program(tmp_path / "validate"))


@pytest.mark.compile_all  # needs the CMake build of real kernels (`built`): CI's compile check
def test_the_cmake_built_launchers_refuse_bad_parameters(built: Path) -> None:
    """The same program linked with the library CMake built from the `built` bundle."""
    nvcc = require_nvcc()
    src = built / "validate.cu"
    src.write_text(_validate_source())
    exe = built / "validate"
    compile_all(
        [[str(nvcc), "-std=c++17", f"-I{built}", str(src),
          str(built / "build" / "libflashgen_kernels.a"), "-o", str(exe)]],
        built,
    )  # fmt: skip
    _check_refusals(run_program(exe))


def _check_refusals(out: subprocess.CompletedProcess[str]) -> None:
    """validate_fwd.cu's output: each case refused (or not) as EXPECTED, with its reason."""
    assert out.returncode == 0, out.stderr
    seen = set()
    lines = [ln.split("|") for ln in out.stdout.splitlines()]
    for variant, label, check, fwd, why in (r for r in lines if r[0] in COLUMN):
        refused = EXPECTED[label][COLUMN[variant]]
        want = INVALID if refused else 0
        assert (int(check), int(fwd)) == (want, want), (variant, label, check, fwd, why)
        assert EXPECTED[label][3] in why if refused else why == "NULL", (variant, label, why)
        seen.add((variant, label))
    assert len(seen) == 3 * len(EXPECTED)
    dispatch = {r[0]: int(r[1]) for r in rows(out.stdout, "dispatch")}
    assert dispatch == {
        "null": INVALID, "d64": NOT_SUPPORTED, "fp16": NOT_SUPPORTED,
        "simt_causal": NOT_SUPPORTED, "simt_bad": INVALID, "mma_bad": INVALID,
    }  # fmt: skip
    assert rows(out.stdout, "variant") == [[SIMT.name, MMA.name, "NULL"]]


def test_launchers_refuse_lengths_the_kernels_tile_loops_cannot_take(
    stand_ins: StandIns, tmp_path: Path
) -> None:
    (tmp_path / "limits.cpp").write_text(
        fill("limits.cpp", MAX=MAX_LENGTH, SIMT=symbol(SIMT), SIMT_D=SIMT.d, MMA=symbol(MMA),
             MMA_D=MMA.d)
    )  # fmt: skip
    gxx = tool("g++")
    compile_all(
        [[gxx, "-std=c++17", f"-I{stand_ins.root}", *cuda_includes(), "limits.cpp",
          *stand_ins.objects, "-o", "limits"]],
        tmp_path,
    )  # fmt: skip
    out = run_program(tmp_path / "limits")
    assert out.returncode == 0, out.stderr
    found = {(r[0], r[1]): r[2:] for r in (ln.split("|") for ln in out.stdout.splitlines())}
    assert len(found) == 12
    for (variant, label), (check, fwd, why) in found.items():
        if label.endswith("_limit"):
            assert (int(check), int(fwd), why) == (0, 0, "NULL"), (variant, label)
            continue
        assert (int(check), int(fwd)) == (INVALID, INVALID), (variant, label, why)
        axis = label[:2]
        assert why.startswith(f"{axis} > {MAX_LENGTH} ") and "split the sequence" in why
    # the Python path: the same limit, the same advice
    q = np.zeros((1, 1, 1, 8), np.float16)
    for tk, ok in ((MAX_LENGTH, True), (MAX_LENGTH + 1, False)):
        kv = np.lib.stride_tricks.as_strided(q, (1, 1, tk, 8), (16, 16, 0, 2))
        if ok:
            assert check_layout(q, kv, kv).tk == MAX_LENGTH
        else:
            with pytest.raises(ValueError, match=rf"Tk={tk}: .*\({MAX_LENGTH}.*split the sequence"):
                check_layout(q, kv, kv)
