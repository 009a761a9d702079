"""The bundle's example (example.cu) and launchers end to end, the kernels computed on the CPU:
the stand-in bundle (every kind of variant, both directions) linked with the CPU stand-ins
(sources/stand_in.cpp), which play the CUDA runtime, the driver's tensor-map encoder and each
kernel's contract from the very arguments the launcher passes."""

from __future__ import annotations

import math
import re

import pytest

from flashgen.generator.spec import KernelSpec

from ._support import (
    BWD_A,
    BWD_B,
    BWD_W,
    FEATURED,
    INSUFFICIENT_DRIVER,
    INVALID,
    INVALID_DEVICE_FUNCTION,
    MMA,
    STAND_IN,
    WGMMA,
    run_program,
)
from .conftest import ExampleRun, StandIns

FORWARD = [s for s in STAND_IN if s.direction == "fwd"]
BACKWARD = [s for s in STAND_IN if s.direction == "bwd"]
# (B, H, Tq, Tk, H_kv) of every variant's problems; causal ones also run Tq > Tk
PROBLEM, CAUSAL_TALL, GQA = (2, 3, 77, 131, 3), (2, 3, 131, 77, 3), (1, 8, 65, 97, 2)


def problems(spec: KernelSpec) -> list[tuple[int, ...]]:
    return [PROBLEM, *([CAUSAL_TALL] if spec.causal else []), GQA]


def fwd_partner(spec: KernelSpec) -> KernelSpec | None:
    """The forward variant the example runs before backward variant `spec`'s problems."""
    key = (spec.d, spec.dtype, spec.causal)
    return next((s for s in FORWARD if (s.d, s.dtype, s.causal) == key and not s.features), None)


def rejections(spec: KernelSpec) -> int:
    """The invalid parameter sets the example tries on forward variant `spec`: 13 for all (among
    them o = k: an output overlapping an input), two more where pointers and strides need
    more than element alignment, one for tensor maps (a negative stride), one per feature with
    a bound (window, softcap), and a head dim with no variant."""
    more = 2 * (spec.align_elems > 1) + (spec.family == "wgmma")
    return 13 + more + ("window" in spec.features) + ("softcap" in spec.features) + 1


def test_example_passes_with_the_kernel_contract_computed_on_the_cpu(
    example_run: ExampleRun,
) -> None:
    proc = example_run.proc
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    # 17 forward problems, 7 backward ones (BWD_A causal: 3, BWD_B: 2, BWD_W: 2); 7 + 3 variants
    assert lines[-1].startswith("PASS: 24 of 24 problems and 10 of 10 variants' parameter checks")
    assert "bounds: O max abs error 2e-2 for bf16/fp16" in lines[-1]
    assert "dQ/dK/dV max abs error <= 2x a same-precision reference's" in lines[-1]
    assert sum(ln.endswith("  ok") for ln in lines) == 24 + 10  # problems + rejection checks
    # every variant refused each invalid parameter set the example has for it; the feature
    # variants ran with their values (window, softcap, ALiBi) and refused bad ones
    for spec in FORWARD:
        n = rejections(spec)
        refused = f"{n} of {n} invalid parameter sets refused before launch  ok"
        assert f"  {spec.name}: {refused}" in lines
    assert rejections(FEATURED[0]) == 16 and rejections(WGMMA) == 17
    assert f"  {MMA.name} B=2 H=3 Tq=131 Tk=77 H_kv=3" in lines  # the causal Tq > Tk problem
    # the backward ran each problem after the bundle's forward of its key when there is one,
    # else after a forward on the CPU; each gradient within its rule, and the refusals held
    for spec, source, runs in (
        (BWD_A, MMA.name, ["B=2 H=3 Tq=77 Tk=131", "B=2 H=3 Tq=131 Tk=77", "B=1 H=8 Tq=65 Tk=97"]),
        (BWD_B, "the CPU", ["B=2 H=3 Tq=77 Tk=131", "B=1 H=8 Tq=65 Tk=97"]),
        (BWD_W, WGMMA.name, ["B=2 H=3 Tq=77 Tk=131", "B=1 H=8 Tq=65 Tk=97"]),
    ):
        for problem in runs:
            i = next(n for n, ln in enumerate(lines) if ln.startswith(f"  {spec.name} {problem}"))
            assert lines[i].endswith(f"(O and LSE from {source})"), lines[i]
            grads = re.findall(r"(d[QKV]) max abs error (\S+) \(bound (\S+)\)", lines[i + 1])
            assert [g[0] for g in grads] == ["dQ", "dK", "dV"], lines[i + 1]
            assert all(0 < float(err) <= float(bound) for _, err, bound in grads), lines[i + 1]
            assert lines[i + 1].endswith("NaN 0  ok")
        n = 14 if spec.family == "wgmma" else 13  # and a negative q stride (no tensor map)
        refused = f"{n} of {n} invalid backward parameter sets refused before launch  ok"
        assert f"  {spec.name}: {refused}" in lines


