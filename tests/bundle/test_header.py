"""The C header (flashgen_attention.h) and the C ABI: every declaration checked by the C and C++
compilers (sources/header_api.c), a C program calling a plain bundle through it
(sources/header_run.c), and what the header and README document."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from flashgen.bundle.emit import HEADER, bundle_files, write_bundle
from flashgen.generator.dtypes import DTYPES

from ._support import (
    INVALID,
    MMA,
    NOT_SUPPORTED,
    PAIR,
    SIMT,
    STAND_IN,
    TRIO,
    WGMMA,
    bwd_symbol,
    c_program,
    compile_all,
    cuda_includes,
    fill,
    prose,
    rows,
    run_program,
    symbol,
    table_rows,
    tool,
    words,
)
from .conftest import StandIns


def api_source(specs: list) -> str:
    """sources/header_api.c for a bundle of `specs`."""
    fwd = [s for s in specs if s.direction == "fwd"]
    bwd = [s for s in specs if s.direction == "bwd"]
    return fill(
        "header_api.c",
        NUM_VARIANTS=len(specs),
        NUM_FWD=len(fwd),
        NUM_BWD=len(bwd),
        # the enum follows the dtype table
        DTYPES="\n".join(f"DTYPE({name.upper()}, {i})" for i, name in enumerate(DTYPES)),
        FWD="\n  ".join(f"FWD({symbol(s)})" for s in fwd),
        BWD="\n  ".join(f"BWD({bwd_symbol(s)})" for s in bwd),
    )


@pytest.mark.parametrize(
    ("compiler", "lang", "std"), [("gcc", "c", "-std=c99"), ("g++", "c++", "-std=c++11")]
)
def test_header_declares_the_c_api_in_c_and_cpp(
    tmp_path: Path, compiler: str, lang: str, std: str
) -> None:
    """Each signature, params field type, enum value and variant count, for a plain bundle (no
    backward variant) and the stand-in bundle (every kind of variant, both directions), as C99
    and C++11, warnings as errors; the header needs no include before it."""
    cc = tool(compiler)
    commands = []
    for name, specs in (("plain", PAIR), ("every_kind", STAND_IN)):
        root = tmp_path / name
        write_bundle(bundle_files(specs), root)
        (root / "api.c").write_text(api_source(specs))
        commands.append([cc, "-x", lang, std, "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                         f"-I{root}", *cuda_includes(), str(root / "api.c")])  # fmt: skip
    compile_all(commands, tmp_path)


def test_a_c_program_calls_a_plain_bundle_through_the_header(
    stand_ins: StandIns, tmp_path: Path
) -> None:
    """C99 code (two units using the header's static inline helpers) linked with the plain
    bundle's launcher: the helpers fill contiguous strides and 1/sqrt(d), flashgen_fwd runs its
    variant from C, and the backward API of a bundle without backward variants refuses."""
    objects = [str(stand_ins.pair / "launch.o"), stand_ins.objects[1]]
    exe = c_program(stand_ins.pair, objects, tmp_path)
    out = run_program(exe)
    assert out.returncode == 0, out.stdout + out.stderr
    b, h, tq, tk, d = 2, 3, 5, 7, 32
    scale = np.float32(1 / math.sqrt(d))
    (fwd,) = rows(out.stdout, "fwd_params")
    (tensors,) = rows(out.stdout, "tensors")
    assert fwd[:5] == tensors
    assert [int(x) for x in fwd[5:10]] == [b, h, tq, tk, d] and np.float32(fwd[10]) == scale
    q_strides, k_strides = [h * tq * d, tq * d, d], [h * tk * d, tk * d, d]
    assert [int(x) for x in fwd[11:]] == q_strides + k_strides + k_strides + q_strides
    assert rows(out.stdout, "fwd")[0][:2] == ["0", SIMT.name]
    assert math.isfinite(float(rows(out.stdout, "fwd")[0][2]))
    assert rows(out.stdout, "fwd_null") == [[str(INVALID)]]
    assert rows(out.stdout, "fwd_fp16") == [[str(NOT_SUPPORTED)]]
    assert rows(out.stdout, "fwd_variant") == [[SIMT.name, MMA.name, "NULL"]]
    (bwd,) = rows(out.stdout, "bwd_params")  # H_kv = H, no workspace yet
    assert [int(x) for x in bwd[:6]] == [b, h, h, tq, tk, d] and np.float32(bwd[6]) == scale
    assert bwd[7:9] == ["(nil)", "0"]
    # q, k, v, o, dout, dq, dk, dv
    assert [int(x) for x in bwd[9:]] == q_strides + k_strides * 2 + q_strides * 3 + k_strides * 2
    assert rows(out.stdout, "bwd_workspace") == [["0"]]
    assert rows(out.stdout, "bwd") == [[str(NOT_SUPPORTED)]]
    assert rows(out.stdout, "bwd_supported") == [
        [str(NOT_SUPPORTED), "this bundle has no backward variant for (d, dtype, causal)", "NULL"]
    ]
    assert rows(out.stdout, "second_unit") == [[str(5 * 8 + 3 * 8)]]


def test_header_documents_the_c_api() -> None:
    h = prose(bundle_files(PAIR)[HEADER])
    for needle in (
        "Strides in ELEMENTS (not bytes)",
        "aligned to the bottom-right corner",
        "gets O = 0 and LSE = -INFINITY",
        "natural-log log-sum-exp",
        "usually 1/sqrt(d)",
        "cudaErrorInvalidValue p is NULL or fails the variant's checks",
        "cudaErrorNotSupported this bundle has no variant for (d, dtype, causal, features)",
    ):
        assert needle in h, needle


def test_header_and_readme_document_the_wgmma_rules() -> None:
    files = bundle_files(TRIO)
    h, readme = prose(files[HEADER]), files["README.md"]
    for needle in (
        "cudaErrorInvalidDeviceFunction a wgmma variant on a GPU other than compute capability 9.0",
        "cudaErrorInsufficientDriver a wgmma variant with a driver that has no "
        "cuTensorMapEncodeTiled",
        "positive multiples of 16 bytes below 2^40",
        f"{WGMMA.name} d=64 fp16 non-causal; family wgmma",
        "runs on compute capability 9.0 only",
    ):
        assert needle in h, needle  # fmt: skip
    assert table_rows(readme)[WGMMA.name][-1].endswith("sm_90a: H100/H200 only")
    for needle in (
        "the cache variable `FLASHGEN_WGMMA_GENCODE`",
        "(`-gencode=arch=compute_90a,code=sm_90a`",
        "their launcher returns `cudaErrorInvalidDeviceFunction` without launching",
        "generate a bundle with `--family mma`",
        "no `-lcuda` needed",
    ):
        assert needle in words(readme), needle  # fmt: skip
    assert "cudaErrorInsufficientDriver" not in bundle_files(PAIR)[HEADER]
