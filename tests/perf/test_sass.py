"""SASS instruction mix: parsing canned `cuobjdump -sass` text, finding and running the tool."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from flashgen.perf import sass
from flashgen.perf.sass import (
    GROUPS,
    INSTALL_HINT,
    SassUnavailable,
    disassemble,
    find_cuobjdump,
    format_mix,
    group_of,
    instruction_mix,
)

# Trimmed from real cuobjdump 13.2 output of an mma kernel (sm_90); the encodings on the
# right and the second encoding line are kept as they appear.
MMA_SASS = """
\tcode for sm_90
\t.target\tsm_90

\t\tFunction : flash_fwd_mma_d32_br64_bc32_bf16_causal_w4_s1
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000ff00000000800 */
        /*0010*/                   S2UR UR4, SR_CTAID.X ;                 /* 0x00000000000479c3 */
        /*0020*/                   LDGSTS.E.BYPASS.128 [R13], desc[UR16][R2.64] ; /* 0x0 */
        /*0030*/                   LDGDEPBAR ;                            /* 0x0 */
        /*0040*/                   DEPBAR.LE SB0, 0x0 ;                   /* 0x0 */
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;          /* 0x0 */
        /*0060*/              @!P1 LDSM.16.M88.4 R36, [R3] ;              /* 0x0 */
        /*0070*/                   LDSM.16.MT88.4 R40, [R4+0x1400] ;      /* 0x0 */
        /*0080*/                   HMMA.16816.F32.BF16 R12, R36, R40, R12 ; /* 0x0 */
        /*0090*/                   HMMA.16816.F32.BF16 R16, R36, R42, R16 ; /* 0x0 */
        /*00a0*/                   FMNMX R5, R12, R13, !PT ;              /* 0x0 */
        /*00b0*/                   SHFL.BFLY PT, R6, R5, 0x1, 0x1f ;      /* 0x0 */
        /*00c0*/                   FFMA R7, R12, UR4, -R5 ;               /* 0x0 */
        /*00d0*/                   MUFU.EX2 R7, R7 ;                      /* 0x0 */
        /*00e0*/                   MUFU.EX2 R8, R8 ;                      /* 0x0 */
        /*00f0*/                   FADD R9, R7, R8 ;                      /* 0x0 */
        /*0100*/                   MUFU.RCP R10, R9 ;                     /* 0x0 */
        /*0110*/                   FMUL R11, R10, R16 ;                   /* 0x0 */
        /*0120*/                   F2FP.BF16.F32.PACK_AB R11, R11, R11 ;  /* 0x0 */
        /*0130*/                   STG.E desc[UR16][R4.64], R11 ;         /* 0x0 */
        /*0140*/               @P0 BRA 0x60 ;                             /* 0x0 */
        /*0150*/                   EXIT ;                                 /* 0x0 */
        /*0160*/              @!PT LDS RZ, [RZ] ;                         /* 0x0 */
        /*0170*/              @!PT LDS RZ, [RZ] ;                         /* 0x0 */
        /*0180*/                   BRA 0x180;                             /* 0x0 */
        /*0190*/                   NOP;                                   /* 0x0 */
\t\t..........
"""

SIMT_SASS = """
\tcode for sm_80
\t\tFunction : flash_fwd_simt_d64_br32_bc32_fp32_noncausal
        /*0000*/                   LDG.E R4, [R2.64] ;            /* 0x0 */
        /*0010*/                   STS [R5], R4 ;                 /* 0x0 */
        /*0020*/                   BAR.SYNC 0x0 ;                 /* 0x0 */
        /*0030*/                   LDS.128 R8, [R6] ;             /* 0x0 */
        /*0040*/                   FFMA R12, R8, R9, R12 ;        /* 0x0 */
        /*0050*/                   FFMA R13, R10, R11, R13 ;      /* 0x0 */
        /*0060*/                   FFMA R14, R10, R11, R14 ;      /* 0x0 */
        /*0070*/                   MUFU.EX2 R15, R15 ;            /* 0x0 */
        /*0080*/                   STG.E [R2.64], R12 ;           /* 0x0 */
        /*0090*/                   EXIT ;                         /* 0x0 */