def test_example_covers_every_variant_a_causal_tall_and_a_gqa_problem(
    stand_ins: StandIns, example_run: ExampleRun
) -> None:
    """Every forward variant runs the example's problems, with its features on (window 17 keys
    back and 3 ahead, or none ahead when causal; softcap 30; ALiBi slopes 0.5 * 2^(-8 h / H)),
    judged with its dtype's bound; the run is repeatable (a fixed seed)."""
    proc = example_run.proc
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # a second run prints the same: the inputs come from a fixed seed
    assert run_program(stand_ins.example).stdout == proc.stdout
    launched: dict[str, set[tuple[int, ...]]] = {}
    for line in example_run.launches.splitlines():
        kernel, b, h, tq, tk, group, wl, wr, cap, slope, scale_log2 = line.split("|")
        spec = next(s for s in FORWARD if s.name == kernel)
        launched.setdefault(kernel, set()).add((int(b), int(h), int(tq), int(tk), int(group)))
        window = (17, 0 if spec.causal else 3) if "window" in spec.features else (-1, -1)
        assert (int(wl), int(wr)) == window, line
        assert float(cap) == (30.0 if "softcap" in spec.features else 0.0), line
        alibi = 0.5 * 2 ** (-8 / int(h)) if "alibi" in spec.features else 0.0
        assert math.isclose(float(slope), alibi, rel_tol=1e-6), line
        assert math.isclose(float(scale_log2), math.log2(math.e) / math.sqrt(spec.d), rel_tol=1e-6)
    for spec in FORWARD:  # its problems, and those of a backward variant it serves
        want = {(b, h, tq, tk, h // hkv) for b, h, tq, tk, hkv in problems(spec)}
        for bwd in BACKWARD:
            if fwd_partner(bwd) == spec:
                want |= {(b, h, tq, tk, h // hkv) for b, h, tq, tk, hkv in problems(bwd)}
        assert launched[spec.name] == want, spec.name
    # each problem judged by its dtype's bound: relative for fp32, absolute for bf16/fp16
    lines = proc.stdout.splitlines()
    for spec in FORWARD:
        bound = "O relative error" if spec.dtype == "fp32" else "O max abs error"
        bound_value = "(bound 1e-04)" if spec.dtype == "fp32" else "(bound 2e-02)"
        for b, h, tq, tk, hkv in problems(spec):
            i = lines.index(f"  {spec.name} B={b} H={h} Tq={tq} Tk={tk} H_kv={hkv}")
            assert lines[i + 1].startswith(f"    {bound} ") and bound_value in lines[i + 1]


@pytest.mark.parametrize(
    ("bug", "symptom"),
    [
        ("skip", "NaN 1"),
        ("perturb", "O max abs error 5."),
        ("lse", "empty-row errors 324"),
        ("dk", "NaN 1  FAIL"),  # a dK element never written: the poison shows
        ("dv", "dV max abs error 4.9"),  # a dV element moved by 0.5
    ],
)
def test_example_fails_on_a_wrong_kernel(stand_ins: StandIns, bug: str, symptom: str) -> None:
    proc = run_program(stand_ins.example, MOCK_BUG=bug)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("FAIL: ")
    assert symptom in proc.stdout


def test_example_on_another_gpu_refuses_the_wgmma_variant_with_the_reason(
    stand_ins: StandIns,
) -> None:
    proc = run_program(stand_ins.example, MOCK_CC="86")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    why = (
        f"{WGMMA.name} (family wgmma) needs compute capability 9.0 only (sm_90a code: H100, "
        "H200); generate a bundle with --family mma for this GPU"
    )
    assert (
        f"    not runnable on this GPU: {why}; flashgen_fwd returned error "
        f"{INVALID_DEVICE_FUNCTION} (refused, as it must)  FAIL"
    ) in lines
    assert (
        f"    not runnable on this GPU: {BWD_W.name} (family wgmma) needs compute capability 9.0 "
        "only (sm_90a code: H100, H200); generate a bundle with the family mma backward for this "
        f"GPU; flashgen_bwd returned error {INVALID_DEVICE_FUNCTION}  FAIL"
    ) in lines
    # the sm_80+ families still run on sm_86 (and the mma backward ones, sm_80+)
    assert lines[-1].startswith("FAIL: 17 of 24 problems and 10 of 10 variants' parameter checks")
    old = run_program(stand_ins.example, MOCK_CC="75")  # and nothing runs on a Turing GPU
    assert "needs compute capability 8.0 or newer" in old.stdout
    assert f"not runnable on this GPU: {BWD_B.name} (family mma) needs compute capability 8.0" in (
        old.stdout
    )
    assert old.stdout.splitlines()[-1].startswith("FAIL: 0 of 24 problems")


@pytest.mark.parametrize(("mode", "code"), [("fail", INVALID), ("missing", INSUFFICIENT_DRIVER)])
def test_wgmma_launcher_reports_a_refused_map_or_a_driver_without_the_encoder(
    stand_ins: StandIns, mode: str, code: int
) -> None:
    proc = run_program(stand_ins.example, MOCK_ENCODE=mode)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    i = lines.index(f"  {WGMMA.name} B=2 H=3 Tq=77 Tk=131 H_kv=3")
    assert lines[i + 1] == f"    flashgen_fwd: stand-in error {code}"
    # the wgmma backward's maps are refused too (its forward partner's first)
    j = lines.index(f"  {BWD_W.name} B=2 H=3 Tq=77 Tk=131 H_kv=3 (O and LSE from {WGMMA.name})")
    assert lines[j + 1] == f"    flashgen_fwd: stand-in error {code}"
    # the other variants need no tensor map
    assert lines[-1].startswith("FAIL: 17 of 24 problems and 10 of 10 variants' parameter checks")