"""


def test_mma_mix_counts_every_group_and_skips_never_executed_padding() -> None:
    mix = instruction_mix(MMA_SASS)
    assert mix.functions == ("flash_fwd_mma_d32_br64_bc32_bf16_causal_w4_s1",)
    assert mix.archs == ("sm_90",)
    assert mix.total == 24  # 26 instruction lines minus the two `@!PT LDS` pads
    expected = dict.fromkeys(GROUPS, 0)
    expected.update(HMMA=2, FFMA=1, FMUL=1, FADD=1, FMNMX=1, LDSM=2, LDGSTS=1, STG=1, BAR=1, SHFL=1)
    expected.update({"MUFU.EX2": 2, "MUFU": 1})
    assert mix.groups == expected
    assert mix.by_opcode["HMMA"] == 2 and mix.by_opcode["BRA"] == 2
    assert "LDS" not in mix.by_opcode  # the padding never runs
    assert mix.tensor_core
    assert mix.verdict == "tensor-core math: yes (2 HMMA)"


def test_simt_mix_says_cuda_core_ffma() -> None:
    mix = instruction_mix(SIMT_SASS)
    assert mix.total == 10 and mix.archs == ("sm_80",)
    assert mix.groups["FFMA"] == 3 and mix.groups["LDS"] == 1 and mix.groups["STS"] == 1
    assert mix.groups["LDG"] == 1 and mix.groups["MUFU.EX2"] == 1
    assert not mix.tensor_core
    assert mix.verdict == "tensor-core math: no: CUDA-core FFMA (3 FFMA)"


def test_hgmma_counts_as_tensor_core() -> None:
    text = "        /*0000*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;\n"
    mix = instruction_mix(text)
    assert mix.groups["HGMMA"] == 1 and mix.verdict == "tensor-core math: yes (1 HGMMA)"


@pytest.mark.parametrize(
    ("opcode", "group"),
    [
        ("MUFU.EX2", "MUFU.EX2"),
        ("MUFU.LG2", "MUFU"),
        ("LDG.E.128.CONSTANT", "LDG"),
        ("LDGSTS.E.BYPASS.128", "LDGSTS"),
        ("LDSM.16.MT88.4", "LDSM"),
        ("BAR.SYNC.DEFER_BLOCKING", "BAR"),
        ("IMAD.WIDE", None),
    ],
)
def test_group_of(opcode: str, group: str | None) -> None:
    assert group_of(opcode) == group


def test_text_without_instructions_is_an_error() -> None:
    with pytest.raises(ValueError, match="no SASS instructions"):
        instruction_mix("\n\tcode for sm_90\n\t\tFunction : empty\n")


def test_format_lists_every_group_and_the_verdict() -> None:
    lines = format_mix(instruction_mix(MMA_SASS))
    assert lines[0].startswith("  SASS           24 instructions in the binary (sm_90;")
    assert lines[1] == "    tensor-core math: yes (2 HMMA)"
    assert len(lines) == 2 + len(GROUPS)
    assert any(ln.split()[:2] == ["MUFU.EX2", "2"] for ln in lines)


# ---- finding and running the tool ----------------------------------------------------------------
def _fake_tool(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_explicit_missing_cuobjdump_says_which_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHGEN_CUOBJDUMP", str(tmp_path / "nope"))
    with pytest.raises(SassUnavailable, match="FLASHGEN_CUOBJDUMP=.*no such file"):
        find_cuobjdump()


def test_no_cuobjdump_anywhere_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLASHGEN_CUOBJDUMP", raising=False)
    monkeypatch.setattr(sass, "_tool_candidates", lambda tool: [tmp_path / tool])
    with pytest.raises(SassUnavailable, match="cuobjdump not found") as info:
        find_cuobjdump()
    assert INSTALL_HINT in str(info.value)


def test_disassemble_runs_cuobjdump_on_the_cubin_with_its_folder_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the fake checks its arguments, the cubin's bytes and PATH, then prints canned SASS
    canned = tmp_path / "canned.sass"
    canned.write_text(SIMT_SASS)
    bindir = tmp_path / "bin"
    tool = _fake_tool(
        bindir,
        "cuobjdump",
        f'[ "$1" = -sass ] || exit 9\n'
        f'grep -q CUBIN-BYTES "$2" || exit 8\n'
        f'case "$PATH" in {bindir}:*) ;; *) exit 7;; esac\n'
        f"cat {canned}\n",
    )
    _fake_tool(tmp_path / "bin", "nvdisasm", "exit 0\n")
    monkeypatch.setenv("FLASHGEN_CUOBJDUMP", str(tool))
    text = disassemble(b"CUBIN-BYTES")
    assert instruction_mix(text).groups["FFMA"] == 3


def test_disassemble_failure_is_sass_unavailable_with_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = _fake_tool(tmp_path / "bin", "cuobjdump", "echo 'nvdisasm: not found' >&2\nexit 1\n")
    monkeypatch.setenv("FLASHGEN_CUOBJDUMP", str(tool))
    monkeypatch.setenv("PATH", os.defpath)
    with pytest.raises(SassUnavailable, match="needs nvdisasm next to it or on PATH") as info:
        disassemble(b"x")
    assert INSTALL_HINT in str(info.value)
